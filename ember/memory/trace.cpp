// The allocator trace: the ring buffer, JSON Lines export/import (docs/memory-trace.md), the Chrome trace-event
// export, and replay through a fresh CachingAllocator over an address-only simulated device.
// Invariant: write_trace_jsonl then read_trace_jsonl gives back every field of every event (tags by name), and a
// line the reader accepts always has action, id, size and stream.
#include "ember/memory/trace.h"

#include <algorithm>
#include <istream>
#include <limits>
#include <ostream>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

#include "ember/base/error.h"
#include "ember/memory/backing.h"
#include "ember/memory/caching_allocator.h"

namespace ember::memory {

using nlohmann::json;
using nlohmann::ordered_json;

// ---- ring ----------------------------------------------------------------------------------------------------------
// ring_ holds `capacity` slots; the live events are the size_ slots starting at head_ (oldest), wrapping around.

void TraceRing::set_capacity(size_t capacity) {
  std::lock_guard<std::mutex> lock(mutex_);
  ring_.clear();
  ring_.shrink_to_fit();
  ring_.resize(capacity);
  head_ = 0;
  size_ = 0;
  dropped_ = 0;
  enabled_.store(capacity > 0, std::memory_order_relaxed);
}

size_t TraceRing::capacity() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ring_.size();
}

void TraceRing::push(TraceEvent e) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t cap = ring_.size();
  if (cap == 0) return;
  if (size_ < cap) {
    ring_[(head_ + size_) % cap] = std::move(e);
    ++size_;
  } else {  // full: the oldest slot takes the new event
    ring_[head_] = std::move(e);
    head_ = (head_ + 1) % cap;
    ++dropped_;
  }
}

std::vector<TraceEvent> TraceRing::events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<TraceEvent> out;
  out.reserve(size_);
  for (size_t i = 0; i < size_; ++i) out.push_back(ring_[(head_ + i) % ring_.size()]);
  return out;
}

uint64_t TraceRing::dropped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dropped_;
}

void TraceRing::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < size_; ++i) ring_[(head_ + i) % ring_.size()] = TraceEvent{};
  head_ = 0;
  size_ = 0;
  dropped_ = 0;
}

// ---- action names --------------------------------------------------------------------------------------------------

namespace {
constexpr std::pair<TraceAction, const char*> kActionNames[] = {
    {TraceAction::Alloc, "alloc"},
    {TraceAction::Free, "free"},
    {TraceAction::SegmentAlloc, "segment_alloc"},
    {TraceAction::SegmentFree, "segment_free"},
    {TraceAction::SegmentMap, "segment_map"},
    {TraceAction::SegmentUnmap, "segment_unmap"},
    {TraceAction::Oom, "oom"},
    {TraceAction::Annotate, "annotate"},
};
}  // namespace

const char* trace_action_name(TraceAction a) {
  for (const auto& [action, name] : kActionNames)
    if (action == a) return name;
  return "unknown";
}

TraceAction parse_trace_action(const std::string& s) {
  for (const auto& [action, name] : kActionNames)
    if (s == name) return action;
  EMBER_THROW(FormatError, "unknown trace action \"", s,
              "\" (expected alloc, free, segment_alloc, segment_free, segment_map, segment_unmap, oom or annotate)");
}

// ---- JSON Lines ----------------------------------------------------------------------------------------------------

void write_trace_jsonl(const std::vector<TraceEvent>& events, std::ostream& out) {
  for (const TraceEvent& e : events) {
    ordered_json j;
    j["action"] = trace_action_name(e.action);
    j["id"] = e.id;
    j["size"] = e.size;
    j["stream"] = e.stream;
    j["block_size"] = e.block_size;
    j["addr"] = e.addr;
    j["time_ns"] = e.time_ns;
    j["allocated"] = e.allocated;
    j["reserved"] = e.reserved;
    if (e.tag != kUntagged) j["tag"] = tag_name(e.tag);
    if (e.action == TraceAction::Annotate) j["note"] = e.note;
    out << j.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
  }
}

namespace {

// Reads one line's object; every failure names the line.
class LineReader {
 public:
  LineReader(const json& j, int64_t line) : j_(j), line_(line) {}

  [[noreturn]] void fail(const std::string& what) const {
    EMBER_THROW(FormatError, "read_trace_jsonl: line ", line_, ": ", what);
  }

