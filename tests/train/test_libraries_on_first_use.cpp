// Note [Libraries opened on first use] (base/dynamic_library.h): a process that loads ember has not mapped cuBLASLt,
// cuSPARSE or NCCL; the first call that needs one opens it, and system_info() reports each one's version.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <string>

#include "ember/train/system_info.h"

namespace ember {
namespace {

// Whether a shared object whose file name starts with `name` is mapped into this process.
bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("/" + name) != std::string::npos) return true;
  return false;
}

TEST(CudaLibraries, OpenedOnFirstUseNotAtStartUp) {
#if !defined(EMBER_WITH_CUDA)
  GTEST_SKIP() << "a build without CUDA";
#else
  // Alone in its process (as ctest runs it), no earlier test can have opened them.
  if (::testing::UnitTest::GetInstance()->test_to_run_count() != 1) {
    std::cout << "[ember] other tests share this process: the start-up check is left out\n";
  } else {
    EXPECT_FALSE(mapped("libcublasLt.so"));
    EXPECT_FALSE(mapped("libcublas.so"));
    EXPECT_FALSE(mapped("libcusparse.so"));
    EXPECT_FALSE(mapped("libnvJitLink.so"));
    EXPECT_FALSE(mapped("libnccl.so"));
  }
  const train::SystemInfo info = train::system_info();
  // The version of each library built in, and the library mapped once asked for it.
  EXPECT_EQ(info.build.cublaslt.find("unavailable"), std::string::npos) << info.build.cublaslt;
  EXPECT_FALSE(info.build.cublaslt.empty());
  EXPECT_TRUE(mapped("libcublasLt.so"));
  if (!info.build.cusparse.empty()) {
    EXPECT_EQ(info.build.cusparse.find("unavailable"), std::string::npos) << info.build.cusparse;
    EXPECT_TRUE(mapped("libcusparse.so"));
  }
  if (!info.build.nccl.empty()) {
    EXPECT_EQ(info.build.nccl.find("unavailable"), std::string::npos) << info.build.nccl;
    EXPECT_TRUE(mapped("libnccl.so"));
  }
  EXPECT_NE(info.to_string().find("cuBLASLt " + info.build.cublaslt), std::string::npos) << info.to_string();
#endif
}

}  // namespace
}  // namespace ember
