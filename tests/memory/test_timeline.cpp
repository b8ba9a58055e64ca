// Memory timeline and trace files: the peak and the owners alive there on a hand-built trace, the HTML page (peak
// marker, one band per owner, the alive-at-peak rows, escaping, bounded size), Chrome JSON read-back and its
// phase/module slices checked by hand, malformed files, and replay exactness: a trace recorded under a non-default
// configuration, written to a file and read back, replays to the recording allocator's own peaks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "ember/base/error.h"
#include "ember/memory/backing.h"
#include "ember/memory/caching_allocator.h"
#include "ember/memory/tags.h"
#include "ember/memory/timeline.h"
#include "ember/memory/trace.h"
#include "tests/harness/op_harness.h"
#include "tests/memory/caching_test_util.h"

using namespace ember;
using namespace ember::memory;
using nlohmann::json;

namespace {

constexpr int64_t KiB = 1024, MiB = 1024 * 1024;

TraceEvent ev(TraceAction a, uint64_t id, int64_t size, int64_t block, const std::string& tag, int64_t t = 0) {
  TraceEvent e;
  e.action = a;
  e.id = id;
  e.size = size;
  e.block_size = block;
  e.tag = tag.empty() ? kUntagged : intern_tag(tag);
  e.time_ns = t;
  return e;
}

// Allocated after each event: 1024, 4096, 3072, 8192, 8192, 8704, 5632, 512, 0. Peak: event 5 (8704 B), with
// ids 3 (5120 B, A/backward), 2 (3072 B, B/forward) and 4 (512 B, untagged) alive.
std::vector<TraceEvent> hand_trace() {
  std::vector<TraceEvent> t = {
      ev(TraceAction::Alloc, 1, 1000, 1024, "A/forward"),
      ev(TraceAction::Alloc, 2, 3000, 3072, "B/forward"),
      ev(TraceAction::Free, 1, 1000, 1024, "A/forward"),
      ev(TraceAction::Alloc, 3, 5000, 5120, "A/backward"),
      ev(TraceAction::Annotate, 0, 0, 0, ""),
      ev(TraceAction::Alloc, 4, 300, 512, ""),
      ev(TraceAction::Free, 2, 3000, 3072, "B/forward"),
      ev(TraceAction::Free, 3, 5000, 5120, "A/backward"),
      ev(TraceAction::Free, 4, 300, 512, ""),
  };
  t[4].note = "step 1";
  return t;
}

std::string page_of(const std::vector<TraceEvent>& events, const TimelineOptions& o = {}) {
  std::ostringstream out;
  write_timeline_html(events, out, o);
  return out.str();
}

size_t count(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (size_t p = s.find(part); p != std::string::npos; p = s.find(part, p + part.size())) ++n;
  return n;
}

// A scratch directory for this test binary, removed at exit.
class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("ember_timeline_" + std::to_string(static_cast<long long>(::getpid())) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name), std::ios::binary) << text;
    return file(name);
  }

 private:
  std::filesystem::path path_;
};

void expect_same_events(const std::vector<TraceEvent>& got, const std::vector<TraceEvent>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("event " + std::to_string(i));
    EXPECT_EQ(got[i].action, want[i].action);
    EXPECT_EQ(got[i].id, want[i].id);
    EXPECT_EQ(got[i].size, want[i].size);
    EXPECT_EQ(got[i].block_size, want[i].block_size);
    EXPECT_EQ(got[i].addr, want[i].addr);
    EXPECT_EQ(got[i].stream, want[i].stream);
    EXPECT_EQ(tag_name(got[i].tag), tag_name(want[i].tag));
    EXPECT_EQ(got[i].time_ns, want[i].time_ns);
    EXPECT_EQ(got[i].allocated, want[i].allocated);
    EXPECT_EQ(got[i].reserved, want[i].reserved);
    EXPECT_EQ(got[i].note, want[i].note);
  }
}

}  // namespace

// ---- tag names -----------------------------------------------------------------------------------------------------

TEST(TagNames, SplitAtTheLastSlashWhenThePhaseIsKnown) {
  EXPECT_EQ(split_tag("GPT.blocks.0.attn/forward"), (std::pair<std::string, std::string>{"GPT.blocks.0.attn", "forward"}));
  EXPECT_EQ(split_tag("a/b/backward"), (std::pair<std::string, std::string>{"a/b", "backward"}));
  EXPECT_EQ(split_tag("workspace"), (std::pair<std::string, std::string>{"workspace", "other"}));
  EXPECT_EQ(split_tag("m/notaphase"), (std::pair<std::string, std::string>{"m/notaphase", "other"}));
  EXPECT_EQ(split_tag(""), (std::pair<std::string, std::string>{"", "other"}));
}

// ---- peak ----------------------------------------------------------------------------------------------------------

