// Per-tag byte accounting (see tag_stats.h and Note [At-peak bytes, lazily]).
// Invariant: an entry's `saved` is its bytes at the latest aggregate peak whenever its generation equals peak_gen_.
#include "ember/memory/tag_stats.h"

#include <algorithm>

namespace ember::memory {

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
