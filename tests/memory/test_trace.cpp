// Allocator trace: ring semantics (drop oldest, count drops, thread safety), action names, JSON Lines round trip and
// every reader error with its line number, the Chrome export parsed back as JSON, and replay of hand-made traces
// against hand-computed segment arithmetic (2 MiB small segments, 20 MiB large segments, 512 B rounding).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "ember/base/error.h"
#include "ember/memory/backing.h"
#include "ember/memory/caching_allocator.h"
#include "ember/memory/tags.h"
#include "ember/memory/trace.h"

using namespace ember;
using namespace ember::memory;
using nlohmann::json;

namespace {

constexpr int64_t MiB = 1024 * 1024;

TraceEvent ev(TraceAction a, uint64_t id, int64_t size, StreamId stream = 0) {
  TraceEvent e;
  e.action = a;
  e.id = id;
  e.size = size;
  e.stream = stream;
  return e;
}
TraceEvent alloc_ev(uint64_t id, int64_t size, StreamId stream = 0) { return ev(TraceAction::Alloc, id, size, stream); }
TraceEvent free_ev(uint64_t id, int64_t size = 0, StreamId stream = 0) {
  return ev(TraceAction::Free, id, size, stream);
}

std::vector<uint64_t> ids_of(const std::vector<TraceEvent>& events) {
  std::vector<uint64_t> ids;
  for (const auto& e : events) ids.push_back(e.id);
  return ids;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

// Reads `text`; expects a FormatError whose message names `line` and contains `fragment`.
void expect_format_error(const std::string& text, int line, const std::string& fragment) {
  std::istringstream in(text);
  try {
    read_trace_jsonl(in);
    ADD_FAILURE() << "no FormatError for:\n" << text;
  } catch (const FormatError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("line " + std::to_string(line) + ":"), std::string::npos) << msg;
    EXPECT_NE(msg.find(fragment), std::string::npos) << "expected \"" << fragment << "\" in: " << msg;
  }
}

}  // namespace

// ---- ring ----------------------------------------------------------------------------------------------------------

TEST(TraceRing, DisabledByDefaultAndAtCapacityZero) {
  TraceRing r;
  EXPECT_FALSE(r.enabled());
  EXPECT_EQ(r.capacity(), 0u);
  r.push(alloc_ev(1, 10));
  EXPECT_TRUE(r.events().empty());
  EXPECT_EQ(r.dropped(), 0u);  // a disabled ring records nothing, so drops nothing
}

TEST(TraceRing, PartialFillKeepsOrder) {
  TraceRing r(4);
  EXPECT_TRUE(r.enabled());
  EXPECT_EQ(r.capacity(), 4u);
  r.push(alloc_ev(1, 10));
  r.push(alloc_ev(2, 20));
  EXPECT_EQ(ids_of(r.events()), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(r.dropped(), 0u);
  EXPECT_EQ(r.events()[1].size, 20);
}

TEST(TraceRing, FullRingDropsOldestAndCounts) {
  TraceRing r(3);
  for (uint64_t i = 1; i <= 5; ++i) r.push(alloc_ev(i, static_cast<int64_t>(i) * 100));
  EXPECT_EQ(ids_of(r.events()), (std::vector<uint64_t>{3, 4, 5}));
  EXPECT_EQ(r.dropped(), 2u);
  for (uint64_t i = 6; i <= 10; ++i) r.push(alloc_ev(i, 1));  // wraps around more than once
  EXPECT_EQ(ids_of(r.events()), (std::vector<uint64_t>{8, 9, 10}));
  EXPECT_EQ(r.dropped(), 7u);
  EXPECT_EQ(r.capacity(), 3u);
}

TEST(TraceRing, SetCapacityClearsAndZeroDisables) {
  TraceRing r(2);
  for (uint64_t i = 1; i <= 4; ++i) r.push(alloc_ev(i, 1));
  r.set_capacity(5);
  EXPECT_TRUE(r.enabled());
  EXPECT_EQ(r.capacity(), 5u);
  EXPECT_TRUE(r.events().empty());
  EXPECT_EQ(r.dropped(), 0u);
  r.push(alloc_ev(7, 1));
  EXPECT_EQ(ids_of(r.events()), (std::vector<uint64_t>{7}));
  r.set_capacity(0);
  EXPECT_FALSE(r.enabled());
  r.push(alloc_ev(8, 1));
  EXPECT_TRUE(r.events().empty());
}

TEST(TraceRing, ClearEmptiesButKeepsCapacity) {
  TraceRing r(2);
  for (uint64_t i = 1; i <= 3; ++i) r.push(alloc_ev(i, 1));
  r.clear();
  EXPECT_TRUE(r.events().empty());
  EXPECT_EQ(r.dropped(), 0u);
  EXPECT_EQ(r.capacity(), 2u);
  EXPECT_TRUE(r.enabled());
  for (uint64_t i = 11; i <= 13; ++i) r.push(alloc_ev(i, 1));
  EXPECT_EQ(ids_of(r.events()), (std::vector<uint64_t>{12, 13}));
  EXPECT_EQ(r.dropped(), 1u);
}

TEST(TraceRing, ConcurrentPushesKeepEveryThreadsOrder) {
  constexpr int kThreads = 4;
  constexpr uint64_t kPerThread = 20000;
  constexpr size_t kCapacity = 1000;
  TraceRing r(kCapacity);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&r, t] {
      for (uint64_t i = 1; i <= kPerThread; ++i) r.push(alloc_ev(i, 1, static_cast<StreamId>(t)));
    });
  for (auto& th : threads) th.join();
  const auto events = r.events();
  ASSERT_EQ(events.size(), kCapacity);
  EXPECT_EQ(r.dropped(), kThreads * kPerThread - kCapacity);
  std::vector<uint64_t> last(kThreads, 0);
  for (const auto& e : events) {
    ASSERT_LT(e.stream, static_cast<StreamId>(kThreads));
    EXPECT_GT(e.id, last[e.stream]) << "thread " << e.stream << "'s events out of order";
    last[e.stream] = e.id;
  }
  // The newest event of at least one thread is its last push.
  bool some_last = false;
  for (uint64_t l : last) some_last = some_last || l == kPerThread;
  EXPECT_TRUE(some_last);
}

