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

// A Backing that forwards every call to another (shared, so two allocators can sit on one device), translating
// addresses through translate(): the identity here; a subclass may remap them (it must be its own inverse,
// translate(translate(p, n), n) == p, since the same function maps both ways).
class ForwardingBacking : public Backing {
 public:
  explicit ForwardingBacking(std::shared_ptr<Backing> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  void* malloc(int64_t n) override { return translate(inner_->malloc(n), n); }
  void free(void* p, int64_t n) override { inner_->free(translate(p, n), n); }
  int64_t capacity() const override { return inner_->capacity(); }
  int64_t available() const override { return inner_->available(); }
  EventId record_event(StreamId s) override { return inner_->record_event(s); }
  bool event_completed(EventId e) override { return inner_->event_completed(e); }
  void release_event(EventId e) override { inner_->release_event(e); }
  void synchronize() override { inner_->synchronize(); }
  bool supports_expandable() const override { return inner_->supports_expandable(); }
  int64_t page_size() const override { return inner_->page_size(); }
  void* reserve_range(int64_t n) override { return translate(inner_->reserve_range(n), n); }
  bool map(void* p, int64_t n) override { return inner_->map(translate(p, n), n); }
  void unmap(void* p, int64_t n) override { inner_->unmap(translate(p, n), n); }
  void release_range(void* p, int64_t n) override { inner_->release_range(translate(p, n), n); }
  bool materialized() const override { return inner_->materialized(); }
  void fill(void* p, int64_t n, unsigned char byte, StreamId stream) override {
    inner_->fill(translate(p, n), n, byte, stream);
  }

 protected:
  virtual void* translate(void* p, int64_t /*n*/) const { return p; }

 private:
  std::shared_ptr<Backing> inner_;
};

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
