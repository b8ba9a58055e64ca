// A picture of memory over time from the allocator's trace: a self-contained HTML page (inline SVG and a little JS,
// no network) with allocated bytes stacked by owner tag over time, reserved bytes as a line, the peak marked, OOMs
// marked, and the allocations alive at the peak listed. Invariant: the stacked total at every event equals the
// trace's allocated bytes after that event: the bytes of its alloc/free events, plus a bottom band "(before the
// trace)" where the event's recorded `allocated` exceeds them (memory allocated before the window or in dropped
// events).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "ember/memory/trace.h"

namespace ember::memory {

// What a band of the stacked plot collects: every owner tag ("GPT.transformer.h.0.attn/forward"), every phase
// ("forward": the phases of all modules together), or every module down to `group_depth` dotted names
// ("GPT.transformer.h.0" at depth 4, all its phases together).
enum class TimelineGroup { Owner, Phase, Module };
const char* timeline_group_name(TimelineGroup group);  // "owner", "phase", "module"
TimelineGroup parse_timeline_group(const std::string& name);  // ValueError for anything else

struct TimelineOptions {
  std::string title = "ember memory timeline";
  TimelineGroup group = TimelineGroup::Phase;  // the bands (the table of live allocations always names the owner)
  int64_t group_depth = 3;        // TimelineGroup::Module: dotted names kept
  int64_t max_series = 12;        // the largest groups get their own band; the rest are summed into "other owners"
  int64_t max_peak_rows = 200;    // allocations listed at the peak (largest first)
  bool time_axis = false;         // x = event time (when the events carry increasing times) instead of event index
};

// The page for `events` (as CachingAllocator::trace() returns them, or read_trace_jsonl). ValueError when the
// trace holds no alloc event.
void write_timeline_html(const std::vector<TraceEvent>& events, std::ostream& out, const TimelineOptions& options = {});

// What the page shows at the peak, for tests and for the CLI's summary.
struct TimelinePeak {
  int64_t event_index = -1;    // index of the event after which allocated bytes were highest (first such)
  int64_t allocated = 0;       // allocated bytes then: the live allocations' block sizes, or the event's recorded
                               // `allocated` when that is more (bytes from before the trace)
  int64_t live_allocations = 0;  // the traced allocations alive then
};
// {-1, 0, 0} when the trace holds no alloc event.
TimelinePeak timeline_peak(const std::vector<TraceEvent>& events);

// The owners of the allocations alive at the peak, most bytes first (ties by name). An owner is a tag name
// ("GPT.blocks.0.attn/forward"); untagged allocations belong to "(untagged)"; bytes live from before the trace (or
// from dropped events) to "(before the trace)", with 0 allocations (unknown), so the bytes add up to
// TimelinePeak::allocated. Empty without alloc events.
struct OwnerBytes {
  std::string owner;
  int64_t bytes = 0;        // block sizes summed
  int64_t allocations = 0;  // live allocations
};
std::vector<OwnerBytes> timeline_owners_at_peak(const std::vector<TraceEvent>& events);

}  // namespace ember::memory