// ---- action names --------------------------------------------------------------------------------------------------

TEST(TraceActions, NamesAndParse) {
  const std::vector<std::pair<TraceAction, std::string>> table = {
      {TraceAction::Alloc, "alloc"},           {TraceAction::Free, "free"},
      {TraceAction::SegmentAlloc, "segment_alloc"}, {TraceAction::SegmentFree, "segment_free"},
      {TraceAction::SegmentMap, "segment_map"},     {TraceAction::SegmentUnmap, "segment_unmap"},
      {TraceAction::Oom, "oom"},               {TraceAction::Annotate, "annotate"}};
  for (const auto& [a, name] : table) {
    EXPECT_EQ(std::string(trace_action_name(a)), name);
    EXPECT_EQ(parse_trace_action(name), a);
  }
  EXPECT_THROW(parse_trace_action("malloc"), FormatError);
  EXPECT_THROW(parse_trace_action("Alloc"), FormatError);
  EXPECT_THROW(parse_trace_action(""), FormatError);
}

// ---- JSON Lines ----------------------------------------------------------------------------------------------------

namespace {

// One event of every action, with every field set to a distinct value.
std::vector<TraceEvent> every_action() {
  const TagId fwd = intern_tag("model.layers.0.attn/forward");
  const TagId opt = intern_tag("optimizer \"adam\"/state");
  std::vector<TraceEvent> v;
  const TraceAction actions[] = {TraceAction::Alloc,      TraceAction::Free,         TraceAction::SegmentAlloc,
                                 TraceAction::SegmentFree, TraceAction::SegmentMap,   TraceAction::SegmentUnmap,
                                 TraceAction::Oom,        TraceAction::Annotate};
  int k = 0;
  for (TraceAction a : actions) {
    TraceEvent e;
    e.action = a;
    e.id = (a == TraceAction::Alloc || a == TraceAction::Free) ? 1000 + k : 0;
    e.size = 512 * (k + 1) + 3;
    e.block_size = 512 * (k + 2);
    e.addr = 0x7f0000000000ull + 4096ull * k;
    e.stream = static_cast<StreamId>(k % 3);
    e.tag = k % 2 == 0 ? fwd : (k == 3 ? opt : kUntagged);
    e.time_ns = 1000 * k + 7;
    e.allocated = 10 * MiB + k;
    e.reserved = 20 * MiB + k;
    if (a == TraceAction::Annotate) e.note = "step 3 \"warmup\"\n\tdone \xc3\xa9";
    v.push_back(e);
    ++k;
  }
  // Extremes: the largest ids, addresses and streams, and a negative time.
  TraceEvent big = alloc_ev(std::numeric_limits<uint64_t>::max(), std::numeric_limits<int64_t>::max());
  big.addr = std::numeric_limits<uint64_t>::max() - 511;
  big.stream = std::numeric_limits<uint64_t>::max();
  big.time_ns = -5;
  v.push_back(big);
  return v;
}

}  // namespace

TEST(TraceJsonl, RoundTripsEveryAction) {
  const auto events = every_action();
  std::ostringstream out;
  write_trace_jsonl(events, out);
  std::istringstream in(out.str());
  const auto back = read_trace_jsonl(in);
  ASSERT_EQ(back.size(), events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    SCOPED_TRACE("event " + std::to_string(i) + " (" + trace_action_name(events[i].action) + ")");
    EXPECT_EQ(back[i].action, events[i].action);
    EXPECT_EQ(back[i].id, events[i].id);
    EXPECT_EQ(back[i].size, events[i].size);
    EXPECT_EQ(back[i].block_size, events[i].block_size);
    EXPECT_EQ(back[i].addr, events[i].addr);
    EXPECT_EQ(back[i].stream, events[i].stream);
    EXPECT_EQ(back[i].tag, events[i].tag);  // re-interned: the same name gives the same id in one process
    EXPECT_EQ(back[i].time_ns, events[i].time_ns);
    EXPECT_EQ(back[i].allocated, events[i].allocated);
    EXPECT_EQ(back[i].reserved, events[i].reserved);
    EXPECT_EQ(back[i].note, events[i].note);
  }
}