TEST(Timeline, PeakOfAHandBuiltTrace) {
  const TimelinePeak p = timeline_peak(hand_trace());
  EXPECT_EQ(p.event_index, 5);
  EXPECT_EQ(p.allocated, 8704);
  EXPECT_EQ(p.live_allocations, 3);

  const std::vector<OwnerBytes> owners = timeline_owners_at_peak(hand_trace());
  ASSERT_EQ(owners.size(), 3u);
  EXPECT_EQ(owners[0].owner, "A/backward");
  EXPECT_EQ(owners[0].bytes, 5120);
  EXPECT_EQ(owners[1].owner, "B/forward");
  EXPECT_EQ(owners[1].bytes, 3072);
  EXPECT_EQ(owners[2].owner, "(untagged)");
  EXPECT_EQ(owners[2].bytes, 512);
  EXPECT_EQ(owners[2].allocations, 1);
}

TEST(Timeline, PeakFollowsReplayRulesAndFallsBackToRequestedSizes) {
  // No block sizes (another tool's file): requested sizes count. Id 1 is allocated again while live (its free was
  // lost): the older 100 B go first. A free of an unknown id is ignored. Totals: 100, 300, 300, 350, 50.
  const std::vector<TraceEvent> t = {ev(TraceAction::Alloc, 1, 100, 0, ""), ev(TraceAction::Alloc, 2, 200, 0, ""),
                                     ev(TraceAction::Free, 99, 5, 0, ""), ev(TraceAction::Alloc, 1, 150, 0, ""),
                                     ev(TraceAction::Free, 2, 200, 0, "")};
  const TimelinePeak p = timeline_peak(t);
  EXPECT_EQ(p.event_index, 3);
  EXPECT_EQ(p.allocated, 350);
  EXPECT_EQ(p.live_allocations, 2);
}

TEST(Timeline, NoAllocEvents) {
  EXPECT_EQ(timeline_peak({}).event_index, -1);
  EXPECT_TRUE(timeline_owners_at_peak({}).empty());
  std::ostringstream out;
  EXPECT_THROW(write_timeline_html({ev(TraceAction::Annotate, 0, 0, 0, "")}, out), ValueError);
  TimelineOptions bad;
  bad.max_series = 0;
  EXPECT_THROW(write_timeline_html(hand_trace(), out, bad), ValueError);
}

// ---- the page ------------------------------------------------------------------------------------------------------

TimelineOptions by_owner() {
  TimelineOptions o;
  o.group = TimelineGroup::Owner;
  return o;
}

TEST(TimelineHtml, PeakMarkerBandsAndAliveRows) {
  const std::string page = page_of(hand_trace(), by_owner());
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(page.find("</html>"), std::string::npos);
  EXPECT_EQ(page.find("http://", page.find("<body>")), page.find("http://www.w3.org/2000/svg"));  // no fetches
  EXPECT_EQ(count(page, "src="), 0u);

  // The peak: 8704 B = 8.5 KiB after event #5 (the trace has no times: x is the event index).
  EXPECT_EQ(count(page, "id=\"peak-marker\""), 1u);
  EXPECT_NE(page.find("peak 8.5 KiB at event #5"), std::string::npos);

  // A band per owner at the peak, and "other owners" for A/forward (alive earlier, not at the peak).
  EXPECT_EQ(count(page, "class=\"band\""), 4u);
  EXPECT_NE(page.find("<title>A/backward: 5 KiB at the peak</title>"), std::string::npos);
  EXPECT_NE(page.find("<title>B/forward: 3 KiB at the peak</title>"), std::string::npos);
  EXPECT_NE(page.find("<title>(untagged): 512 B at the peak</title>"), std::string::npos);
  EXPECT_NE(page.find("<title>other owners</title>"), std::string::npos);
  EXPECT_EQ(count(page, "<li class=\"owner\">"), 4u);

  // Alive at the peak, largest first.
  EXPECT_EQ(count(page, "<tr class=\"alive\""), 3u);
  const size_t r3 = page.find("<tr class=\"alive\" data-id=\"3\" data-bytes=\"5120\">");
  const size_t r2 = page.find("<tr class=\"alive\" data-id=\"2\" data-bytes=\"3072\">");
  const size_t r4 = page.find("<tr class=\"alive\" data-id=\"4\" data-bytes=\"512\">");
  ASSERT_NE(r3, std::string::npos);
  ASSERT_NE(r2, std::string::npos);
  ASSERT_NE(r4, std::string::npos);
  EXPECT_LT(r3, r2);
  EXPECT_LT(r2, r4);
  EXPECT_NE(page.find("<td>A/backward</td><td>event #3</td>", r3), std::string::npos);

  // No reserved numbers were recorded: no reserved line, no OOM markers.
  EXPECT_EQ(count(page, "class=\"reserved\""), 0u);
  EXPECT_EQ(count(page, "class=\"oom-marker\""), 0u);
}

