// Per-tag byte accounting (see tag_stats.h and Note [At-peak bytes, lazily]).
// Invariant: an entry's `saved` is its bytes at the latest aggregate peak whenever its generation equals peak_gen_.
#include "ember/memory/tag_stats.h"

#include <algorithm>

namespace ember::memory {

TagStatsTable::Entry& TagStatsTable::entry(TagId tag) {
  if (tag >= entries_.size()) entries_.resize(static_cast<size_t>(tag) + 1);
  Entry& e = entries_[tag];
  e.used = true;
  return e;
}

void TagStatsTable::touch(Entry& e) {
  if (e.generation != peak_gen_) {  // first change since the latest peak: remember the value at that peak
    e.saved = e.current;
    e.generation = peak_gen_;
  }
}

void TagStatsTable::on_alloc(TagId tag, int64_t bytes, bool new_peak) {
  Entry& e = entry(tag);
  touch(e);
  e.current += bytes;
  e.peak = std::max(e.peak, e.current);
  ++e.num_allocs;
  if (new_peak) ++peak_gen_;  // the peak includes this allocation: every tag's at-peak value is its current one
}

void TagStatsTable::on_free(TagId tag, int64_t bytes) {
  Entry& e = entry(tag);
  touch(e);
  e.current -= bytes;
}

void TagStatsTable::on_retag(TagId from, TagId to, int64_t bytes) {
  if (from == to) return;
  entry(std::max(from, to));  // sized for both before taking references
  Entry& f = entry(from);
  Entry& t = entry(to);
  touch(f);
  touch(t);
  f.current -= bytes;
  t.current += bytes;
  t.peak = std::max(t.peak, t.current);
}

void TagStatsTable::reset_peaks() {
  for (Entry& e : entries_) e.peak = e.current;
  ++peak_gen_;
}

std::vector<TagStat> TagStatsTable::stats() const {
  std::vector<TagStat> out;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (!e.used) continue;
    TagStat s;
    s.tag = static_cast<TagId>(i);
    s.current = e.current;
    s.peak = e.peak;
    s.at_peak = e.generation == peak_gen_ ? e.saved : e.current;
    s.num_allocs = e.num_allocs;
    out.push_back(s);
  }
  return out;
}

}  // namespace ember::memory