TEST(TraceJsonl, OneObjectPerLineWithDocumentedKeys) {
  const auto events = every_action();
  std::ostringstream out;
  write_trace_jsonl(events, out);
  const auto lines = split_lines(out.str());
  ASSERT_EQ(lines.size(), events.size());
  const std::set<std::string> always = {"action", "id", "size", "stream", "block_size",
                                        "addr", "time_ns", "allocated", "reserved"};
  for (size_t i = 0; i < lines.size(); ++i) {
    SCOPED_TRACE(lines[i]);
    const json j = json::parse(lines[i]);
    ASSERT_TRUE(j.is_object());
    std::set<std::string> expected = always;
    if (events[i].tag != kUntagged) expected.insert("tag");
    if (events[i].action == TraceAction::Annotate) expected.insert("note");
    std::set<std::string> keys;
    for (auto it = j.begin(); it != j.end(); ++it) keys.insert(it.key());
    EXPECT_EQ(keys, expected);
    EXPECT_TRUE(j["action"].is_string());
    EXPECT_TRUE(j["id"].is_number_unsigned());
    EXPECT_TRUE(j["size"].is_number_integer());
    EXPECT_TRUE(j["stream"].is_number_unsigned());
  }
  // Spot checks against hand-written values: the tag is written by name, the note as text.
  const json first = json::parse(lines[0]);
  EXPECT_EQ(first["action"], "alloc");
  EXPECT_EQ(first["id"], 1000);
  EXPECT_EQ(first["size"], 515);
  EXPECT_EQ(first["block_size"], 1024);
  EXPECT_EQ(first["tag"], "model.layers.0.attn/forward");
  EXPECT_EQ(json::parse(lines[3])["tag"], "optimizer \"adam\"/state");
  EXPECT_EQ(json::parse(lines[7])["note"], "step 3 \"warmup\"\n\tdone \xc3\xa9");
}

TEST(TraceJsonl, EmptyTraceWritesNothing) {
  std::ostringstream out;
  write_trace_jsonl({}, out);
  EXPECT_EQ(out.str(), "");
  std::istringstream in("");
  EXPECT_TRUE(read_trace_jsonl(in).empty());
}

TEST(TraceJsonl, ReadsMinimalHandWrittenFile) {
  // What another tool might write: only the four required keys, blank lines, CRLF endings, unknown keys, nulls.
  const std::string text =
      "{\"action\":\"alloc\",\"id\":1,\"size\":1048576,\"stream\":0}\n"
      "\n"
      "   \n"
      "{\"action\": \"alloc\", \"id\": 2, \"size\": 4096, \"stream\": 7, \"frames\": [\"f\", 1], \"x\": {}}\r\n"
      "{\"stream\":0,\"size\":1048576,\"id\":1,\"action\":\"free\",\"tag\":null,\"time_ns\":null}\n"
      "{\"action\":\"free\",\"id\":2,\"size\":4096,\"stream\":7}";  // no final newline
  std::istringstream in(text);
  const auto events = read_trace_jsonl(in);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].action, TraceAction::Alloc);
  EXPECT_EQ(events[0].id, 1u);
  EXPECT_EQ(events[0].size, 1048576);
  EXPECT_EQ(events[0].stream, 0u);
  EXPECT_EQ(events[1].id, 2u);
  EXPECT_EQ(events[1].size, 4096);
  EXPECT_EQ(events[1].stream, 7u);
  EXPECT_EQ(events[2].action, TraceAction::Free);
  EXPECT_EQ(events[2].id, 1u);
  EXPECT_EQ(events[3].action, TraceAction::Free);
  EXPECT_EQ(events[3].stream, 7u);
  for (const auto& e : events) {  // missing optional keys default to zero / untagged / empty
    EXPECT_EQ(e.block_size, 0);
    EXPECT_EQ(e.addr, 0u);
    EXPECT_EQ(e.time_ns, 0);
    EXPECT_EQ(e.allocated, 0);
    EXPECT_EQ(e.reserved, 0);
    EXPECT_EQ(e.tag, kUntagged);
    EXPECT_EQ(e.note, "");
  }
}

TEST(TraceJsonl, ReadReinternsTagNames) {
  const std::string name = "trace.test.only.tag/backward";
  std::istringstream in("{\"action\":\"alloc\",\"id\":3,\"size\":8,\"stream\":0,\"tag\":\"" + name + "\"}\n");
  const auto events = read_trace_jsonl(in);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_NE(events[0].tag, kUntagged);
  EXPECT_EQ(tag_name(events[0].tag), name);
  EXPECT_EQ(intern_tag(name), events[0].tag);
}