// The default bands are phases: A/forward (alive earlier) joins B/forward's band, so nothing is left for "other
// owners"; by module (depth 1) the bands are A (5 KiB at the peak) and B (3 KiB).
TEST(TimelineHtml, BandsByPhaseAndByModule) {
  const std::string by_phase = page_of(hand_trace());
  EXPECT_EQ(count(by_phase, "class=\"band\""), 3u);
  EXPECT_NE(by_phase.find("<title>backward: 5 KiB at the peak</title>"), std::string::npos);
  EXPECT_NE(by_phase.find("<title>forward: 3 KiB at the peak</title>"), std::string::npos);
  EXPECT_NE(by_phase.find("<title>(untagged): 512 B at the peak</title>"), std::string::npos);
  EXPECT_EQ(by_phase.find("<title>other owners</title>"), std::string::npos);
  EXPECT_NE(by_phase.find("bands by <b>phase</b>"), std::string::npos);
  TimelineOptions o;
  o.group = TimelineGroup::Module;
  o.group_depth = 1;
  const std::string by_module = page_of(hand_trace(), o);
  EXPECT_NE(by_module.find("<title>A: 5 KiB at the peak</title>"), std::string::npos);
  EXPECT_NE(by_module.find("<title>B: 3 KiB at the peak</title>"), std::string::npos);
  EXPECT_EQ(parse_timeline_group("module"), TimelineGroup::Module);
  EXPECT_THROW(parse_timeline_group("modules"), ValueError);
  o.group_depth = 0;
  std::ostringstream out;
  EXPECT_THROW(write_timeline_html(hand_trace(), out, o), ValueError);
}

TEST(TimelineHtml, TimeAxisOnRequest) {
  std::vector<TraceEvent> t = hand_trace();
  for (size_t i = 0; i < t.size(); ++i) t[i].time_ns = 1000 * static_cast<int64_t>(i + 1);
  EXPECT_NE(page_of(t).find(">event index</text>"), std::string::npos);
  TimelineOptions o;
  o.time_axis = true;
  const std::string page = page_of(t, o);
  EXPECT_NE(page.find(">time since the first event</text>"), std::string::npos);
  EXPECT_NE(page.find("peak 8.5 KiB at event #5 (5 us)"), std::string::npos);  // times from the first event
}

TEST(TimelineHtml, OneSeriesPutsTheRestIntoOtherOwners) {
  TimelineOptions o;
  o.max_series = 1;
  o.max_peak_rows = 1;
  const std::string page = page_of(hand_trace(), o);
  EXPECT_EQ(count(page, "class=\"band\""), 2u);
  EXPECT_EQ(count(page, "<tr class=\"alive\""), 1u);
  EXPECT_NE(page.find("2 smaller allocations not listed"), std::string::npos);
}

TEST(TimelineHtml, ReservedLineAndOomMarkers) {
  std::vector<TraceEvent> t = hand_trace();
  for (TraceEvent& e : t) e.reserved = 2 * MiB;
  TraceEvent oom = ev(TraceAction::Oom, 0, 64 * MiB, 64 * MiB, "B/forward");
  oom.reserved = 2 * MiB;
  t.insert(t.begin() + 6, oom);
  const std::string page = page_of(t);
  EXPECT_EQ(count(page, "class=\"reserved\""), 1u);
  EXPECT_EQ(count(page, "class=\"oom-marker\""), 1u);
  EXPECT_NE(page.find("OOM: 64 MiB requested at event #6"), std::string::npos);
  EXPECT_NE(page.find("out of memory (1)"), std::string::npos);
}

TEST(TimelineHtml, HostileNamesAreEscaped) {
  const std::string evil = "<script>alert('x')</script><b onmouseover=\"y\">&amp;";
  std::vector<TraceEvent> t = {ev(TraceAction::Alloc, 1, 4096, 4096, evil + "/forward")};
  TimelineOptions o;
  o.title = "</title><script>boom()</script>";
  const std::string page = page_of(t, o);
  EXPECT_EQ(count(page, "<script>"), 1u);  // the page's own
  EXPECT_EQ(page.find("alert('x')"), std::string::npos);
  EXPECT_EQ(page.find("<b onmouseover"), std::string::npos);
  EXPECT_EQ(page.find("boom()</script>"), std::string::npos);
  const std::string escaped =
      "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&lt;b onmouseover=&quot;y&quot;&gt;&amp;amp;/forward";
  EXPECT_NE(page.find(escaped), std::string::npos);
  EXPECT_NE(page.find("<title>&lt;/title&gt;&lt;script&gt;boom()&lt;/script&gt;</title>"), std::string::npos);
}

