// Per-tag byte accounting for the caching allocator (DESIGN.md §6): for every owner tag its current bytes, its own
// peak, its bytes at the moment the allocator's allocated bytes last reached their peak, and its allocation count.
// Invariant (kept by the allocator, which calls this under its mutex with the same block bytes it adds to and
// subtracts from allocated_bytes): sum(current) == allocated_bytes and sum(at_peak) == peak_allocated_bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "ember/memory/tags.h"

namespace ember::memory {

struct TagStat {
  TagId tag = kUntagged;
  int64_t current = 0;     // block bytes allocated now under this tag
  int64_t peak = 0;        // this tag's own high-water mark since the last reset
  int64_t at_peak = 0;     // this tag's bytes when the aggregate allocated bytes reached their peak
  int64_t num_allocs = 0;  // allocations made under this tag (not reset)
};

// Note [At-peak bytes, lazily]: copying every tag's bytes whenever the aggregate sets a new peak costs O(tags) per
// allocation while memory grows. Instead each new aggregate peak starts a new generation; the first change to a tag
// in a generation saves its bytes (its value at that peak) before changing them. A tag untouched since the latest
// peak still holds its at-peak value in `current`.
class TagStatsTable {
 public:
  // `new_peak`: this allocation raised the aggregate allocated bytes above their previous peak.
  void on_alloc(TagId tag, int64_t bytes, bool new_peak);
  void on_free(TagId tag, int64_t bytes);
  void on_retag(TagId from, TagId to, int64_t bytes);  // live bytes change owner (at-peak values stay as they were)
  void reset_peaks();  // own peaks and at-peak bytes become current
  std::vector<TagStat> stats() const;  // every tag that holds or held bytes, by tag id

 private:
  struct Entry {
    int64_t current = 0, peak = 0, saved = 0, num_allocs = 0;
    uint64_t generation = 0;  // the peak generation of the last change (saved is valid when it equals peak_gen_)
    bool used = false;
  };
  Entry& entry(TagId tag);
  void touch(Entry& e);
  std::vector<Entry> entries_;  // indexed by tag id
  uint64_t peak_gen_ = 1;
};

// The per-allocation calls, inline: the allocator makes one of them for every allocate and every free.
inline TagStatsTable::Entry& TagStatsTable::entry(TagId tag) {
  if (tag >= entries_.size()) entries_.resize(static_cast<size_t>(tag) + 1);
  Entry& e = entries_[tag];
  e.used = true;
  return e;
}

inline void TagStatsTable::touch(Entry& e) {
  if (e.generation != peak_gen_) {  // first change since the latest peak: remember the value at that peak
    e.saved = e.current;
    e.generation = peak_gen_;
  }
}

inline void TagStatsTable::on_alloc(TagId tag, int64_t bytes, bool new_peak) {
  Entry& e = entry(tag);
  touch(e);
  e.current += bytes;
  if (e.current > e.peak) e.peak = e.current;
  ++e.num_allocs;
  if (new_peak) ++peak_gen_;  // the peak includes this allocation: every tag's at-peak value is its current one
}

inline void TagStatsTable::on_free(TagId tag, int64_t bytes) {
  Entry& e = entry(tag);
  touch(e);
  e.current -= bytes;
}

}  // namespace ember::memory