TEST(TraceJsonl, FormatErrorsNameTheLine) {
  const std::string ok = "{\"action\":\"alloc\",\"id\":1,\"size\":8,\"stream\":0}\n";
  // Malformed JSON, after a blank line (blank lines still count).
  expect_format_error(ok + "\n{\"action\":\"alloc\",\"id\":1,", 3, "malformed JSON");
  expect_format_error(ok + "not json\n", 2, "malformed JSON");
  expect_format_error("{\"action\":\"alloc\"} trailing\n", 1, "malformed JSON");
  // Not an object.
  expect_format_error(ok + ok + "[1,2,3]\n", 3, "object");
  expect_format_error("42\n", 1, "object");
  // Missing required keys.
  expect_format_error("{\"id\":1,\"size\":8,\"stream\":0}\n", 1, "\"action\"");
  expect_format_error(ok + "{\"action\":\"alloc\",\"size\":8,\"stream\":0}\n", 2, "\"id\"");
  expect_format_error(ok + ok + ok + "{\"action\":\"free\",\"id\":1,\"stream\":0}\n", 4, "\"size\"");
  expect_format_error("{\"action\":\"free\",\"id\":1,\"size\":8}\n", 1, "\"stream\"");
  expect_format_error("{\"action\":null,\"id\":1,\"size\":8,\"stream\":0}\n", 1, "\"action\"");
  // Wrong types and out-of-range values.
  expect_format_error(ok + "{\"action\":5,\"id\":1,\"size\":8,\"stream\":0}\n", 2, "\"action\" must be a string");
  expect_format_error("{\"action\":\"alloc\",\"id\":\"1\",\"size\":8,\"stream\":0}\n", 1, "\"id\"");
  expect_format_error("{\"action\":\"alloc\",\"id\":-1,\"size\":8,\"stream\":0}\n", 1, "\"id\"");
  expect_format_error("{\"action\":\"alloc\",\"id\":1,\"size\":8.5,\"stream\":0}\n", 1, "\"size\"");
  expect_format_error("{\"action\":\"alloc\",\"id\":1,\"size\":-8,\"stream\":0}\n", 1, "\"size\"");
  expect_format_error("{\"action\":\"alloc\",\"id\":1,\"size\":9223372036854775808,\"stream\":0}\n", 1, "\"size\"");
  expect_format_error("{\"action\":\"alloc\",\"id\":1,\"size\":8,\"stream\":true}\n", 1, "\"stream\"");
  expect_format_error("{\"action\":\"alloc\",\"id\":1,\"size\":8,\"stream\":0,\"tag\":3}\n", 1, "\"tag\"");
  expect_format_error("{\"action\":\"annotate\",\"id\":0,\"size\":0,\"stream\":0,\"note\":[]}\n", 1, "\"note\"");
  expect_format_error("{\"action\":\"alloc\",\"id\":1,\"size\":8,\"stream\":0,\"block_size\":\"1k\"}\n", 1,
                      "\"block_size\"");
  expect_format_error("{\"action\":\"alloc\",\"id\":1,\"size\":8,\"stream\":0,\"addr\":-4}\n", 1, "\"addr\"");
  expect_format_error("{\"action\":\"alloc\",\"id\":1,\"size\":8,\"stream\":0,\"time_ns\":1.5}\n", 1, "\"time_ns\"");
  expect_format_error("{\"action\":\"alloc\",\"id\":1,\"size\":8,\"stream\":0,\"allocated\":-1}\n", 1, "\"allocated\"");
  expect_format_error("{\"action\":\"alloc\",\"id\":1,\"size\":8,\"stream\":0,\"reserved\":{}}\n", 1, "\"reserved\"");
  // Unknown action.
  expect_format_error(ok + ok + "{\"action\":\"malloc\",\"id\":1,\"size\":8,\"stream\":0}\n", 3, "malloc");
}

// ---- Chrome trace --------------------------------------------------------------------------------------------------