TEST(TimelineHtml, LongTraceGivesABoundedPageAndKeepsThePeak) {
  const uint64_t seed = ember::testing::test_seed();
  std::printf("LongTraceGivesABoundedPageAndKeepsThePeak seed=%llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::vector<TraceEvent> t;
  std::vector<uint64_t> live;
  uint64_t next = 1;
  int64_t allocated = 0, t_ns = 0;
  while (t.size() < 100000) {
    t_ns += 1 + static_cast<int64_t>(rng() % 1000);
    if (live.empty() || rng() % 100 < 52) {
      const int64_t bytes = 512 * (1 + static_cast<int64_t>(rng() % 4096));
      const std::string tag = "layer" + std::to_string(rng() % 40) + "/forward";
      TraceEvent e = ev(TraceAction::Alloc, next, bytes, bytes, tag, t_ns);
      allocated += bytes;
      e.allocated = allocated;
      e.reserved = allocated + 4 * MiB;
      live.push_back(next++);
      t.push_back(e);
    } else {
      const size_t k = rng() % live.size();
      std::swap(live[k], live.back());
      const uint64_t id = live.back();
      live.pop_back();
      const TraceEvent& a = *std::find_if(t.begin(), t.end(), [&](const TraceEvent& x) {
        return x.action == TraceAction::Alloc && x.id == id;
      });
      TraceEvent e = ev(TraceAction::Free, id, a.size, a.block_size, tag_name(a.tag), t_ns);
      allocated -= a.block_size;
      e.allocated = allocated;
      e.reserved = allocated + 4 * MiB;
      t.push_back(e);
    }
  }
  const TimelinePeak peak = timeline_peak(t);
  int64_t recorded_peak = 0;
  for (const TraceEvent& e : t) recorded_peak = std::max(recorded_peak, e.allocated);
  EXPECT_EQ(peak.allocated, recorded_peak);  // the walk agrees with the numbers written into the events

  const std::string page = page_of(t);
  std::printf("100000 events (%zu owners): a page of %zu bytes\n", timeline_owners_at_peak(t).size(), page.size());
  EXPECT_LT(page.size(), 1500u * 1024u);
  EXPECT_EQ(count(page, "id=\"peak-marker\""), 1u);
  // Every band has at most 2000 points (+2 on the baseline); the drawn totals keep the peak.
  const size_t band = page.find("class=\"band\"");
  const size_t pts = page.find("points=\"", band) + 8;
  EXPECT_LE(count(page.substr(pts, page.find('"', pts) - pts), ","), 2002u);
  const size_t a0 = page.find("a:[") + 3;
  std::vector<int64_t> drawn;
  std::istringstream in(page.substr(a0, page.find(']', a0) - a0));
  for (std::string v; std::getline(in, v, ',');) drawn.push_back(std::stoll(v));
  EXPECT_LE(drawn.size(), 2000u);
  EXPECT_EQ(*std::max_element(drawn.begin(), drawn.end()), peak.allocated);
}

// ---- Chrome JSON and trace files -----------------------------------------------------------------------------------

namespace {

// Tiny timed trace for slices: phases forward, forward, (annotate), backward, backward, optimizer, untagged.
std::vector<TraceEvent> slice_trace() {
  std::vector<TraceEvent> t = {
      ev(TraceAction::Alloc, 1, 100, 512, "M1/forward", 1000),
      ev(TraceAction::Alloc, 2, 100, 512, "M2/forward", 2000),
      ev(TraceAction::Annotate, 0, 0, 0, "", 2500),
      ev(TraceAction::Free, 1, 100, 512, "M1/backward", 3000),
      ev(TraceAction::Alloc, 3, 100, 512, "M2/backward", 4000),
      ev(TraceAction::Alloc, 4, 100, 512, "M1/optimizer", 5000),
      ev(TraceAction::Alloc, 5, 100, 512, "", 6000),
  };
  t[2].note = "mark";
  return t;
}

struct SliceView {
  std::string name;
  double ts, dur;
  int64_t allocs, frees;
};

std::vector<SliceView> slices(const json& doc, int tid) {
  std::vector<SliceView> out;
  for (const json& e : doc["traceEvents"])
    if (e["ph"] == "X" && e["tid"] == tid)
      out.push_back({e["name"], e["ts"], e["dur"], e["args"]["allocs"], e["args"]["frees"]});
  return out;
}

}  // namespace

TEST(ChromeTrace, PhaseAndModuleSlicesByHand) {
  std::ostringstream out;
  write_chrome_trace(slice_trace(), out, {"max_split_size_mb:64", "caching"});
  const json doc = json::parse(out.str());
  EXPECT_EQ(doc["displayTimeUnit"], "ns");
  EXPECT_EQ(doc["otherData"]["alloc_conf"], "max_split_size_mb:64");
  EXPECT_EQ(doc["otherData"]["allocator"], "caching");
  int phase_tid = -1, module_tid = -1;
  for (const json& e : doc["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      if (e["args"]["name"] == "phase") phase_tid = e["tid"];
      if (e["args"]["name"] == "module") module_tid = e["tid"];
    }
  ASSERT_GT(phase_tid, 0);
  ASSERT_GT(module_tid, 0);
  ASSERT_NE(phase_tid, module_tid);

  // Runs of consecutive alloc/free events (the annotation neither breaks nor joins them); a run ends where the next
  // starts, the last at the trace's last event. Times in microseconds.
  const std::vector<SliceView> p = slices(doc, phase_tid);
  ASSERT_EQ(p.size(), 4u);
  const SliceView want_p[] = {{"forward", 1, 2, 2, 0}, {"backward", 3, 2, 1, 1}, {"optimizer", 5, 1, 1, 0},
                              {"untagged", 6, 0, 1, 0}};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(p[i].name, want_p[i].name);
    EXPECT_DOUBLE_EQ(p[i].ts, want_p[i].ts) << i;
    EXPECT_DOUBLE_EQ(p[i].dur, want_p[i].dur) << i;
    EXPECT_EQ(p[i].allocs, want_p[i].allocs) << i;
    EXPECT_EQ(p[i].frees, want_p[i].frees) << i;
  }
  const std::vector<SliceView> m = slices(doc, module_tid);
  const std::vector<std::string> want_m = {"M1", "M2", "M1", "M2", "M1", "untagged"};
  const double want_ts[] = {1, 2, 3, 4, 5, 6}, want_dur[] = {1, 1, 1, 1, 1, 0};
  ASSERT_EQ(m.size(), want_m.size());
  for (size_t i = 0; i < m.size(); ++i) {
    EXPECT_EQ(m[i].name, want_m[i]);
    EXPECT_DOUBLE_EQ(m[i].ts, want_ts[i]);
    EXPECT_DOUBLE_EQ(m[i].dur, want_dur[i]);
  }
}

TEST(ChromeTrace, OomIsAGlobalInstant) {
  std::vector<TraceEvent> t = slice_trace();
  t.push_back(ev(TraceAction::Oom, 0, 8 * MiB, 8 * MiB, "M1/forward", 7000));
  std::ostringstream out;
  write_chrome_trace(t, out);
  const json doc = json::parse(out.str());
  int ooms = 0;
  for (const json& e : doc["traceEvents"])
    if (e["ph"] == "i" && e["name"] == "oom") {
      ++ooms;
      EXPECT_EQ(e["s"], "g");
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 7.0);
      EXPECT_EQ(e["args"]["size"], 8 * MiB);
    }
  EXPECT_EQ(ooms, 1);
}

