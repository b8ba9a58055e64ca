// The allocator trace: the ring buffer, JSON Lines export/import (docs/memory-trace.md), the Chrome trace-event
// export and its read-back, trace files of either format, and replay through a fresh CachingAllocator over an
// address-only simulated device. Invariant: writing events in either format and reading them back gives every field
// of every event (tags by name), and an event the readers accept always has action, id, size and stream.
#include "ember/memory/trace.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <istream>
#include <limits>
#include <ostream>
#include <sstream>
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
    {TraceAction::Retag, "retag"},
    {TraceAction::EmptyCache, "empty_cache"},
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
              "\" (expected alloc, free, segment_alloc, segment_free, segment_map, segment_unmap, oom, annotate, retag "
              "or empty_cache)");
}

// ---- JSON Lines ----------------------------------------------------------------------------------------------------

namespace {

// The JSON Lines object of one event (also the elements of a Chrome file's "emberEvents").
ordered_json event_json(const TraceEvent& e) {
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
  return j;
}

std::string dump(const ordered_json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

void write_trace_jsonl(const std::vector<TraceEvent>& events, std::ostream& out) {
  for (const TraceEvent& e : events) out << dump(event_json(e)) << '\n';
}

namespace {

// Where an object is, for messages: "<source>: line 3", "<source>: emberEvents[7]", "<source>: otherData". The text
// is only put together when something fails.
struct Where {
  const std::string& source;
  const char* label;  // "line", "emberEvents" or "otherData"
  int64_t index = -1;  // -1: none
  std::string str() const {
    if (index < 0) return detail::concat(source, ": ", label);
    if (label[0] == 'l') return detail::concat(source, ": ", label, " ", index);
    return detail::concat(source, ": ", label, "[", index, "]");
  }
};

// A JSON value for an error message, never dumped recursively (a hostile file may nest arrays a million deep): a
// scalar or a short string as written, anything else by its type name.
std::string describe(const json& v) {
  if (v.is_number() || v.is_boolean() || v.is_null()) return v.dump();
  if (v.is_string()) {
    const size_t n = v.get_ref<const std::string&>().size();
    if (n > 64) return detail::concat("a string of ", n, " bytes");
    return v.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  return std::string("a JSON ") + v.type_name();
}

// Reads one event object; every failure names where it is.
class EventReader {
 public:
  EventReader(const json& j, Where where) : j_(j), where_(where) {}

  [[noreturn]] void fail(const std::string& what) const { EMBER_THROW(FormatError, where_.str(), ": ", what); }

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
      fail(std::string("\"") + key + "\" must be a non-negative integer, got " + describe(*v));
    out = v->get<uint64_t>();
    return true;
  }

  bool get_i64(const char* key, bool required, bool non_negative, int64_t& out) const {
    const json* v = find(key, required);
    if (!v) return false;
    const char* want = non_negative ? "a non-negative integer" : "an integer";
    if (!v->is_number_integer()) fail(std::string("\"") + key + "\" must be " + want + ", got " + describe(*v));
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(std::string("\"") + key + "\" is out of range: " + describe(*v));
      out = static_cast<int64_t>(u);
    } else {
      out = v->get<int64_t>();
      if (non_negative && out < 0) fail(std::string("\"") + key + "\" must be " + want + ", got " + describe(*v));
    }
    return true;
  }

  bool get_string(const char* key, bool required, std::string& out) const {
    const json* v = find(key, required);
    if (!v) return false;
    if (!v->is_string()) fail(std::string("\"") + key + "\" must be a string, got " + describe(*v));
    out = v->get<std::string>();
    return true;
  }

  TraceEvent read() const {
    if (!j_.is_object()) fail("expected a JSON object, got " + std::string(j_.type_name()));
    TraceEvent e;
    std::string action;
    get_string("action", true, action);
    try {
      e.action = parse_trace_action(action);
    } catch (const FormatError& err) {
      fail(err.what());
    }
    get_u64("id", true, e.id);
    get_i64("size", true, true, e.size);
    get_u64("stream", true, e.stream);
    get_i64("block_size", false, true, e.block_size);
    get_u64("addr", false, e.addr);
    get_i64("time_ns", false, false, e.time_ns);
    get_i64("allocated", false, true, e.allocated);
    get_i64("reserved", false, true, e.reserved);
    std::string tag;
    if (get_string("tag", false, tag)) e.tag = intern_tag(tag);
    get_string("note", false, e.note);
    return e;
  }

 private:
  const json& j_;
  Where where_;
};

bool is_blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

// JSON Lines from `in`; errors read "<source>: line N: ...".
std::vector<TraceEvent> read_jsonl(std::istream& in, const std::string& source) {
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
      EMBER_THROW(FormatError, source, ": line ", line, ": malformed JSON at column ", e.byte);
    } catch (const json::exception& e) {  // e.g. a number out of range
      EMBER_THROW(FormatError, source, ": line ", line, ": ", e.what());
    }
    events.push_back(EventReader(j, Where{source, "line", line}).read());
  }
  if (in.bad()) EMBER_THROW(FormatError, source, ": read error after line ", line);
  return events;
}

}  // namespace