TEST(TraceChrome, CounterAndInstantEventsParseBack) {
  std::vector<TraceEvent> events;
  auto add = [&](TraceAction a, int64_t t_ns, int64_t allocated, int64_t reserved, const std::string& note = "") {
    TraceEvent e = ev(a, a == TraceAction::Alloc || a == TraceAction::Free ? 9 : 0, 1024);
    e.time_ns = t_ns;
    e.allocated = allocated;
    e.reserved = reserved;
    e.note = note;
    events.push_back(e);
  };
  add(TraceAction::SegmentAlloc, 1000, 0, 2 * MiB);
  add(TraceAction::Alloc, 2500, 1024, 2 * MiB);
  add(TraceAction::Annotate, 3000, 1024, 2 * MiB, "step \"1\"");
  add(TraceAction::Oom, 4000, 1024, 2 * MiB);
  add(TraceAction::Free, 5001, 0, 2 * MiB);
  add(TraceAction::SegmentFree, 6000, 0, 0);

  std::ostringstream out;
  write_chrome_trace(events, out);
  json doc;
  ASSERT_NO_THROW(doc = json::parse(out.str())) << out.str();
  ASSERT_TRUE(doc.is_object());
  ASSERT_TRUE(doc["traceEvents"].is_array());

  // Expected counters, computed by hand: ts = time_ns / 1000 microseconds.
  const double ts[] = {1.0, 2.5, 3.0, 4.0, 5.001, 6.0};
  const int64_t alloc_bytes[] = {0, 1024, 1024, 1024, 0, 0};
  const int64_t reserved_bytes[] = {2 * MiB, 2 * MiB, 2 * MiB, 2 * MiB, 2 * MiB, 0};
  std::vector<json> counters, instants;
  std::set<std::string> metadata;
  for (const json& e : doc["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph"));
    ASSERT_TRUE(e.contains("pid"));
    if (e["ph"] == "C") counters.push_back(e);
    if (e["ph"] == "i") instants.push_back(e);
    if (e["ph"] == "M") metadata.insert(e["name"].get<std::string>());
  }
  EXPECT_EQ(metadata, (std::set<std::string>{"process_name", "thread_name"}));
  ASSERT_EQ(counters.size(), 6u);
  for (size_t i = 0; i < counters.size(); ++i) {
    EXPECT_EQ(counters[i]["name"], "memory");
    EXPECT_NEAR(counters[i]["ts"].get<double>(), ts[i], 1e-9);
    EXPECT_EQ(counters[i]["args"]["allocated"], alloc_bytes[i]);
    EXPECT_EQ(counters[i]["args"]["reserved"], reserved_bytes[i]);
    EXPECT_EQ(counters[i]["args"].size(), 2u);
  }
  ASSERT_EQ(instants.size(), 2u);
  EXPECT_EQ(instants[0]["name"], "step \"1\"");
  EXPECT_EQ(instants[0]["args"]["note"], "step \"1\"");
  EXPECT_NEAR(instants[0]["ts"].get<double>(), 3.0, 1e-9);
  EXPECT_EQ(instants[1]["name"], "oom");
  EXPECT_EQ(instants[1]["args"]["size"], 1024);
  EXPECT_NEAR(instants[1]["ts"].get<double>(), 4.0, 1e-9);
}

TEST(TraceChrome, UntimedTraceIsLaidOutOneMicrosecondPerEvent) {
  const std::vector<TraceEvent> events = {alloc_ev(1, 10), alloc_ev(2, 20), free_ev(1), free_ev(2)};
  std::ostringstream out;
  write_chrome_trace(events, out);
  const json doc = json::parse(out.str());
  std::vector<double> ts;
  for (const json& e : doc["traceEvents"])
    if (e["ph"] == "C") ts.push_back(e["ts"].get<double>());
  EXPECT_EQ(ts, (std::vector<double>{0.0, 1.0, 2.0, 3.0}));
}

TEST(TraceChrome, EmptyTraceIsValidJson) {
  std::ostringstream out;
  write_chrome_trace({}, out);
  const json doc = json::parse(out.str());
  ASSERT_TRUE(doc["traceEvents"].is_array());
  for (const json& e : doc["traceEvents"]) EXPECT_EQ(e["ph"], "M");
}

// ---- replay --------------------------------------------------------------------------------------------------------

TEST(TraceReplay, SmallPoolBlockIsReused) {
  // 1 MiB is a small request: one 2 MiB segment; the second alloc reuses the freed block.
  const std::vector<TraceEvent> t = {alloc_ev(1, MiB), free_ev(1), alloc_ev(2, MiB), free_ev(2)};
  const ReplayResult r = replay_trace(t, AllocatorConfig{});
  EXPECT_EQ(r.num_allocs, 2);
  EXPECT_EQ(r.num_device_allocs, 1);
  EXPECT_EQ(r.peak_reserved, 2 * MiB);
  EXPECT_EQ(r.peak_allocated, MiB);
  EXPECT_EQ(r.peak_requested, MiB);
  EXPECT_DOUBLE_EQ(r.fragmentation, 0.5);
  EXPECT_EQ(r.largest_free_block_at_peak, MiB);  // the other half of the 2 MiB segment
  EXPECT_EQ(r.num_ooms, 0);
  EXPECT_EQ(r.first_oom_index, -1);
  EXPECT_EQ(r.config, AllocatorConfig{}.explicit_str());
}

TEST(TraceReplay, RequestsRoundTo512Bytes) {
  const std::vector<TraceEvent> t = {alloc_ev(1, 1000), alloc_ev(2, 1)};
  const ReplayResult r = replay_trace(t, AllocatorConfig{});
  EXPECT_EQ(r.peak_allocated, 1024 + 512);
  EXPECT_EQ(r.peak_requested, 1001);
  EXPECT_EQ(r.peak_reserved, 2 * MiB);
  EXPECT_EQ(r.num_device_allocs, 1);
  EXPECT_DOUBLE_EQ(r.fragmentation, 1.0 - 1536.0 / (2.0 * MiB));
}

