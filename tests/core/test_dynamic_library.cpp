// DynamicLibrary (base/dynamic_library.h): opening the first path that opens, symbols, and the errors that name what
// was tried.
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

TEST(DynamicLibrary, OpensTheFirstPathThatOpensAndFindsSymbols) {
  DynamicLibrary libm("libm", {"", "/nonexistent/libm.so.6", "libm.so.6"});
  EXPECT_EQ(libm.path(), "libm.so.6");
  using Cos = double (*)(double);
  auto cos_fn = reinterpret_cast<Cos>(libm.symbol("cos"));
  ASSERT_NE(cos_fn, nullptr);
  EXPECT_EQ(cos_fn(0.5), std::cos(0.5));
}

TEST(DynamicLibrary, NoPathOpensNamesEveryPathTried) {
  const std::string m = message_of([] {
    DynamicLibrary("libfoo", {"/nonexistent/libfoo.so", "libember-no-such.so.7"});
  });
  EXPECT_NE(m.find("libfoo could not be loaded"), std::string::npos) << m;
  EXPECT_NE(m.find("/nonexistent/libfoo.so"), std::string::npos) << m;
  EXPECT_NE(m.find("libember-no-such.so.7"), std::string::npos) << m;
  EXPECT_NE(m.find("LD_LIBRARY_PATH"), std::string::npos) << m;
  EXPECT_NE(message_of([] { DynamicLibrary("libfoo", {"", ""}); }).find("no path to try"), std::string::npos);
}

TEST(DynamicLibrary, MissingSymbolIsABackendErrorNamingIt) {
  DynamicLibrary libm("libm", {"libm.so.6"});
  const std::string m = message_of([&] { libm.symbol("ember_no_such_function"); });
  EXPECT_NE(m.find("libm (libm.so.6) has no symbol ember_no_such_function"), std::string::npos) << m;
  EXPECT_NE(libm.symbol("sin"), nullptr);  // the handle still works after a failed lookup
}

}  // namespace
}  // namespace ember
