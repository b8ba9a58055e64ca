// Memory attribution in the memory layer: tags built from module and phase scopes (thread-local, cached, overridden
// by a raw TagScope), split_tag, and the caching allocator's per-tag bytes — current, own peak, at the aggregate peak
// and allocation counts — checked against values worked out by hand, through pending frees and reset_peak_stats.
#include <gtest/gtest.h>

#include <thread>

#include "ember/ember.h"
#include "ember/memory/memory_report.h"
#include "tests/memory/caching_test_util.h"

namespace {

using namespace ember::memory;
using caching_test::make_allocator;

// The stat of `tag` (all zero when the allocator never saw it).
TagStat stat_of(const CachingAllocator& a, TagId tag) {
  for (const TagStat& s : a.tag_stats())
    if (s.tag == tag) return s;
  TagStat none;
  none.tag = tag;
  return none;
}

TEST(Tags, PhaseNamesAndSplit) {
  EXPECT_STREQ(phase_name(Phase::Forward), "forward");
  EXPECT_STREQ(phase_name(Phase::Backward), "backward");
  EXPECT_STREQ(phase_name(Phase::Optimizer), "optimizer");
  EXPECT_STREQ(phase_name(Phase::Data), "data");
  EXPECT_STREQ(phase_name(Phase::Workspace), "workspace");
  EXPECT_STREQ(phase_name(Phase::Other), "other");
  using P = std::pair<std::string, std::string>;
  EXPECT_EQ(split_tag(""), P("", "other"));
  EXPECT_EQ(split_tag("GPT.blocks.0.attn/forward"), P("GPT.blocks.0.attn", "forward"));
  EXPECT_EQ(split_tag("/optimizer"), P("", "optimizer"));
  EXPECT_EQ(split_tag("a/b/backward"), P("a/b", "backward"));
  EXPECT_EQ(split_tag("optimizer \"adam\"/state"), P("optimizer \"adam\"/state", "other"));  // not a phase
  EXPECT_EQ(split_tag("plain"), P("plain", "other"));
}

TEST(Tags, ScopesComposeAndRestore) {
  EXPECT_EQ(current_tag(), kUntagged);  // module "" and phase Other
  EXPECT_EQ(current_phase(), Phase::Other);
  {
    ModuleScope m("TagsTest.M");
    EXPECT_EQ(current_phase(), Phase::Forward);  // a module scope from Other starts the forward phase
    EXPECT_EQ(module_path(current_module()), "TagsTest.M");
    EXPECT_EQ(tag_name(current_tag()), "TagsTest.M/forward");
    {
      PhaseScope p(Phase::Workspace);
      EXPECT_EQ(tag_name(current_tag()), "TagsTest.M/workspace");
      {
        ModuleScope inner("TagsTest.M.sub");  // keeps a phase that is not Other
        EXPECT_EQ(tag_name(current_tag()), "TagsTest.M.sub/workspace");
        {
          TagScope raw("raw tag");  // overrides module and phase until it exits
          EXPECT_EQ(tag_name(current_tag()), "raw tag");
          ModuleScope ignored("TagsTest.ignored");
          EXPECT_EQ(tag_name(current_tag()), "raw tag");
        }
        EXPECT_EQ(tag_name(current_tag()), "TagsTest.M.sub/workspace");
      }
      EXPECT_EQ(tag_name(current_tag()), "TagsTest.M/workspace");
    }
    EXPECT_EQ(tag_name(current_tag()), "TagsTest.M/forward");
  }
  EXPECT_EQ(current_tag(), kUntagged);
  EXPECT_EQ(current_module(), nullptr);
  {
    PhaseScope p(Phase::Optimizer);  // no module: the owner is "/optimizer"
    EXPECT_EQ(tag_name(current_tag()), "/optimizer");
  }
  {
    TagScope raw(kUntagged);
    ModuleScope m("TagsTest.M");
    EXPECT_EQ(current_tag(), kUntagged);
  }
  EXPECT_EQ(intern_module("TagsTest.M"), intern_module(std::string("TagsTest.") + "M"));  // one handle per path
  EXPECT_EQ(intern_module(""), nullptr);
}

TEST(Tags, ScopesAreThreadLocal) {
  ModuleScope m("TagsTest.main");
  TagId seen = 12345;
  std::thread worker([&] { seen = current_tag(); });
  worker.join();
  EXPECT_EQ(seen, kUntagged);
  std::thread worker2([&] {
    PhaseScope p(Phase::Data);
    seen = current_tag();
  });
  worker2.join();
  EXPECT_EQ(tag_name(seen), "/data");
  EXPECT_EQ(tag_name(current_tag()), "TagsTest.main/forward");
}

TEST(TagStats, SmallTensorUnderAModuleIsOneBlock) {
  CachingAllocator& cpu = cpu_allocator();
  const TagId tag = intern_tag("M/forward");
  const TagStat before = stat_of(cpu, tag);
  {
    ember::Tensor t;
    {
      ModuleScope m("M");
      t = ember::empty({2, 3}, ember::TensorOptions(ember::DType::f32, ember::Device::cpu()));  // 24 bytes
    }
    const TagStat now = stat_of(cpu, tag);
    EXPECT_EQ(now.current - before.current, 512);  // exactly one minimum-size block
    EXPECT_EQ(now.num_allocs - before.num_allocs, 1);
    cpu.check_invariants();
  }
  EXPECT_EQ(stat_of(cpu, tag).current, before.current);  // freed: back to what it held (0)
  EXPECT_EQ(stat_of(cpu, tag).current, 0);
  cpu.check_invariants();
}

TEST(TagStats, PeaksAndAtPeakByHand) {
  auto alloc = make_allocator(64 * caching_test::MiB);
  CachingAllocator& a = *alloc;
  const TagId A = intern_tag("TagStatsTest.A/forward"), B = intern_tag("TagStatsTest.B/backward");
  auto under = [&](TagId tag, int64_t n) {
    TagScope s(tag);
    return a.allocate(n);
  };
  auto expect = [&](TagId tag, int64_t current, int64_t peak, int64_t at_peak, int64_t num_allocs) {
    const TagStat s = stat_of(a, tag);
    EXPECT_EQ(s.current, current) << tag_name(tag);
    EXPECT_EQ(s.peak, peak) << tag_name(tag);
    EXPECT_EQ(s.at_peak, at_peak) << tag_name(tag);
    EXPECT_EQ(s.num_allocs, num_allocs) << tag_name(tag);
  };
  void* a1 = under(A, 1000);  // 1024-byte block: aggregate 1024 (a new peak)
  expect(A, 1024, 1024, 1024, 1);
  void* b1 = under(B, 3000);  // 3072: aggregate 4096 (a new peak)
  expect(A, 1024, 1024, 1024, 1);
  expect(B, 3072, 3072, 3072, 1);
  a.deallocate(a1);  // aggregate 3072: the peak (4096) and the bytes at it stay
  expect(A, 0, 1024, 1024, 1);
  void* a2 = under(A, 512);  // aggregate 3584 < 4096
  expect(A, 512, 1024, 1024, 2);
  a.check_invariants();
  void* b2 = under(B, 1024);  // aggregate 4608: a new peak, reached with A = 512 and B = 4096
  expect(A, 512, 1024, 512, 2);
  expect(B, 4096, 4096, 4096, 2);
  a.deallocate(b1);  // aggregate 1536
  expect(B, 1024, 4096, 4096, 2);
  AllocatorStats totals;
  const std::vector<TagStat> all = a.tag_stats(&totals);
  EXPECT_EQ(totals.allocated_bytes, 1536);
  EXPECT_EQ(totals.peak_allocated_bytes, 4608);
  int64_t sum_current = 0, sum_at_peak = 0;
  for (const TagStat& s : all) {
    sum_current += s.current;
    sum_at_peak += s.at_peak;
  }
  EXPECT_EQ(sum_current, 1536);
  EXPECT_EQ(sum_at_peak, 4608);
  a.check_invariants();

  a.reset_peak_stats();  // peaks and at-peak bytes become the current ones
  expect(A, 512, 512, 512, 2);
  expect(B, 1024, 1024, 1024, 2);
  a.deallocate(a2);  // aggregate 1024 < 1536
  void* b3 = under(B, 256);  // 512-byte block: aggregate 1536 — equal to the peak, not above it
  expect(A, 0, 512, 512, 2);
  expect(B, 1536, 1536, 1024, 3);
  void* a3 = under(A, 600);  // 1024: aggregate 2560, a new peak with A = 1024, B = 1536
  expect(A, 1024, 1024, 1024, 3);
  expect(B, 1536, 1536, 1536, 3);
  a.check_invariants();
  for (void* p : {b2, b3, a3}) a.deallocate(p);
  expect(A, 0, 1024, 1024, 3);
  expect(B, 0, 1536, 1536, 3);
  a.check_invariants();
}

// Retag moves a live allocation's bytes to another owner: current and the new owner's peak change, the bytes at the
// peak stay as they were, the trace records it, and a pointer that is not live is refused.
TEST(TagStats, RetagMovesLiveBytesBetweenOwners) {
  auto alloc = make_allocator(64 * caching_test::MiB);
  CachingAllocator& a = *alloc;
  a.enable_trace(64);
  const TagId A = intern_tag("RetagTest.A/other"), B = intern_tag("RetagTest.B/parameters");
  void* p = nullptr;
  {
    TagScope s(A);
    p = a.allocate(1000);  // a 1024-byte block, the peak
  }
  a.retag(p, B);
  const TagStat sa = stat_of(a, A), sb = stat_of(a, B);
  EXPECT_EQ(sa.current, 0);
  EXPECT_EQ(sa.at_peak, 1024);  // the peak was reached while A held the bytes
  EXPECT_EQ(sb.current, 1024);
  EXPECT_EQ(sb.peak, 1024);
  EXPECT_EQ(sb.at_peak, 0);
  EXPECT_EQ(sb.num_allocs, 0);
  a.check_invariants();
  const std::vector<TraceEvent> events = a.trace();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().action, TraceAction::Retag);
  EXPECT_EQ(events.back().tag, B);
  int dummy = 0;
  EXPECT_THROW(a.retag(&dummy, B), ember::ValueError);
  a.deallocate(p);  // the free leaves the new owner
  EXPECT_EQ(stat_of(a, B).current, 0);
  EXPECT_EQ(stat_of(a, A).current, 0);
  a.check_invariants();
}