TEST(TraceReplay, ThreeSixMiBRequestsShareOneLargeSegment) {
  // 6 MiB is in [1, 10) MiB: a 20 MiB segment, split 6 + 14, then 6 + 8, then 6 + 2 (remainders > 1 MiB split).
  const std::vector<TraceEvent> t = {alloc_ev(1, 6 * MiB), alloc_ev(2, 6 * MiB), alloc_ev(3, 6 * MiB)};
  const ReplayResult r = replay_trace(t, AllocatorConfig{});
  EXPECT_EQ(r.num_device_allocs, 1);
  EXPECT_EQ(r.peak_reserved, 20 * MiB);
  EXPECT_EQ(r.peak_allocated, 18 * MiB);
  EXPECT_NEAR(r.fragmentation, 0.1, 1e-12);
  EXPECT_EQ(r.largest_free_block_at_peak, 14 * MiB);  // reserved peaked at the first alloc
}

TEST(TraceReplay, FourthSixMiBRequestNeedsASecondSegment) {
  const std::vector<TraceEvent> t = {alloc_ev(1, 6 * MiB), alloc_ev(2, 6 * MiB), alloc_ev(3, 6 * MiB),
                                     alloc_ev(4, 6 * MiB)};
  const ReplayResult r = replay_trace(t, AllocatorConfig{});
  EXPECT_EQ(r.num_device_allocs, 2);
  EXPECT_EQ(r.peak_reserved, 40 * MiB);
  EXPECT_EQ(r.peak_allocated, 24 * MiB);
  EXPECT_NEAR(r.fragmentation, 0.4, 1e-12);
  // At the second segment: 2 MiB left in the first, 14 MiB in the second.
  EXPECT_EQ(r.largest_free_block_at_peak, 14 * MiB);
}

TEST(TraceReplay, StreamsDoNotShareCachedBlocks) {
  const std::vector<TraceEvent> t = {alloc_ev(1, MiB, 1), free_ev(1, MiB, 1), alloc_ev(2, MiB, 2), free_ev(2, MiB, 2),
                                     alloc_ev(3, MiB, 1)};
  const ReplayResult r = replay_trace(t, AllocatorConfig{});
  EXPECT_EQ(r.num_device_allocs, 2);  // stream 2 cannot take stream 1's cached block; stream 1 reuses its own
  EXPECT_EQ(r.peak_reserved, 4 * MiB);
  EXPECT_EQ(r.peak_allocated, MiB);
  EXPECT_EQ(r.num_allocs, 3);
}

TEST(TraceReplay, OomIsCountedAndReplayContinues) {
  // A 30 MiB device: one 20 MiB segment holds three 6 MiB blocks; a 12 MiB request needs a 12 MiB segment
  // (20 + 12 > 30) and nothing cached is unsplit, so it fails. Once the three are freed, the whole 20 MiB
  // segment serves the next 12 MiB request without a device allocation. A 40 MiB request can never fit.
  const std::vector<TraceEvent> t = {
      alloc_ev(1, 6 * MiB),   // 0
      alloc_ev(2, 6 * MiB),   // 1
      alloc_ev(3, 6 * MiB),   // 2
      alloc_ev(4, 12 * MiB),  // 3: OOM
      free_ev(4),             // 4: ignored (never allocated)
      free_ev(1),             // 5
      free_ev(2),             // 6
      free_ev(3),             // 7
      alloc_ev(5, 12 * MiB),  // 8: served from the cached segment
      free_ev(99),            // 9: unknown id, ignored
      alloc_ev(6, 40 * MiB),  // 10: OOM
      free_ev(5),             // 11
  };
  const ReplayResult r = replay_trace(t, AllocatorConfig{}, 30 * MiB);
  EXPECT_EQ(r.num_ooms, 2);
  EXPECT_EQ(r.first_oom_index, 3);
  EXPECT_EQ(r.num_allocs, 4);
  EXPECT_EQ(r.num_device_allocs, 1);
  EXPECT_EQ(r.peak_reserved, 20 * MiB);
  EXPECT_EQ(r.peak_allocated, 18 * MiB);
}

TEST(TraceReplay, NonAllocEventsAndStrayFreesAreIgnored) {
  std::vector<TraceEvent> t = {free_ev(5, MiB), ev(TraceAction::SegmentAlloc, 0, 20 * MiB),
                               ev(TraceAction::Annotate, 0, 0), ev(TraceAction::Oom, 0, 100 * MiB),
                               alloc_ev(1, 512), free_ev(1), free_ev(1)};
  const ReplayResult r = replay_trace(t, AllocatorConfig{});
  EXPECT_EQ(r.num_allocs, 1);
  EXPECT_EQ(r.num_ooms, 0);
  EXPECT_EQ(r.num_device_allocs, 1);
  EXPECT_EQ(r.peak_reserved, 2 * MiB);
  EXPECT_EQ(r.peak_allocated, 512);
}

TEST(TraceReplay, EmptyTrace) {
  const ReplayResult r = replay_trace({}, AllocatorConfig{});
  EXPECT_EQ(r.peak_reserved, 0);
  EXPECT_EQ(r.peak_allocated, 0);
  EXPECT_EQ(r.fragmentation, 0.0);
  EXPECT_EQ(r.num_allocs, 0);
  EXPECT_EQ(r.first_oom_index, -1);
}

