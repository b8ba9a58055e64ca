// The Allocator interface's defaults: allocators that keep no peak windows say so.
#include "ember/memory/allocator.h"

#include "ember/base/error.h"

namespace ember::memory {

uint64_t Allocator::open_peak_window() {
  EMBER_THROW(ValueError, "allocator ", name(), " keeps no peak windows (only caching allocators do)");
}

int64_t Allocator::peak_window(uint64_t id) const {
  EMBER_THROW(ValueError, "allocator ", name(), " keeps no peak windows (asked for window ", id, ")");
}

}  // namespace ember::memory