TEST(TraceFile, ChromeAndJsonLinesRoundTrip) {
  TempDir dir;
  std::vector<TraceEvent> t = slice_trace();
  t.push_back(ev(TraceAction::Oom, 0, 8 * MiB, 8 * MiB, "M1/forward", 7000));
  TraceEvent seg = ev(TraceAction::SegmentAlloc, 0, 2 * MiB, 2 * MiB, "", 500);
  seg.addr = 0x7f0000000000ULL;
  seg.stream = 7;
  seg.allocated = 512;
  seg.reserved = 2 * MiB;
  t.insert(t.begin(), seg);
  const std::string conf = "max_split_size_mb:40,garbage_collection_threshold:0.8,capacity:64MiB";

  write_trace_file(dir.file("t.json"), t, {conf, "caching"});
  std::string got_conf = "unset";
  expect_same_events(read_trace_file(dir.file("t.json"), &got_conf), t);
  EXPECT_EQ(got_conf, conf);
  const TraceFile f = load_trace_file(dir.file("t.json"));
  EXPECT_EQ(f.format, "chrome");
  EXPECT_TRUE(f.has_options);
  EXPECT_EQ(f.options.allocator, "caching");

  write_trace_file(dir.file("t.jsonl"), t, {conf, "caching"});
  got_conf = "unset";
  expect_same_events(read_trace_file(dir.file("t.jsonl"), &got_conf), t);
  EXPECT_EQ(got_conf, "");  // JSON Lines carry no options
  EXPECT_EQ(load_trace_file(dir.file("t.jsonl")).format, "jsonl");

  // A one-line JSON Lines file is also one JSON document: still read as JSON Lines.
  const std::string one = dir.write("one.json", "{\"action\":\"alloc\",\"id\":1,\"size\":8,\"stream\":0}\n");
  ASSERT_EQ(read_trace_file(one).size(), 1u);
  EXPECT_EQ(read_trace_file(one)[0].size, 8);
  // Empty files are empty traces.
  EXPECT_TRUE(read_trace_file(dir.write("empty.jsonl", "\n\n")).empty());
}