  // The value of `key`, or nullptr when it is absent (or null and optional).
  const json* find(const char* key, bool required) const {
    auto it = j_.find(key);
    if (it == j_.end() || (!required && it->is_null())) {
      if (required) fail(std::string("missing required key \"") + key + "\"");
      return nullptr;
    }
    return &*it;
  }

  bool get_u64(const char* key, bool required, uint64_t& out) const {
    const json* v = find(key, required);
    if (!v) return false;
    if (!v->is_number_unsigned())
      fail(std::string("\"") + key + "\" must be a non-negative integer, got " + v->dump());
    out = v->get<uint64_t>();
    return true;
  }

  bool get_i64(const char* key, bool required, bool non_negative, int64_t& out) const {
    const json* v = find(key, required);
    if (!v) return false;
    const char* want = non_negative ? "a non-negative integer" : "an integer";
    if (!v->is_number_integer()) fail(std::string("\"") + key + "\" must be " + want + ", got " + v->dump());
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(std::string("\"") + key + "\" is out of range: " + v->dump());
      out = static_cast<int64_t>(u);
    } else {
      out = v->get<int64_t>();
      if (non_negative && out < 0) fail(std::string("\"") + key + "\" must be " + want + ", got " + v->dump());
    }
    return true;
  }

  bool get_string(const char* key, bool required, std::string& out) const {
    const json* v = find(key, required);
    if (!v) return false;
    if (!v->is_string()) fail(std::string("\"") + key + "\" must be a string, got " + v->dump());
    out = v->get<std::string>();
    return true;
  }

 private:
  const json& j_;
  int64_t line_;
};

bool is_blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

}  // namespace

std::vector<TraceEvent> read_trace_jsonl(std::istream& in) {
  std::vector<TraceEvent> events;
  std::string text;
  int64_t line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (is_blank(text)) continue;
    json j;
    try {
      j = json::parse(text);
    } catch (const json::parse_error& e) {
      EMBER_THROW(FormatError, "read_trace_jsonl: line ", line, ": malformed JSON at column ", e.byte);
    } catch (const json::exception& e) {  // e.g. a number out of range
      EMBER_THROW(FormatError, "read_trace_jsonl: line ", line, ": ", e.what());
    }
    LineReader r(j, line);
    if (!j.is_object()) r.fail("expected a JSON object, got " + std::string(j.type_name()));

    TraceEvent e;
    std::string action;
    r.get_string("action", true, action);
    try {
      e.action = parse_trace_action(action);
    } catch (const FormatError& err) {
      r.fail(err.what());
    }
    r.get_u64("id", true, e.id);
    r.get_i64("size", true, true, e.size);
    r.get_u64("stream", true, e.stream);
    r.get_i64("block_size", false, true, e.block_size);
    r.get_u64("addr", false, e.addr);
    r.get_i64("time_ns", false, false, e.time_ns);
    r.get_i64("allocated", false, true, e.allocated);
    r.get_i64("reserved", false, true, e.reserved);
    std::string tag;
    if (r.get_string("tag", false, tag)) e.tag = intern_tag(tag);
    r.get_string("note", false, e.note);
    events.push_back(std::move(e));
  }
  if (in.bad()) EMBER_THROW(FormatError, "read_trace_jsonl: read error after line ", line);
  return events;
}

// ---- Chrome trace --------------------------------------------------------------------------------------------------
// Note [Chrome trace times]: events carry steady-clock nanoseconds; the trace-event format wants microseconds. A trace
// with no times at all (every time_ns 0, as in files written by tools that record only alloc/free) is laid out one
// microsecond per event, so its counter tracks still show each step instead of one point at t = 0.

