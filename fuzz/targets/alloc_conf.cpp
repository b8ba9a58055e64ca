// Fuzz target: the EMBER_ALLOC_CONF parser (memory::parse_alloc_config). Invariant checked: a string is rejected
// with ConfigError (any other ember::Error is a finding too: the parser promises ConfigError), or its config's str()
// parses back to an equal config whose str() is the same text.
#include <string>

#include "ember/base/error.h"
#include "ember/memory/alloc_config.h"
#include "fuzz/fuzz_util.h"

using namespace ember;
using memory::AllocatorConfig;

namespace {

bool same(const AllocatorConfig& a, const AllocatorConfig& b) {
  return a.max_split_size == b.max_split_size && a.roundup_power2_divisions == b.roundup_power2_divisions &&
         a.garbage_collection_threshold == b.garbage_collection_threshold &&
         a.expandable_segments == b.expandable_segments && a.capacity == b.capacity &&
         a.memory_fraction == b.memory_fraction && a.pinned_use_host_register == b.pinned_use_host_register &&
         a.pinned_num_register_threads == b.pinned_num_register_threads && a.backend == b.backend;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const AllocatorConfig& base : {AllocatorConfig{}, memory::ember_default_config()}) {
    AllocatorConfig c;
    try {
      c = memory::parse_alloc_config(text, base);
    } catch (const ConfigError&) {
      return 0;
    }
    const std::string canon = c.str();
    const AllocatorConfig back = memory::parse_alloc_config(canon);  // str() lists what differs from the defaults
    FUZZ_CHECK(same(back, c), "parse(str(c)) == c");
    FUZZ_CHECK(back.str() == canon, "str() is canonical");
    (void)c.divisions_for(static_cast<int64_t>(size) << 20);
  }
  return 0;
}