std::vector<TraceEvent> read_trace_jsonl(std::istream& in) { return read_jsonl(in, "read_trace_jsonl"); }

// ---- Chrome trace --------------------------------------------------------------------------------------------------
// Note [Chrome trace times]: events carry steady-clock nanoseconds; the trace-event format wants microseconds. A trace
// with no times at all (every time_ns 0, as in files written by tools that record only alloc/free) is laid out one
// microsecond per event, so its counter tracks still show each step instead of one point at t = 0.
//
// Note [Phase and module slices]: only alloc and free events form slices. A run is a maximal sequence of consecutive
// alloc/free events (other actions in between neither break nor join runs) whose tags share a phase (the "phase"
// track) or a module (the "module" track). A run's slice starts at its first event and ends where the next run
// starts; the last run ends at the trace's last event. Untagged events form runs named "untagged".

namespace {

constexpr int kPid = 1, kEventsTid = 1, kPhaseTid = 2, kModuleTid = 3;

struct Slice {
  std::string name;
  size_t first = 0, last = 0;  // event indices of the run's first and last alloc/free
  int64_t allocs = 0, frees = 0;
};

// Runs of consecutive alloc/free events with the same key (Note [Phase and module slices]); key(i) names event i's.
template <class Key>
std::vector<Slice> runs_of(const std::vector<TraceEvent>& events, Key&& key) {
  std::vector<Slice> out;
  for (size_t i = 0; i < events.size(); ++i) {
    const TraceAction a = events[i].action;
    if (a != TraceAction::Alloc && a != TraceAction::Free) continue;
    const std::string& name = key(i);
    if (out.empty() || out.back().name != name) out.push_back(Slice{name, i, i, 0, 0});
    Slice& s = out.back();
    s.last = i;
    (a == TraceAction::Alloc ? s.allocs : s.frees) += 1;
  }
  return out;
}

}  // namespace