TEST(TraceFile, MalformedFilesRaiseFormatErrorNamingTheFile) {
  TempDir dir;
  std::ostringstream good;
  write_chrome_trace(slice_trace(), good, {"", "caching"});
  const std::string cases[][2] = {
      {"garbage.json", "this is not a trace\n"},
      {"array.json", "[1,2,3]\n"},
      {"brace.json", "{garbage\n"},
      {"other_tool.json", "{\"traceEvents\":[]}\n"},
      {"bad_event.json", "{\"traceEvents\":[],\"emberEvents\":[{\"action\":\"alloc\"}]}"},
      {"bad_events.json", "{\"traceEvents\":[],\"emberEvents\":{}}"},
      {"bad_conf.json",
       "{\"traceEvents\":[],\"emberEvents\":[],\"otherData\":{\"alloc_conf\":\"max_split_size_mb:5\"}}"},
      {"bad_other.json", "{\"traceEvents\":[],\"emberEvents\":[],\"otherData\":{\"allocator\":7}}"},
      {"cut.json", good.str().substr(0, good.str().size() / 2)},
      {"bad_line.jsonl", "{\"action\":\"alloc\",\"id\":1,\"size\":8,\"stream\":0}\n{\"action\":\"alloc\",\"id\":-1}\n"},
      {"negative.json", "{\"emberEvents\":[{\"action\":\"alloc\",\"id\":1,\"size\":-8,\"stream\":0}]}"},
  };
  for (const auto& c : cases) {
    const std::string path = dir.write(c[0], c[1]);
    try {
      read_trace_file(path);
      ADD_FAILURE() << "no FormatError for " << c[0];
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
  // Where the problem is.
  try {
    read_trace_file(dir.file("bad_event.json"));
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("emberEvents[0]: missing required key \"id\""), std::string::npos)
        << e.what();
  }
  try {
    read_trace_file(dir.file("bad_line.jsonl"));
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("line 2:"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_trace_file(dir.file("missing.json")), ValueError);
  EXPECT_THROW(read_trace_file(dir.file("")), ValueError);  // the directory itself
  EXPECT_THROW(write_trace_file(dir.file("no/such/dir/t.json"), slice_trace()), ValueError);
}

// ---- replay exactness ----------------------------------------------------------------------------------------------
// Invariant: a trace recorded by a fresh allocator under a configuration, written with that configuration and read
// back, replays under the recorded configuration to the recording allocator's own peaks and OOM count.

namespace {

constexpr int64_t kDevice = 1024 * MiB;

struct Recorded {
  std::vector<TraceEvent> events;
  DeviceStats stats;
  int64_t ooms = 0;
  int64_t segment_frees = 0;
  std::string conf;
};

// An address-only device whose addresses run the other way: each range [p, p + n) of a simulated device is handed
// out as [K - p - n, K - p) (an involution, so frees and page maps go back through the same formula). Segments thus
// come at decreasing addresses, as host mmap gives them, where the simulated device (and so every replay) gives
// increasing ones.
class MirroredBacking final : public caching_test::ForwardingBacking {
 public:
  explicit MirroredBacking(int64_t capacity)
      : ForwardingBacking(make_simulated_backing(capacity, /*materialize=*/false)) {}
  std::string name() const override { return "mirrored " + ForwardingBacking::name(); }

 private:
  void* translate(void* p, int64_t n) const override {
    if (p == nullptr) return nullptr;
    constexpr uint64_t kTop = uint64_t{1} << 60;  // a multiple of every page and alignment
    return reinterpret_cast<void*>(kTop - reinterpret_cast<uint64_t>(p) - static_cast<uint64_t>(n));
  }
};

// A training-like workload: parameters, then steps of forward activations (mixed sizes, some above max_split_size),
// a backward pass that frees them out of order while gradients appear, optimizer state on the first step and
// temporaries freed in random order.
Recorded record(const std::string& conf, uint64_t seed, bool mirrored = false) {
  CachingAllocator a(mirrored ? std::unique_ptr<Backing>(std::make_unique<MirroredBacking>(kDevice))
                              : std::unique_ptr<Backing>(make_simulated_backing(kDevice, /*materialize=*/false)),
                     parse_alloc_config(conf));
  a.enable_trace(1 << 20);
  std::mt19937_64 rng(seed);
  Recorded r;
  auto alloc = [&](int64_t bytes, const std::string& tag) -> void* {
    TagScope scope(tag);
    try {
      return a.allocate(bytes);
    } catch (const OutOfMemoryError&) {
      ++r.ooms;
      return nullptr;
    }
  };
  auto release = [&](void* p) {
    if (p) a.deallocate(p);
  };
  const int64_t sizes[] = {700, 4 * KiB + 3, 64 * KiB, 700 * KiB, MiB + 3, 3 * MiB, 6 * MiB + 100, 12 * MiB,
                           25 * MiB, 45 * MiB + 512};
  auto pick = [&]() { return sizes[rng() % std::size(sizes)] + static_cast<int64_t>(rng() % 3) * 4096; };
  std::vector<void*> params, grads, state;
  for (int i = 0; i < 12; ++i) params.push_back(alloc(pick() / 2 + 1, "model.layer" + std::to_string(i) + "/other"));
  for (int step = 0; step < 6; ++step) {
    a.annotate("step " + std::to_string(step));
    std::vector<void*> acts;
    for (int l = 0; l < 12; ++l)
      for (int k = 0; k < 2; ++k) acts.push_back(alloc(pick(), "model.layer" + std::to_string(l) + "/forward"));
    for (int l = 11; l >= 0; --l) {
      std::vector<void*> temps;
      for (int k = 0; k < 2; ++k) temps.push_back(alloc(pick(), "model.layer" + std::to_string(l) + "/backward"));
      for (int k = 0; k < 2 && !acts.empty(); ++k) {  // free a few activations, out of order
        const size_t j = rng() % acts.size();
        release(acts[j]);
        acts.erase(acts.begin() + static_cast<std::ptrdiff_t>(j));
      }
      if (step == 0) grads.push_back(alloc(pick() / 2 + 1, "model.layer" + std::to_string(l) + "/backward"));
      std::shuffle(temps.begin(), temps.end(), rng);
      for (void* p : temps) release(p);
    }
    for (void* p : acts) release(p);
    if (step == 0)
      for (int i = 0; i < 12; ++i) state.push_back(alloc(pick() / 2 + 1, "optimizer/optimizer"));
    void* ws = alloc(pick(), "workspace");
    release(ws);
  }
  for (void* p : params) release(p);
  for (void* p : grads) release(p);
  for (void* p : state) release(p);
  r.events = a.trace();
  EXPECT_EQ(a.trace_dropped(), 0u);
  r.stats = a.device_stats();
  for (const TraceEvent& e : r.events) r.segment_frees += e.action == TraceAction::SegmentFree;
  r.conf = a.config().str();
  return r;
}

void expect_exact_replay(const std::string& conf, bool mirrored = false) {
  const uint64_t seed = ember::testing::test_seed();
  std::printf("replay exactness \"%s\"%s seed=%llu\n", conf.c_str(), mirrored ? " (decreasing addresses)" : "",
              static_cast<unsigned long long>(seed));
  const Recorded rec = record(conf, seed, mirrored);
  ASSERT_EQ(rec.ooms, 0) << "the workload must fit: replay does not see requests that failed";
  std::printf("  %zu events, peak reserved %lld, %lld segments freed\n", rec.events.size(),
              static_cast<long long>(rec.stats.reserved_bytes[kAggregatePool].peak),
              static_cast<long long>(rec.segment_frees));
  EXPECT_EQ(parse_alloc_config(rec.conf).str(), parse_alloc_config(conf).str());
  TempDir dir;
  write_trace_file(dir.file("run.json"), rec.events, {rec.conf, "caching"});
  std::string read_conf;
  const std::vector<TraceEvent> events = read_trace_file(dir.file("run.json"), &read_conf);
  ASSERT_EQ(events.size(), rec.events.size());
  EXPECT_EQ(read_conf, rec.conf);

  const ReplayResult r = replay_trace(events, parse_alloc_config(read_conf));
  EXPECT_EQ(r.peak_reserved, rec.stats.reserved_bytes[kAggregatePool].peak) << conf;
  EXPECT_EQ(r.peak_allocated, rec.stats.allocated_bytes[kAggregatePool].peak) << conf;
  EXPECT_EQ(r.peak_requested, rec.stats.requested_bytes[kAggregatePool].peak) << conf;
  EXPECT_EQ(r.num_device_allocs, rec.stats.num_device_alloc) << conf;
  EXPECT_EQ(r.num_ooms, rec.ooms) << conf;
  // The timeline's peak is the recorded one: its walk of the file agrees with the allocator's counters.
  EXPECT_EQ(timeline_peak(events).allocated, rec.stats.allocated_bytes[kAggregatePool].peak);
  // The configuration acted during the recording (so its replay is a real test of it).
  int64_t maps = 0, rounded_up = 0;
  for (const TraceEvent& e : events) {
    maps += e.action == TraceAction::SegmentMap;
    rounded_up += e.action == TraceAction::Alloc && e.block_size > (e.size + 511) / 512 * 512;
  }
  if (conf.find("garbage_collection_threshold") != std::string::npos) {
    EXPECT_GT(rec.segment_frees, 0);
  }
  if (conf.find("expandable_segments:True") != std::string::npos) {
    EXPECT_GT(maps, 0);
  }
  if (conf.find("roundup_power2_divisions") != std::string::npos) {
    EXPECT_GT(rounded_up, 0);
  }
}

}  // namespace

TEST(ReplayExactness, MaxSplitSizeAndGarbageCollection) {
  expect_exact_replay("max_split_size_mb:40,garbage_collection_threshold:0.5,capacity:768MiB");
}

TEST(ReplayExactness, RoundupDivisions) { expect_exact_replay("roundup_power2_divisions:4"); }

TEST(ReplayExactness, ExpandableSegments) { expect_exact_replay("expandable_segments:True"); }

// Note [Address-free tie-break], by hand. Two free 30 MiB blocks tie for a 30 MiB request: the rest of a 40 MiB
// segment (the first made) after a 10 MiB block, and a whole 30 MiB segment. The older segment's block is taken, so
// freeing the 10 MiB block leaves no 40 MiB piece and the last request maps a third segment: 110 MiB reserved,
// whichever way the device's addresses run. (Broken by address, decreasing addresses took the 30 MiB segment, the
// 40 MiB one merged whole, and the run reserved 70 MiB while its replay reserved 110.)
TEST(ReplayExactness, TiesGoToTheOlderSegmentWhateverTheAddresses) {
  for (const bool mirrored : {false, true}) {
    CachingAllocator a(mirrored ? std::unique_ptr<Backing>(std::make_unique<MirroredBacking>(kDevice))
                                : std::unique_ptr<Backing>(make_simulated_backing(kDevice, /*materialize=*/false)));
    a.enable_trace(1024);
    void* first = a.allocate(40 * MiB);
    void* second = a.allocate(30 * MiB);
    a.deallocate(first);
    void* small = a.allocate(10 * MiB);  // split from the 40 MiB block: [10 used][30 free]
    a.deallocate(second);                 // a whole 30 MiB segment, free
    void* tie = a.allocate(30 * MiB);
    a.deallocate(small);
    void* big = a.allocate(40 * MiB);
    EXPECT_EQ(a.device_stats().reserved_bytes[kAggregatePool].peak, 110 * MiB) << "mirrored " << mirrored;
    EXPECT_EQ(replay_trace(a.trace(), a.config()).peak_reserved, 110 * MiB) << "mirrored " << mirrored;
    a.deallocate(tie);
    a.deallocate(big);
  }
}

// The same over a training-like workload: a recording whose device hands out segments at decreasing addresses (host
// mmap) replays exactly on the simulated device, whose addresses increase.
TEST(ReplayExactness, DecreasingSegmentAddresses) {
  expect_exact_replay("", /*mirrored=*/true);
  expect_exact_replay("max_split_size_mb:40,garbage_collection_threshold:0.5,capacity:768MiB", /*mirrored=*/true);
  expect_exact_replay("expandable_segments:True", /*mirrored=*/true);
}

// ---- bytes from before the trace, equal large times, the "other owners" count -------------------------------------

namespace {

// Writes the page for two events at the same time past 2^53 ns with time_axis and exits 0 once it is written (SIGALRM
// ends the child after 5 s otherwise): with equal times the x span is 0 and the axis falls back to the event index.
[[noreturn]] void write_page_with_equal_large_times() {
  alarm(5);
  const int64_t t = int64_t{1} << 60;
  const std::vector<TraceEvent> events = {ev(TraceAction::Alloc, 1, 512, 512, "", t),
                                          ev(TraceAction::Free, 1, 512, 512, "", t)};
  TimelineOptions o;
  o.time_axis = true;
  std::ostringstream page;
  write_timeline_html(events, page, o);
  const std::string text = page.str();
  std::_Exit(text.find("</html>") != std::string::npos && text.find("event index") != std::string::npos ? 0 : 1);
}

}  // namespace

// A ring that dropped its oldest events misses an allocation that is still live. By hand: 10 MiB live all along plus
// 1 MiB transients: the recorded allocated bytes peak at 11 MiB, of which 10 MiB come from before the trace's window.
TEST(Timeline, PeakCountsBytesLiveBeforeTheTraceWindow) {
  CachingAllocator a(make_simulated_backing(int64_t{16} << 30, /*materialize=*/false));
  a.enable_trace(8);
  void* held = a.allocate(10 * MiB);
  for (int i = 0; i < 8; ++i) a.deallocate(a.allocate(MiB));
  const std::vector<TraceEvent> events = a.trace();
  ASSERT_GT(a.trace_dropped(), 0u);
  const TimelinePeak peak = timeline_peak(events);
  EXPECT_EQ(peak.allocated, 11 * MiB);
  EXPECT_EQ(peak.live_allocations, 1);  // the traced 1 MiB block
  std::ostringstream page;
  write_timeline_html(events, page);
  const std::string text = page.str();
  EXPECT_NE(text.find("(before the trace)"), std::string::npos);
  EXPECT_NE(text.find("10 MiB of the peak were allocated before the trace"), std::string::npos);
  EXPECT_NE(text.find("peak allocated <b>11 MiB</b>"), std::string::npos);
  // The owners at the peak add up to it: the 10 MiB are one owner, "(before the trace)", first.
  const std::vector<OwnerBytes> owners = timeline_owners_at_peak(events);
  ASSERT_EQ(owners.size(), 2u);
  EXPECT_EQ(owners[0].owner, "(before the trace)");
  EXPECT_EQ(owners[0].bytes, 10 * MiB);
  EXPECT_EQ(owners[0].allocations, 0);
  EXPECT_EQ(owners[1].bytes, MiB);
  a.deallocate(held);

  // Without recorded bytes (a file from another tool) the page is the walk alone: no band, the walked peak.
  std::vector<TraceEvent> bare = events;
  for (TraceEvent& e : bare) e.allocated = 0;
  EXPECT_EQ(timeline_peak(bare).allocated, MiB);
  EXPECT_EQ(timeline_owners_at_peak(bare).size(), 1u);
  std::ostringstream bare_page;
  write_timeline_html(bare, bare_page);
  EXPECT_EQ(bare_page.str().find("(before the trace)"), std::string::npos);
}

TEST(Timeline, TimeAxisWithEqualLargeTimesTerminates) {
  EXPECT_EXIT(write_page_with_equal_large_times(), ::testing::ExitedWithCode(0), "");
}

// Times past 2^53 that differ by a few nanoseconds are told apart (the span is taken in int64 from the first event).
TEST(Timeline, TimeAxisWithCloseLargeTimes) {
  const int64_t t = (int64_t{1} << 60) + 1;
  const std::vector<TraceEvent> events = {ev(TraceAction::Alloc, 1, 512, 512, "", t),
                                          ev(TraceAction::Free, 1, 512, 512, "", t + 8)};
  TimelineOptions o;
  o.time_axis = true;
  std::ostringstream page;
  write_timeline_html(events, page, o);
  EXPECT_NE(page.str().find("time since the first event"), std::string::npos);
  EXPECT_NE(page.str().find(">8 ns<"), std::string::npos);  // the last tick: 8 ns after the first event
}

// "other owners (N)" counts the groups summed into the band, not their owner tags. By hand: bands by phase, one named
// band (forward, 3 MiB at the peak); backward (2 tags) and optimizer (1 tag) are 2 groups.
TEST(Timeline, OtherOwnersCountsGroups) {
  const std::vector<TraceEvent> events = {
      ev(TraceAction::Alloc, 1, 3 * MiB, 3 * MiB, "M.a/forward"), ev(TraceAction::Alloc, 2, MiB, MiB, "M.a/backward"),
      ev(TraceAction::Alloc, 3, MiB, MiB, "M.b/backward"), ev(TraceAction::Alloc, 4, 512, 512, "/optimizer")};
  TimelineOptions o;
  o.group = TimelineGroup::Phase;
  o.max_series = 1;
  std::ostringstream page;
  write_timeline_html(events, page, o);
  const std::string text = page.str();
  const size_t at = text.find("other owners (");
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(text.substr(at, 16), "other owners (2)");
}
