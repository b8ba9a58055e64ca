// safetensors reader inputs from the fuzzing work (docs/reliability.md, "Fuzzing the parsers"): each hostile header
// is rejected with FormatError, quickly and without deep recursion. Files are assembled here byte by byte.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "ember/nn/safetensors.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

std::string with_header(const std::string& json) {
  std::string out;
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i, n >>= 8) out += static_cast<char>(n & 0xff);
  return out + json;
}

TEST(SafetensorsRegressions, DeeplyNestedHeaderIsRefusedWithoutRecursion) {
  // A shape nested a million arrays deep: printing it in the error message used to recurse once per level.
  const int64_t depth = 1'000'000;
  const std::string shape = std::string(depth, '[') + std::string(depth, ']');
  const std::string file = with_header("{\"t\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[0,0]}}");
  const std::string msg = error_message<FormatError>([&] { (void)nn::deserialize_safetensors(file); });
  EXPECT_NE(msg.find("nests more than 16 levels"), std::string::npos) << msg;
  EXPECT_THROW((void)nn::deserialize_safetensors_metadata(file), FormatError);
  // Metadata nested too deep, and a valid header just inside the limit's reach.
  EXPECT_THROW((void)nn::deserialize_safetensors_metadata(
                   with_header("{\"__metadata__\":" + std::string(40, '[') + std::string(40, ']') + "}")),
               FormatError);
  const nn::NamedTensors ok =
      nn::deserialize_safetensors(with_header("{\"t\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}  ") +
                                  std::string("\x01\x02", 2));
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].second.to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));
}

}  // namespace
}  // namespace ember::testing