TEST(TraceReplay, HandWrittenJsonlFile) {
  std::istringstream in(
      "{\"action\":\"alloc\",\"id\":1,\"size\":6291456,\"stream\":0}\n"
      "{\"action\":\"alloc\",\"id\":2,\"size\":6291456,\"stream\":0}\n"
      "{\"action\":\"free\",\"id\":1,\"size\":6291456,\"stream\":0}\n"
      "{\"action\":\"alloc\",\"id\":3,\"size\":4194304,\"stream\":0}\n");
  const ReplayResult r = replay_trace(read_trace_jsonl(in), AllocatorConfig{});
  // 6 + 6 MiB from one 20 MiB segment; the freed first 6 MiB block serves 4 MiB (remainder 2 MiB > 1 MiB: split).
  EXPECT_EQ(r.num_device_allocs, 1);
  EXPECT_EQ(r.peak_reserved, 20 * MiB);
  EXPECT_EQ(r.peak_allocated, 12 * MiB);
  EXPECT_EQ(r.num_allocs, 3);
}

TEST(TraceReplay, ExpandableSegmentsGrowByPages) {
  // Under expandable_segments the large pool maps 2 MiB pages as needed: 3 x 6 MiB reserve 18 MiB, not 20 MiB.
  const std::vector<TraceEvent> t = {alloc_ev(1, 6 * MiB), alloc_ev(2, 6 * MiB), alloc_ev(3, 6 * MiB)};
  const AllocatorConfig config = parse_alloc_config("expandable_segments:True");
  const ReplayResult r = replay_trace(t, config);
  EXPECT_EQ(r.config, config.str());
  EXPECT_NE(r.config, AllocatorConfig{}.str());
  EXPECT_EQ(r.peak_allocated, 18 * MiB);
  EXPECT_EQ(r.peak_reserved, 18 * MiB);
  EXPECT_DOUBLE_EQ(r.fragmentation, 0.0);
}

TEST(TraceReplay, RecordedTraceReplaysToTheSamePeaks) {
  // Invariant: a trace recorded by an allocator, written as JSONL and read back, replays under the same
  // configuration to the peaks that allocator reported.
  CachingAllocator a(make_simulated_backing(1024 * MiB, /*materialize=*/false));
  a.enable_trace(10000);
  std::vector<void*> live;
  const int64_t sizes[] = {700, MiB, 3 * MiB, 512 * 1024, 12 * MiB + 5, 6 * MiB, 100, 25 * MiB};
  for (int round = 0; round < 3; ++round) {
    for (int64_t s : sizes) live.push_back(a.allocate(s + round * 4096));
    a.annotate("round " + std::to_string(round));
    for (size_t i = 0; i < live.size(); i += 2) a.deallocate(live[i]);
    std::vector<void*> keep;
    for (size_t i = 1; i < live.size(); i += 2) keep.push_back(live[i]);
    live = keep;
  }
  for (void* p : live) a.deallocate(p);
  const DeviceStats ds = a.device_stats();

  std::stringstream file;
  write_trace_jsonl(a.trace(), file);
  const ReplayResult r = replay_trace(read_trace_jsonl(file), AllocatorConfig{});
  EXPECT_EQ(r.peak_reserved, ds.reserved_bytes[kAggregatePool].peak);
  EXPECT_EQ(r.peak_allocated, ds.allocated_bytes[kAggregatePool].peak);
  EXPECT_EQ(r.peak_requested, ds.requested_bytes[kAggregatePool].peak);
  EXPECT_EQ(r.num_device_allocs, ds.num_device_alloc);
  EXPECT_EQ(r.num_allocs, 24);
  EXPECT_EQ(r.num_ooms, 0);
}

// ---- empty_cache in a trace, hostile nesting, largest free block of expandable segments ----------------------------

// Replay calls empty_cache() where the recording allocator did. By hand: a 30 MiB segment, freed and released, then a
// 40 MiB segment: peak reserved 40 MiB (a replay that kept the 30 MiB cached would reserve 70 MiB).
TEST(TraceReplay, EmptyCacheEventIsReplayed) {
  auto a = std::make_unique<CachingAllocator>(make_simulated_backing(int64_t{16} << 30, /*materialize=*/false));
  a->enable_trace(1024);
  a->deallocate(a->allocate(30 * MiB));
  a->empty_cache();
  a->deallocate(a->allocate(40 * MiB));
  ASSERT_EQ(a->stats().peak_reserved_bytes, 40 * MiB);
  const std::vector<TraceEvent> events = a->trace();
  // alloc, free, empty_cache, then the 30 MiB segment_free that empty_cache caused.
  ASSERT_GE(events.size(), 6u);
  size_t at = events.size();
  for (size_t i = 0; i < events.size(); ++i)
    if (events[i].action == TraceAction::EmptyCache) at = i;
  ASSERT_LT(at + 1, events.size());
  EXPECT_EQ(events[at + 1].action, TraceAction::SegmentFree);
  EXPECT_EQ(events[at + 1].size, 30 * MiB);
  EXPECT_EQ(events[at].reserved, 30 * MiB);  // recorded before the release

  const ReplayResult r = replay_trace(events, a->config());
  EXPECT_EQ(r.peak_reserved, 40 * MiB);
  EXPECT_EQ(r.num_device_allocs, 2);

  // The action's name, through JSON Lines and back.
  EXPECT_STREQ(trace_action_name(TraceAction::EmptyCache), "empty_cache");
  EXPECT_EQ(parse_trace_action("empty_cache"), TraceAction::EmptyCache);
  std::stringstream jsonl;
  write_trace_jsonl(events, jsonl);
  EXPECT_NE(jsonl.str().find("\"action\":\"empty_cache\""), std::string::npos);
  const std::vector<TraceEvent> back = read_trace_jsonl(jsonl);
  ASSERT_EQ(back.size(), events.size());
  EXPECT_EQ(back[at].action, TraceAction::EmptyCache);
  EXPECT_EQ(replay_trace(back, a->config()).peak_reserved, 40 * MiB);
}