TEST(TagStats, PendingFreeLeavesTheTagWithAllocatedBytes) {
  auto alloc = make_allocator(64 * caching_test::MiB);
  CachingAllocator& a = *alloc;
  const TagId C = intern_tag("TagStatsTest.C/forward");
  void* p;
  {
    TagScope s(C);
    p = a.allocate(2048, /*stream=*/0);
  }
  a.record_stream(p, /*stream=*/7);
  a.deallocate(p);  // pending on stream 7's event: not allocated any more, the block not reusable yet
  EXPECT_EQ(a.stats().allocated_bytes, 0);
  EXPECT_EQ(stat_of(a, C).current, 0);
  EXPECT_EQ(stat_of(a, C).at_peak, 2048);
  a.check_invariants();
  a.empty_cache();  // completes the event
  EXPECT_EQ(stat_of(a, C).current, 0);
  a.check_invariants();
}

TEST(MemoryReport, PrivateAllocatorTotalsAndJson) {
  auto alloc = make_allocator(64 * caching_test::MiB);
  CachingAllocator& a = *alloc;
  void *p1, *p2, *p3;
  {
    ModuleScope m("ReportTest");
    p1 = a.allocate(4096);
    ModuleScope c("ReportTest.child");
    p2 = a.allocate(1000);
    PhaseScope w(Phase::Workspace);
    p3 = a.allocate(100);
  }
  a.deallocate(p3);
  const MemoryAttribution at = memory_attribution(a);
  EXPECT_EQ(at.current_bytes, 4096 + 1024);
  EXPECT_EQ(at.peak_bytes, 4096 + 1024 + 512);
  ASSERT_EQ(at.owners.size(), 3u);
  EXPECT_EQ(at.owners[0].module, "ReportTest");  // largest at peak first
  EXPECT_EQ(at.owners[0].phase, "forward");
  EXPECT_EQ(at.owners[2].module, "ReportTest.child");
  EXPECT_EQ(at.owners[2].phase, "workspace");
  EXPECT_EQ(at.owners[2].current_bytes, 0);
  EXPECT_EQ(at.owners[2].at_peak_bytes, 512);
  const std::string text = memory_report(a);
  EXPECT_NE(text.find("ReportTest"), std::string::npos) << text;
  EXPECT_NE(text.find("child"), std::string::npos) << text;
  EXPECT_NE(text.find("TOTAL"), std::string::npos) << text;
  EXPECT_NE(text.find(format_bytes(4096 + 1024 + 512)), std::string::npos) << text;
  a.deallocate(p1);
  a.deallocate(p2);
}

}  // namespace