void write_chrome_trace(const std::vector<TraceEvent>& events, std::ostream& out, const TraceFileOptions& options) {
  const bool no_times =
      std::all_of(events.begin(), events.end(), [](const TraceEvent& e) { return e.time_ns == 0; });
  auto ts_of = [&](size_t i) {
    return no_times ? static_cast<double>(i) : static_cast<double>(events[i].time_ns) / 1000.0;
  };

  out << "{\"traceEvents\":[\n";
  ordered_json meta = {{"name", "process_name"}, {"ph", "M"}, {"pid", kPid}, {"tid", kEventsTid},
                       {"args", {{"name", "ember allocator"}}}};
  out << dump(meta);
  const std::pair<int, const char*> threads[] = {
      {kEventsTid, "allocator events"}, {kPhaseTid, "phase"}, {kModuleTid, "module"}};
  for (const auto& [tid, name] : threads) {
    ordered_json t = {{"name", "thread_name"}, {"ph", "M"}, {"pid", kPid}, {"tid", tid}, {"args", {{"name", name}}}};
    out << ",\n" << dump(t);
  }

  // Tag names are looked up and split once per tag (tag_name takes a lock; split_tag in tags.h); the untagged
  // events read "untagged", a tag without a module "(no module)".
  struct TagParts {
    std::string module, phase;
  };
  std::unordered_map<TagId, TagParts> parts;
  auto parts_of = [&](size_t i) -> const TagParts& {
    const TagId tag = events[i].tag;
    auto it = parts.find(tag);
    if (it == parts.end()) {
      TagParts p;
      if (tag == kUntagged) {
        p = {"untagged", "untagged"};
      } else {
        auto [module, phase] = split_tag(tag_name(tag));
        p = {module.empty() ? std::string("(no module)") : module, phase};
      }
      it = parts.emplace(tag, std::move(p)).first;
    }
    return it->second;
  };

  for (size_t i = 0; i < events.size(); ++i) {
    const TraceEvent& e = events[i];
    const double ts = ts_of(i);
    ordered_json c = {{"name", "memory"}, {"ph", "C"}, {"ts", ts}, {"pid", kPid}, {"tid", kEventsTid},
                      {"args", {{"allocated", e.allocated}, {"reserved", e.reserved}}}};
    out << ",\n" << dump(c);
    if (e.action == TraceAction::Oom || e.action == TraceAction::Annotate) {
      const bool oom = e.action == TraceAction::Oom;
      ordered_json inst = {{"name", oom ? std::string("oom") : (e.note.empty() ? std::string("annotate") : e.note)},
                           {"cat", trace_action_name(e.action)},
                           {"ph", "i"},
                           {"s", oom ? "g" : "p"},  // an OOM is drawn across every track
                           {"ts", ts},
                           {"pid", kPid},
                           {"tid", kEventsTid}};
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

  for (const int tid : {kPhaseTid, kModuleTid}) {
    const std::vector<Slice> runs = runs_of(events, [&](size_t i) -> const std::string& {
      return tid == kPhaseTid ? parts_of(i).phase : parts_of(i).module;
    });
    for (size_t r = 0; r < runs.size(); ++r) {
      const double start = ts_of(runs[r].first);
      const double end = r + 1 < runs.size() ? ts_of(runs[r + 1].first) : ts_of(events.size() - 1);
      ordered_json x = {{"name", runs[r].name},
                        {"cat", tid == kPhaseTid ? "phase" : "module"},
                        {"ph", "X"},
                        {"ts", start},
                        {"dur", std::max(0.0, end - start)},
                        {"pid", kPid},
                        {"tid", tid},
                        {"args",
                         {{"allocs", runs[r].allocs},
                          {"frees", runs[r].frees},
                          {"first_event", runs[r].first},
                          {"last_event", runs[r].last}}}};
      out << ",\n" << dump(x);
    }
  }

  out << "\n],\"displayTimeUnit\":\"ns\",\"emberEvents\":[";
  for (size_t i = 0; i < events.size(); ++i) out << (i ? ",\n" : "\n") << dump(event_json(events[i]));
  ordered_json other = {{"alloc_conf", options.alloc_conf}, {"allocator", options.allocator}};
  out << "\n],\"otherData\":" << dump(other) << "}\n";
}

// ---- trace files ---------------------------------------------------------------------------------------------------
// Note [Trace file detection]: a Chrome file is one JSON object with "traceEvents" or "emberEvents"; a JSON Lines file
// is one object per line (a one-line file is both a JSON document and a JSON Lines file: it has "action", not
// "traceEvents"). A file whose whole text is not one JSON document is read as JSON Lines, unless its first line opens
// a Chrome file, which then is malformed (for example cut short).

namespace {

TraceFile read_chrome_doc(const json& doc, const std::string& source) {
  TraceFile f;
  f.format = "chrome";
  f.has_options = true;
  auto ember = doc.find("emberEvents");
  if (ember == doc.end())
    EMBER_THROW(FormatError, source, ": a Chrome trace without \"emberEvents\" (it was not written by ember's "
                "write_chrome_trace, or by an older version); ember reads its own Chrome traces and JSON Lines");
  if (!ember->is_array())
    EMBER_THROW(FormatError, source, ": \"emberEvents\" must be an array, got ", ember->type_name());
  f.events.reserve(ember->size());
  for (size_t i = 0; i < ember->size(); ++i)
    f.events.push_back(EventReader((*ember)[i], Where{source, "emberEvents", static_cast<int64_t>(i)}).read());
  if (auto other = doc.find("otherData"); other != doc.end() && !other->is_null()) {
    if (!other->is_object())
      EMBER_THROW(FormatError, source, ": \"otherData\" must be an object, got ", other->type_name());
    const EventReader r(*other, Where{source, "otherData"});
    r.get_string("alloc_conf", false, f.options.alloc_conf);
    r.get_string("allocator", false, f.options.allocator);
    try {
      parse_alloc_config(f.options.alloc_conf);  // validated here, before any caller uses it
    } catch (const ConfigError& e) {
      EMBER_THROW(FormatError, source, ": otherData.alloc_conf: ", e.what());
    }
  }
  return f;
}

}  // namespace

TraceFile parse_trace_text(const std::string& text, const std::string& source) {
  size_t begin = text.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;  // a UTF-8 byte-order mark
  begin = text.find_first_not_of(" \t\r\n", begin);
  if (begin == std::string::npos) return TraceFile{{}, {}, false, "jsonl"};  // an empty trace
  if (text[begin] != '{')
    EMBER_THROW(FormatError, source, ": not a trace file: expected JSON Lines (one event object per line) or a "
                "Chrome trace written by ember (a JSON object with \"emberEvents\")");
  json doc;
  bool whole = true;
  try {
    doc = json::parse(text.begin() + static_cast<std::ptrdiff_t>(begin), text.end());
  } catch (const json::parse_error& e) {
    whole = false;
    const size_t eol = text.find('\n', begin);
    const std::string first = text.substr(begin, eol == std::string::npos ? std::string::npos : eol - begin);
    const bool first_line_is_json = json::accept(first);
    if (!first_line_is_json && first.find("\"traceEvents\"") != std::string::npos)
      EMBER_THROW(FormatError, source, ": malformed Chrome trace JSON at byte ", begin + e.byte);
  } catch (const json::exception& e) {
    EMBER_THROW(FormatError, source, ": ", e.what());
  }
  if (whole && doc.is_object() && (doc.contains("traceEvents") || doc.contains("emberEvents")))
    return read_chrome_doc(doc, source);
  std::istringstream in(text.substr(begin));
  return TraceFile{read_jsonl(in, source), {}, false, "jsonl"};
}

TraceFile load_trace_file(const std::string& path) {
  std::error_code ec;
  EMBER_CHECK(!std::filesystem::is_directory(path, ec), ValueError, "cannot read trace file ", path,
              ": it is a directory");
  std::ifstream in(path, std::ios::binary);
  EMBER_CHECK(in.is_open(), ValueError, "cannot read trace file ", path, ": no such file or no permission");
  std::ostringstream text;
  text << in.rdbuf();
  EMBER_CHECK(!in.bad(), ValueError, "cannot read trace file ", path, ": read error");
  return parse_trace_text(text.str(), path);
}

std::vector<TraceEvent> read_trace_file(const std::string& path, std::string* alloc_conf) {
  TraceFile f = load_trace_file(path);
  if (alloc_conf) *alloc_conf = f.options.alloc_conf;
  return std::move(f.events);
}

void write_trace_file(const std::string& path, const std::vector<TraceEvent>& events,
                      const TraceFileOptions& options) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  EMBER_CHECK(out.is_open(), ValueError, "cannot write trace file ", path);
  const bool jsonl = path.size() >= 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0;
  if (jsonl) {
    write_trace_jsonl(events, out);
  } else {
    write_chrome_trace(events, out, options);
  }
  out.flush();
  EMBER_CHECK(out.good(), ValueError, "cannot write trace file ", path, ": write error");
}

// ---- replay --------------------------------------------------------------------------------------------------------
// Note [Replay peaks]: peak allocated/reserved/requested come from the allocator's own peak counters, read once at
// the end. The largest free block "at the peak" needs the moment itself, so it is read after each allocation that
// raised reserved memory above the highest value seen so far (reserved only grows when an allocation maps memory).

ReplayResult replay_trace(const std::vector<TraceEvent>& events, const AllocatorConfig& config, int64_t capacity) {
  // An address-only device; the simulated backing treats kNoLimit as unbounded (its accounting cannot overflow).
  EMBER_CHECK(capacity > 0, ValueError, "replay_trace: capacity must be positive, got ", capacity);
  const int64_t device = capacity == kNoLimit ? config.capacity : capacity;
  CachingAllocator alloc(make_simulated_backing(device, /*materialize=*/false), config, "replay");
  alloc.set_oom_explanations(false);  // replayed OOMs are counted, not explained

  ReplayResult r;
  r.config = config.explicit_str();
  r.allowed = alloc.allowed_memory();
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
    } else if (e.action == TraceAction::EmptyCache) {
      alloc.empty_cache();
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