void write_chrome_trace(const std::vector<TraceEvent>& events, std::ostream& out) {
  constexpr int kPid = 1, kTid = 1;
  const bool no_times =
      std::all_of(events.begin(), events.end(), [](const TraceEvent& e) { return e.time_ns == 0; });
  auto dump = [](const ordered_json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); };

  out << "{\"traceEvents\":[\n";
  ordered_json meta = {{"name", "process_name"}, {"ph", "M"}, {"pid", kPid}, {"tid", kTid},
                       {"args", {{"name", "ember allocator"}}}};
  out << dump(meta);
  meta["name"] = "thread_name";
  meta["args"] = {{"name", "allocator events"}};
  out << ",\n" << dump(meta);

  for (size_t i = 0; i < events.size(); ++i) {
    const TraceEvent& e = events[i];
    const double ts = no_times ? static_cast<double>(i) : static_cast<double>(e.time_ns) / 1000.0;
    ordered_json c = {{"name", "memory"}, {"ph", "C"}, {"ts", ts}, {"pid", kPid}, {"tid", kTid},
                      {"args", {{"allocated", e.allocated}, {"reserved", e.reserved}}}};
    out << ",\n" << dump(c);
    if (e.action == TraceAction::Oom || e.action == TraceAction::Annotate) {
      const bool oom = e.action == TraceAction::Oom;
      ordered_json inst = {{"name", oom ? std::string("oom") : (e.note.empty() ? std::string("annotate") : e.note)},
                           {"cat", trace_action_name(e.action)},
                           {"ph", "i"},
                           {"s", "p"},
                           {"ts", ts},
                           {"pid", kPid},
                           {"tid", kTid}};
      ordered_json args = ordered_json::object();
      if (oom) {
        args["size"] = e.size;
        args["stream"] = e.stream;
        args["allocated"] = e.allocated;
        args["reserved"] = e.reserved;
      } else {
        args["note"] = e.note;
      }
      if (e.tag != kUntagged) args["tag"] = tag_name(e.tag);
      inst["args"] = std::move(args);
      out << ",\n" << dump(inst);
    }
  }
  out << "\n]}\n";
}

// ---- replay --------------------------------------------------------------------------------------------------------
// Note [Replay peaks]: peak allocated/reserved/requested come from the allocator's own peak counters, read once at
// the end. The largest free block "at the peak" needs the moment itself, so it is read after each allocation that
// raised reserved memory above the highest value seen so far (reserved only grows when an allocation maps memory).

ReplayResult replay_trace(const std::vector<TraceEvent>& events, const AllocatorConfig& config, int64_t capacity) {
  // An address-only device; the simulated backing treats kNoLimit as unbounded (its accounting cannot overflow).
  EMBER_CHECK(capacity > 0, ValueError, "replay_trace: capacity must be positive, got ", capacity);
  CachingAllocator alloc(make_simulated_backing(capacity, /*materialize=*/false), config, "replay");
  alloc.set_oom_explanations(false);  // replayed OOMs are counted, not explained

  ReplayResult r;
  r.config = config.str();
  std::unordered_map<uint64_t, void*> live;
  live.reserve(1024);
  int64_t highest_reserved = 0;

  for (size_t i = 0; i < events.size(); ++i) {
    const TraceEvent& e = events[i];
    if (e.action == TraceAction::Alloc) {
      if (auto old = live.find(e.id); old != live.end()) {  // an id reused while live: the trace lost its free
        alloc.deallocate(old->second);                       // release the older block first
        live.erase(old);
      }
      void* p = nullptr;
      try {
        p = alloc.allocate(e.size, e.stream);
      } catch (const OutOfMemoryError&) {
        ++r.num_ooms;
        if (r.first_oom_index < 0) r.first_oom_index = static_cast<int64_t>(i);
        r.last_oom_index = static_cast<int64_t>(i);
        continue;
      }
      ++r.num_allocs;
      if (p != nullptr) live.emplace(e.id, p);
      const int64_t reserved = alloc.stats().reserved_bytes;
      if (reserved > highest_reserved) {
        highest_reserved = reserved;
        r.largest_free_block_at_peak = alloc.fragmentation().largest_free_block;
      }
    } else if (e.action == TraceAction::Free) {
      auto it = live.find(e.id);
      if (it == live.end()) continue;  // never allocated, failed, or freed already
      alloc.deallocate(it->second);
      live.erase(it);
    }
  }

  const DeviceStats ds = alloc.device_stats();
  r.peak_allocated = ds.allocated_bytes[kAggregatePool].peak;
  r.peak_reserved = ds.reserved_bytes[kAggregatePool].peak;
  r.peak_requested = ds.requested_bytes[kAggregatePool].peak;
  r.num_device_allocs = ds.num_device_alloc;
  r.fragmentation =
      r.peak_reserved > 0 ? 1.0 - static_cast<double>(r.peak_allocated) / static_cast<double>(r.peak_reserved) : 0.0;

  for (auto& [id, p] : live) alloc.deallocate(p);
  return r;
}

}  // namespace ember::memory