// A configuration's capacity makes the replay a device of that size, as EMBER_ALLOC_CONF's makes the host one, so
// per_process_memory_fraction applies to it: 30 + 40 MiB live fit 100 MiB, not half of it.
TEST(TraceReplay, ConfigCapacityIsTheDeviceTheFractionAppliesTo) {
  auto a = std::make_unique<CachingAllocator>(make_simulated_backing(int64_t{16} << 30, /*materialize=*/false));
  a->enable_trace(1024);
  void* x = a->allocate(30 * MiB);
  void* y = a->allocate(40 * MiB);
  a->deallocate(y);
  a->deallocate(x);
  const ReplayResult whole = replay_trace(a->trace(), parse_alloc_config("capacity:100MiB"));
  EXPECT_EQ(whole.allowed, 100 * MiB);
  EXPECT_EQ(whole.num_ooms, 0);
  const ReplayResult half = replay_trace(a->trace(), parse_alloc_config("capacity:100MiB,per_process_memory_fraction:0.5"));
  EXPECT_EQ(half.allowed, 50 * MiB);
  EXPECT_EQ(half.num_ooms, 1);
  EXPECT_EQ(replay_trace(a->trace(), AllocatorConfig{}).allowed, kNoLimit);
  // An explicit device size still wins, the configuration's capacity capping it.
  EXPECT_EQ(replay_trace(a->trace(), parse_alloc_config("capacity:100MiB"), 80 * MiB).allowed, 80 * MiB);
}

// A hostile trace: a required key holding an array nested 100000 deep. The error names the key and the value's type
// (it must not print the value, which would recurse once per level).
TEST(TraceReader, DeeplyNestedValueIsAFormatError) {
  const size_t depth = 100000;
  const std::string text = "{\"action\":\"alloc\",\"id\":" + std::string(depth, '[') + std::string(depth, ']') +
                           ",\"size\":1,\"stream\":0}\n";
  try {
    parse_trace_text(text, "deep.jsonl");
    FAIL() << "no FormatError";
  } catch (const FormatError& e) {
    const std::string what = e.what();
    EXPECT_LT(what.size(), 300u) << what;
    EXPECT_NE(what.find("\"id\""), std::string::npos) << what;
    EXPECT_NE(what.find("array"), std::string::npos) << what;
  }
  // Short scalars are still quoted as written; long strings by their length.
  try {
    parse_trace_text("{\"action\":\"alloc\",\"id\":-3,\"size\":1,\"stream\":0}\n", "neg.jsonl");
    FAIL() << "no FormatError";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("got -3"), std::string::npos) << e.what();
  }
  try {
    parse_trace_text("{\"action\":\"alloc\",\"id\":\"" + std::string(1000, 'x') + "\",\"size\":1,\"stream\":0}\n",
                     "long.jsonl");
    FAIL() << "no FormatError";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("a string of 1000 bytes"), std::string::npos) << e.what();
  }
}

// fragmentation().largest_free_block counts only the mapped bytes of a free block of an expandable segment (the
// bytes the cache could hand out without the device). By hand: three 8 MiB blocks in one expandable segment (2 MiB
// pages); freeing the middle one leaves an 8 MiB free block, fully mapped; empty_cache() unmaps its four pages (the
// segment cannot shrink: its last block is live), so the cache holds no free mapped byte.
TEST(TraceReplay, LargestFreeBlockCountsOnlyMappedBytes) {
  auto a = std::make_unique<CachingAllocator>(make_simulated_backing(int64_t{1} << 30, /*materialize=*/false),
                                              parse_alloc_config("expandable_segments:True"));
  void* p0 = a->allocate(8 * MiB);
  void* p1 = a->allocate(8 * MiB);
  void* p2 = a->allocate(8 * MiB);
  a->deallocate(p1);
  EXPECT_EQ(a->fragmentation().largest_free_block, 8 * MiB);
  a->empty_cache();
  EXPECT_EQ(a->stats().reserved_bytes, 16 * MiB);
  EXPECT_EQ(a->fragmentation().largest_free_block, 0);
  a->deallocate(p0);  // merges with the unmapped hole: 8 MiB mapped of 16 MiB free
  EXPECT_EQ(a->fragmentation().largest_free_block, 8 * MiB);
  a->deallocate(p2);
}
