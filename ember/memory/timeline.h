// A picture of memory over time from the allocator's trace: a self-contained HTML page (inline SVG and a little JS,
// no network) with allocated bytes stacked by owner tag over time, reserved bytes as a line, the peak marked, OOMs
// marked, and the allocations alive at the peak listed. Invariant: the stacked total at every event equals the
// trace's allocated bytes after that event (the page is computed from alloc/free events alone).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "ember/memory/trace.h"

namespace ember::memory {

struct TimelineOptions {
  std::string title = "ember memory timeline";
  int64_t max_series = 12;        // the largest owners get their own band; the rest are summed into "other owners"
  int64_t max_peak_rows = 200;    // allocations listed at the peak (largest first)
};

// The page for `events` (as CachingAllocator::trace() returns them, or read_trace_jsonl). ValueError when the
// trace holds no alloc event.
void write_timeline_html(const std::vector<TraceEvent>& events, std::ostream& out, const TimelineOptions& options = {});

// What the page shows at the peak, for tests and for the CLI's summary.
struct TimelinePeak {
  int64_t event_index = -1;    // index of the event after which allocated bytes were highest (first such)
  int64_t allocated = 0;       // allocated bytes then (sum of the live allocations' block sizes)
  int64_t live_allocations = 0;
};
TimelinePeak timeline_peak(const std::vector<TraceEvent>& events);

}  // namespace ember::memory
