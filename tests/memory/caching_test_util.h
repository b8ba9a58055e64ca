// Helpers shared by the caching-allocator tests: simulated-device allocators, snapshot lookups, sizes, and the
// independent state recount (defined in test_caching_allocator.cpp) that every test uses as its invariant check.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ember/memory/caching_allocator.h"

namespace caching_test {

using namespace ember::memory;

inline constexpr int64_t KiB = 1024;
inline constexpr int64_t MiB = kMiB;
inline constexpr int64_t GiB = 1024 * MiB;

// An allocator over an address-only (or materialised) simulated device of `capacity` bytes.
inline std::unique_ptr<CachingAllocator> make_allocator(int64_t capacity, const AllocatorConfig& config = {},
                                                        bool materialize = false) {
  return std::make_unique<CachingAllocator>(make_simulated_backing(capacity, materialize), config);
}
inline std::unique_ptr<CachingAllocator> make_allocator(int64_t capacity, const std::string& conf) {
  return make_allocator(capacity, parse_alloc_config(conf));
}

inline SimulatedBacking& sim_of(CachingAllocator& a) { return dynamic_cast<SimulatedBacking&>(a.backing()); }
inline uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }
inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The block that starts at p (and its segment), or nullptr.
inline const BlockSnapshot* find_block(const std::vector<SegmentSnapshot>& snap, const void* p,
                                       const SegmentSnapshot** seg_out = nullptr) {
  for (const SegmentSnapshot& s : snap)
    for (const BlockSnapshot& b : s.blocks)
      if (b.addr == addr(p)) {
        if (seg_out) *seg_out = &s;
        return &b;
      }
  return nullptr;
}

inline const SegmentSnapshot* segment_of(const std::vector<SegmentSnapshot>& snap, const void* p) {
  const SegmentSnapshot* s = nullptr;
  find_block(snap, p, &s);
  return s;
}

inline bool has_segment_at(const std::vector<SegmentSnapshot>& snap, const void* p) {
  for (const SegmentSnapshot& s : snap)
    if (s.addr == addr(p)) return true;
  return false;
}

}  // namespace caching_test

// An independent recount of the allocator's state from snapshot(); returns "" when every invariant holds.
std::string verify_caching_allocator(ember::memory::CachingAllocator& a);
