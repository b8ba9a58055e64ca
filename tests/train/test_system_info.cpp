// `ember info`'s build facts: the CPU vector ISA the library was compiled for is the one this test was compiled for
// (Note [One CPU ISA for every target] in cmake/EmberCpuIsa.cmake: the flags go to every C++ target), and the text
// and JSON forms carry it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "ember/train/system_info.h"

namespace ember::testing {
namespace {

std::string isa_of_this_file() {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
  return "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
  return "avx2";
#else
  return "sse";
#endif
}

TEST(SystemInfo, CpuIsaIsTheOneEveryTargetWasBuiltFor) {
  const train::SystemInfo info = train::system_info();
  EXPECT_EQ(info.build.cpu_isa, isa_of_this_file());
  EXPECT_NE(info.to_string().find("CPU ISA " + info.build.cpu_isa), std::string::npos) << info.to_string();
  const nlohmann::json j = nlohmann::json::parse(info.to_json());
  EXPECT_EQ(j["build"]["cpu_isa"], info.build.cpu_isa);
}

}  // namespace
}  // namespace ember::testing
