// The allocator's event trace: a bounded ring of alloc/free/segment/oom/annotate events, exported as JSON Lines
// (docs/memory-trace.md) or as a Chrome trace (counter tracks, phase/module slices; opens in Perfetto) that also
// embeds the raw events, read back from either file format, and replayed through a fresh allocator under another
// configuration. Invariant: a trace holding only `alloc`/`free` (and `empty_cache`) events with id, size and stream is
// a complete replay input, and both file formats read back to the events written.
#pragma once

#include <atomic>
#include <cstdint>
#include <iosfwd>
#include <mutex>
#include <string>
#include <vector>

#include "ember/memory/alloc_config.h"
#include "ember/memory/allocator.h"
#include "ember/memory/tags.h"

namespace ember::memory {

enum class TraceAction : uint8_t {
  Alloc,         // a request served: id, size (requested), addr, block_size (after rounding)
  Free,          // the user freed id (its memory may return to the pool later, after stream events)
  SegmentAlloc,  // a segment obtained from the backing: addr, size
  SegmentFree,   // a segment returned to the backing
  SegmentMap,    // expandable segment grew: addr of the mapped range, size
  SegmentUnmap,  // expandable segment shrank
  Oom,           // a request that failed: size; allocated/reserved at the time
  Annotate,      // a user marker: note
  Retag,         // the live allocation id changed owner to tag (its bytes move; replay ignores it)
  EmptyCache     // empty_cache() was called: recorded before its segment_free events; replay calls it too
};
const char* trace_action_name(TraceAction a);
TraceAction parse_trace_action(const std::string& s);  // FormatError on unknown names

struct TraceEvent {
  TraceAction action = TraceAction::Alloc;
  uint64_t id = 0;          // allocation id (alloc/free); 0 otherwise
  int64_t size = 0;         // requested bytes (alloc/free/oom) or segment bytes (segment_*)
  int64_t block_size = 0;   // bytes actually taken (alloc), after rounding
  uint64_t addr = 0;
  StreamId stream = 0;
  TagId tag = kUntagged;
  int64_t time_ns = 0;      // steady-clock time since the allocator was created
  int64_t allocated = 0;    // allocated bytes after the event
  int64_t reserved = 0;     // reserved bytes after the event
  std::string note;         // annotate text; the tag name on export
};

// A fixed-capacity ring buffer of events; the oldest are dropped (and counted) when it is full. Thread-safe.
class TraceRing {
 public:
  explicit TraceRing(size_t capacity = 0) { set_capacity(capacity); }
  void set_capacity(size_t capacity);  // 0 = disabled; clears the ring
  size_t capacity() const;
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void push(TraceEvent e);
  std::vector<TraceEvent> events() const;  // oldest first
  uint64_t dropped() const;
  void clear();

 private:
  mutable std::mutex mutex_;
  std::vector<TraceEvent> ring_;
  size_t head_ = 0, size_ = 0;
  uint64_t dropped_ = 0;
  std::atomic<bool> enabled_{false};  // read without the lock on the allocator's hot path
};

// JSON Lines: one object per event with at least "action", "id", "size", "stream" (see docs/memory-trace.md).
void write_trace_jsonl(const std::vector<TraceEvent>& events, std::ostream& out);
// Reads JSON Lines; FormatError naming the line number on malformed input. Unknown keys are ignored; missing
// optional keys default to 0.
std::vector<TraceEvent> read_trace_jsonl(std::istream& in);

// What a trace file records about the allocator that produced it (the Chrome file's "otherData").
struct TraceFileOptions {
  std::string alloc_conf;  // its configuration as an EMBER_ALLOC_CONF string (ember writes explicit_str(); read with
                           // parse_alloc_config, over PyTorch's defaults, as older files' str() needs)
  std::string allocator;   // its name
};

// Chrome trace-event format (docs/memory-trace.md): counter tracks "allocated" and "reserved"; complete-event
// slices on a "phase" track and a "module" track (maximal runs of consecutive alloc/free events with the same
// phase / module); global instant events for OOMs and process instants for annotations; and, for read-back, the
// raw events as "emberEvents" (the JSON Lines objects) with the options in "otherData".
void write_chrome_trace(const std::vector<TraceEvent>& events, std::ostream& out,
                        const TraceFileOptions& options = {});

// A trace file read back: its events, what it says about the recording allocator, and its format.
struct TraceFile {
  std::vector<TraceEvent> events;
  TraceFileOptions options;
  bool has_options = false;  // true for Chrome files (JSON Lines carry no options)
  std::string format;        // "jsonl" or "chrome"
};
// Parses the text of a JSON Lines or ember Chrome trace file; `source` names it in errors. FormatError (naming the
// source) for anything else, including an otherData.alloc_conf that parse_alloc_config rejects.
TraceFile parse_trace_text(const std::string& text, const std::string& source);
// Reads the file at `path` (ValueError when it cannot be read) and parses it as parse_trace_text does.
TraceFile load_trace_file(const std::string& path);
// load_trace_file's events; `alloc_conf` (when given) receives the recorded configuration ("" for JSON Lines).
std::vector<TraceEvent> read_trace_file(const std::string& path, std::string* alloc_conf = nullptr);
// Writes JSON Lines when `path` ends in ".jsonl" (the options are not stored), else Chrome JSON. ValueError when the
// file cannot be written.
void write_trace_file(const std::string& path, const std::vector<TraceEvent>& events,
                      const TraceFileOptions& options = {});

struct ReplayResult {
  int64_t peak_allocated = 0;
  int64_t peak_reserved = 0;
  int64_t peak_requested = 0;
  double fragmentation = 0.0;  // 1 - peak_allocated / peak_reserved
  int64_t num_ooms = 0;
  int64_t first_oom_index = -1;  // index of the first alloc event that failed, -1 if none
  int64_t last_oom_index = -1;   // index of the last alloc event that failed, -1 if none
  int64_t num_device_allocs = 0;
  int64_t num_allocs = 0;
  int64_t largest_free_block_at_peak = 0;
  int64_t allowed = kNoLimit;  // the memory the replaying allocator could use (device x fraction, capped)
  std::string config;  // the configuration replayed
};

// Replays the alloc/free events of a trace through a fresh CachingAllocator over an address-only simulated device
// of `capacity` bytes under `config`; an empty_cache event calls empty_cache() on it. capacity = kNoLimit: a device
// of the config's `capacity` when it sets one (as EMBER_ALLOC_CONF's capacity makes the host a device of that size,
// per_process_memory_fraction then applying to it), else unbounded. Frees of
// ids that failed or were never allocated are ignored; allocations that fail are counted as OOMs and the replay
// continues. Exact for traces on one stream: a block freed while another stream used it (record_stream) is reused at
// once in a replay (the trace has no event for the other stream's completion), so a replay can reserve less.
ReplayResult replay_trace(const std::vector<TraceEvent>& events, const AllocatorConfig& config,
                          int64_t capacity = kNoLimit);

}  // namespace ember::memory
