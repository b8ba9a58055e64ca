// Fuzz target: the CLI byte-size parser (memory::parse_bytes) and its printer. Invariant checked: text is rejected
// with ConfigError, or gives a non-negative count that reads back exactly from its decimal form and approximately
// (within 1%) from format_bytes.
#include <string>

#include "ember/base/error.h"
#include "ember/memory/allocator.h"
#include "fuzz/fuzz_util.h"

using namespace ember;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  int64_t v = 0;
  try {
    v = memory::parse_bytes(text, "fuzz");
  } catch (const ConfigError&) {
    return 0;
  }
  FUZZ_CHECK(v >= 0, "non-negative");
  FUZZ_CHECK(memory::parse_bytes(std::to_string(v), "fuzz") == v, "decimal round trip");
  FUZZ_CHECK(memory::parse_bytes(std::to_string(v) + " B", "fuzz") == v, "decimal with a unit");
  if (v < (int64_t{1} << 62)) {  // format_bytes rounds to 2 decimals of its unit (<= 0.5% off from 1 KiB up)
    const int64_t back = memory::parse_bytes(memory::format_bytes(v), "fuzz");
    const int64_t diff = back > v ? back - v : v - back;
    FUZZ_CHECK(diff <= v / 100 + 1, "format_bytes reads back within 1%");
  }
  return 0;
}
