// DynamicLibrary (base/dynamic_library.h): opening the first path that opens, symbols, and the errors that name what
// was tried.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "ember/base/dynamic_library.h"
#include "ember/base/error.h"

namespace ember {
namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const BackendError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no BackendError";
  return "";
}

TEST(DynamicLibrary, ReusesTheCopyAlreadyLoaded) {
  // libm is loaded in every test process: the soname finds that copy before any directory is tried.
  DynamicLibrary libm("libm", "libm.so.6", {"/nonexistent"});
  EXPECT_EQ(libm.path(), "libm.so.6");
  using Cos = double (*)(double);
  auto cos_fn = reinterpret_cast<Cos>(libm.symbol("cos"));
  ASSERT_NE(cos_fn, nullptr);
  const double x = 0.5;
  EXPECT_DOUBLE_EQ(cos_fn(x), std::cos(x));
}

TEST(DynamicLibrary, OpensFromTheDirectoryThenBySoname) {
  // A library this process has not loaded: libutil ships with glibc and nothing here links it.
  const std::string soname = "libutil.so.1";
  if (void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
    dlclose(h);
    GTEST_SKIP() << soname << " is already loaded";
  }
  DynamicLibrary lib("libutil", soname, {"", "/nonexistent"});
  EXPECT_EQ(lib.path(), soname);  // the directory failed, the loader's search found it
}

TEST(DynamicLibrary, NoPathOpensNamesEveryPathTried) {
  const std::string m = message_of([] {
    DynamicLibrary("libfoo", "libember-no-such.so.7", {"/nonexistent", "", "/also/missing"});
  });
  EXPECT_NE(m.find("libfoo could not be loaded"), std::string::npos) << m;
  EXPECT_NE(m.find("/nonexistent/libember-no-such.so.7"), std::string::npos) << m;
  EXPECT_NE(m.find("/also/missing/libember-no-such.so.7"), std::string::npos) << m;
  EXPECT_NE(m.find("; libember-no-such.so.7: "), std::string::npos) << m;
  EXPECT_NE(m.find("LD_LIBRARY_PATH"), std::string::npos) << m;
}

TEST(DynamicLibrary, MissingSymbolIsABackendErrorNamingIt) {
  DynamicLibrary libm("libm", "libm.so.6", {});
  const std::string m = message_of([&] { libm.symbol("ember_no_such_function"); });
  EXPECT_NE(m.find("libm (libm.so.6) has no symbol ember_no_such_function"), std::string::npos) << m;
  EXPECT_NE(libm.symbol("sin"), nullptr);  // the handle still works after a failed lookup
}

}  // namespace
}  // namespace ember
