// Caching allocator acceptance: randomised invariant runs (>= 1e6 alloc/free operations over address-only and
// materialised simulated devices, seed printed) checked against an independent recount from snapshot(), and
// deterministic tests with hand-computed expectations for every PyTorch rule in DESIGN.md's reference numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ember/base/error.h"
#include "ember/memory/caching_allocator.h"
#include "tests/harness/op_harness.h"
#include "tests/memory/caching_test_util.h"

using namespace ember;
using namespace ember::memory;
using namespace caching_test;

namespace {

struct LiveInfo {
  int64_t requested = 0;
  StreamId stream = 0;
};

struct Recount {
  int64_t segments = 0, reserved = 0, allocations = 0, allocated = 0, requested = 0, active = 0, active_bytes = 0,
          inactive_split = 0, inactive_split_bytes = 0;
};

// Independent verification of the allocator's state from its snapshot (never from check_invariants):
// segments disjoint, blocks tile each segment exactly, no two adjacent free blocks, live allocations are exactly
// the caller's, statistics equal a recount, the backing's usage equals the reserved bytes. Returns "" when all hold.
struct Verifier {
  const std::unordered_map<void*, LiveInfo>* live = nullptr;    // the caller's live allocations (optional)
  const std::unordered_set<uint64_t>* may_be_pending = nullptr;   // addresses allowed to be pending (optional)
  const std::unordered_set<uint64_t>* must_be_pending = nullptr;  // addresses that must still be pending (optional)
  bool after_empty_cache = false;

  std::string operator()(CachingAllocator& a) const {
    std::ostringstream err;
    const std::vector<SegmentSnapshot> snap = a.snapshot();
    const DeviceStats st = a.device_stats();
    const AllocatorConfig cfg = a.config();
    const int64_t page = a.backing().page_size();
    Recount rc[kNumStatPools];
    int64_t fixed_split_bytes = 0;  // free split bytes of fixed segments
    int64_t oversize_allocs = 0, oversize_segs = 0, fixed_segments = 0, largest_free = 0,
            largest_fixed_free = 0;
    std::unordered_map<uint64_t, const BlockSnapshot*> live_blocks;
    uint64_t prev_end = 0;
    for (const SegmentSnapshot& s : snap) {
      if (s.addr < prev_end) return err << "segment at " << s.addr << " overlaps the previous one", err.str();
      prev_end = s.addr + static_cast<uint64_t>(s.size);
      if (s.blocks.empty()) return err << "segment at " << s.addr << " has no blocks", err.str();
      if (s.size <= 0) return err << "segment at " << s.addr << " has size " << s.size, err.str();
      if (s.addr % 512 != 0) return err << "segment at " << s.addr << " is not 512-byte aligned", err.str();
      if (s.expandable) {
        if (s.size % page != 0) return err << "expandable segment size " << s.size << " is not whole pages", err.str();
        if (s.mapped % page != 0 || s.mapped > s.size)
          return err << "expandable segment maps " << s.mapped << " of " << s.size << " bytes", err.str();
      } else {
        if (s.mapped != s.size) return err << "fixed segment maps " << s.mapped << " of " << s.size, err.str();
        ++fixed_segments;
        const bool ok_size = s.small_pool ? s.size == kSmallBuffer
                                          : (s.size == kLargeBuffer || (s.size % kRoundLarge == 0 && s.size >= 10 * MiB));
        if (!ok_size) return err << "segment size " << s.size << " is not a PyTorch segment size", err.str();
      }
      const int pools[2] = {int(kAggregatePool), s.small_pool ? int(kSmallPool) : int(kLargePool)};
      for (int p : pools) {
        ++rc[p].segments;
        rc[p].reserved += s.mapped;
      }
      if (s.mapped >= cfg.max_split_size) ++oversize_segs;
      uint64_t expect = s.addr;
      bool prev_free = false;
      const bool split = s.blocks.size() > 1;
      int64_t last_alloc_end = 0;
      for (const BlockSnapshot& b : s.blocks) {
        if (b.addr != expect)
          return err << "segment at " << s.addr << ": block at " << b.addr << " expected at " << expect
                     << " (gap or overlap)", err.str();
        if (b.size <= 0) return err << "block at " << b.addr << " has size " << b.size, err.str();
        if (b.size % 512 != 0) return err << "block at " << b.addr << " size " << b.size << " not x512", err.str();
        if (b.stream != s.stream) return err << "block at " << b.addr << " on another stream than its segment", err.str();
        expect += static_cast<uint64_t>(b.size);
        const bool is_free = !b.allocated;
        if (is_free && prev_free) return err << "two adjacent free blocks ending at " << b.addr + b.size, err.str();
        prev_free = is_free;
        if (b.pending_events && !b.allocated) return err << "free block marked pending at " << b.addr, err.str();
        if (is_free) {
          largest_free = std::max(largest_free, b.size);
          // A free block of an expandable segment counts only its mapped pages, which the snapshot does not list:
          // the metric lies between the largest fixed-segment free block and the largest free block.
          if (!s.expandable) largest_fixed_free = std::max(largest_fixed_free, b.size);
          if (split) {
            for (int p : pools) {
              ++rc[p].inactive_split;
              rc[p].inactive_split_bytes += b.size;
            }
            if (!s.expandable) fixed_split_bytes += b.size;  // wholly mapped
          }
          continue;
        }
        last_alloc_end = static_cast<int64_t>(b.addr - s.addr) + b.size;
        for (int p : pools) {
          ++rc[p].active;
          rc[p].active_bytes += b.size;
        }
        if (b.pending_events) {
          if (may_be_pending && !may_be_pending->count(b.addr))
            return err << "block at " << b.addr << " is pending although its streams' events were processed", err.str();
          continue;
        }
        if (b.requested <= 0 || b.requested > b.size || b.size < round_up(b.requested, 512))
          return err << "live block at " << b.addr << ": size " << b.size << " for request " << b.requested, err.str();
        if (s.small_pool != (b.requested <= kSmallSize))
          return err << "request of " << b.requested << " bytes in the wrong pool", err.str();
        if (b.size >= cfg.max_split_size) ++oversize_allocs;
        live_blocks.emplace(b.addr, &b);
        for (int p : pools) {
          ++rc[p].allocations;
          rc[p].allocated += b.size;
          rc[p].requested += b.requested;
        }
      }
      if (expect != s.addr + static_cast<uint64_t>(s.size))
        return err << "blocks of the segment at " << s.addr << " cover " << expect - s.addr << " of " << s.size
                   << " bytes", err.str();
      if (after_empty_cache) {
        if (last_alloc_end == 0) return err << "empty_cache left a segment without live blocks at " << s.addr, err.str();
        if (s.expandable && s.size != round_up(last_alloc_end, page))
          return err << "empty_cache left a free tail: segment of " << s.size << " bytes, last live byte at "
                     << last_alloc_end, err.str();
        if (s.expandable) {  // every page wholly inside a free block is unmapped: only pages under live blocks stay
          int64_t need = 0;
          int64_t last_page = -1;
          for (const BlockSnapshot& b : s.blocks) {
            if (!b.allocated) continue;
            const int64_t p0 = static_cast<int64_t>(b.addr - s.addr) / page;
            const int64_t p1 = (static_cast<int64_t>(b.addr - s.addr) + b.size - 1) / page;
            need += (p1 - std::max(p0, last_page + 1) + 1) * page;
            last_page = p1;
          }
          if (s.mapped != need)
            return err << "empty_cache left free pages mapped: " << s.mapped << " bytes mapped, live blocks cover "
                       << need, err.str();
        }
      }
    }
    if (must_be_pending != nullptr)
      for (uint64_t p : *must_be_pending) {
        bool found = false;
        for (const SegmentSnapshot& s : snap)
          for (const BlockSnapshot& b : s.blocks)
            if (b.addr == p) found = b.pending_events;
        if (!found) return err << "block at " << p << " was reused or freed before its streams' events completed", err.str();
      }
    // The caller's live allocations are exactly the allocator's.
    if (live != nullptr) {
      if (live_blocks.size() != live->size())
        return err << live_blocks.size() << " live blocks, the caller holds " << live->size(), err.str();
      for (const auto& [p, info] : *live) {
        auto it = live_blocks.find(addr(p));
        if (it == live_blocks.end()) return err << "live pointer " << p << " is not a live block", err.str();
        if (it->second->requested != info.requested || it->second->stream != info.stream)
          return err << "live pointer " << p << " recorded with another size or stream", err.str();
      }
    }
    // Statistics equal the recount.
    const char* pool_names[] = {"aggregate", "small", "large"};
    for (int p = 0; p < kNumStatPools; ++p) {
      auto cmp = [&](const char* what, const StatCounter& c, int64_t want) {
        if (c.current != want)
          err << pool_names[p] << " " << what << ": stats say " << c.current << ", recount " << want << "; ";
        if (c.current != c.allocated - c.freed) err << pool_names[p] << " " << what << ": current != allocated-freed; ";
        if (c.peak < c.current) err << pool_names[p] << " " << what << ": peak below current; ";
      };
      cmp("segment", st.segment[p], rc[p].segments);
      cmp("reserved_bytes", st.reserved_bytes[p], rc[p].reserved);
      cmp("allocation", st.allocation[p], rc[p].allocations);
      cmp("allocated_bytes", st.allocated_bytes[p], rc[p].allocated);
      cmp("requested_bytes", st.requested_bytes[p], rc[p].requested);
      cmp("active", st.active[p], rc[p].active);
      cmp("active_bytes", st.active_bytes[p], rc[p].active_bytes);
      cmp("inactive_split", st.inactive_split[p], rc[p].inactive_split);
      cmp("inactive_split_bytes", st.inactive_split_bytes[p], rc[p].inactive_split_bytes);
    }
    if (st.oversize_allocations.current != oversize_allocs)
      err << "oversize_allocations " << st.oversize_allocations.current << ", recount " << oversize_allocs << "; ";
    if (st.oversize_segments.current != oversize_segs)
      err << "oversize_segments " << st.oversize_segments.current << ", recount " << oversize_segs << "; ";
    if (!err.str().empty()) return err.str();
    const AllocatorStats simple = a.stats();
    if (simple.allocated_bytes != rc[0].allocated || simple.reserved_bytes != rc[0].reserved)
      return err << "stats() disagrees with the recount", err.str();
    const FragmentationMetrics f = a.fragmentation();
    // Stranded split bytes count mapped pages only (not in the snapshot): between the fixed segments' free split
    // bytes and every free split block's size, and never above the slack.
    if (f.cache_slack != rc[0].reserved - rc[0].allocated || f.inactive_split_bytes > rc[0].inactive_split_bytes ||
        f.inactive_split_bytes < fixed_split_bytes || f.inactive_split_bytes > f.cache_slack ||
        f.rounding_waste != rc[0].allocated - rc[0].requested || f.largest_free_block > largest_free ||
        f.largest_free_block < largest_fixed_free)
      return err << "fragmentation metrics disagree with the recount", err.str();
    if (auto* sim = dynamic_cast<SimulatedBacking*>(&a.backing())) {
      if (sim->used() != rc[0].reserved)
        return err << "backing holds " << sim->used() << " bytes, reserved recount " << rc[0].reserved, err.str();
      if (sim->num_mallocs() - sim->num_frees() != fixed_segments)
        return err << "backing has " << sim->num_mallocs() - sim->num_frees() << " live segments, snapshot "
                   << fixed_segments, err.str();
    }
    return "";
  }
};

std::string verify(CachingAllocator& a) { return Verifier{}(a); }

}  // namespace

// Shared with test_caching_knobs.cpp and test_caching_oom.cpp (same test binary): the snapshot recount above.
std::string verify_caching_allocator(CachingAllocator& a) { return verify(a); }

namespace {

// ---- randomised invariant runs -------------------------------------------------------------------------------

struct RandomCase {
  const char* name;
  const char* conf;    // EMBER_ALLOC_CONF string
  int64_t capacity;
  int64_t ops;         // alloc + free calls
  int check_every;     // ops between full verifications
  bool materialize;    // real memory: stamps written into every allocation are checked on free
};

// >= 1e6 alloc/free operations in all (checked by RandomInvariantsTotal.AtLeastAMillionOperations).
const RandomCase kRandomCases[] = {
    {"default", "", 192 * MiB, 320000, 10, false},
    {"expandable", "expandable_segments:True", 192 * MiB, 260000, 10, false},
    {"knobs", "max_split_size_mb:40,roundup_power2_divisions:4,garbage_collection_threshold:0.6", 192 * MiB, 260000,
     10, false},
    {"fraction", "per_process_memory_fraction:0.5,roundup_power2_divisions:[1:4,16:2,>:8]", 384 * MiB,
     200000, 10, false},
    {"materialized", "", 48 * MiB, 60000, 25, true},
    {"expandable_max_split", "expandable_segments:True,max_split_size_mb:40", 192 * MiB, 100000, 10, false},
};

// Names the case in test listings (instead of the struct's bytes).
void PrintTo(const RandomCase& c, std::ostream* os) { *os << c.name << " (" << (*c.conf ? c.conf : "default") << ")"; }

class RandomInvariants : public ::testing::TestWithParam<RandomCase> {};

int64_t draw_size(std::mt19937_64& rng, bool materialize) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double r = u(rng);
  if (r < (materialize ? 0.9 : 0.80))  // small: log-uniform in [1 B, 1 MiB]
    return std::max<int64_t>(1, static_cast<int64_t>(std::exp(u(rng) * std::log(double(MiB)))));
  if (materialize || r < 0.95)  // medium: (1 MiB, 10 MiB] (materialised: up to 4 MiB, poisoning writes every byte)
    return MiB + 1 + static_cast<int64_t>(u(rng) * double((materialize ? 3 : 9) * MiB - 1));
  return 10 * MiB + 1 + static_cast<int64_t>(u(rng) * double(30 * MiB - 1));  // large: (10 MiB, 40 MiB]
}

void stamp(void* p, int64_t n, uint64_t v) {
  auto* c = static_cast<unsigned char*>(p);
  if (n >= 16) {
    std::memcpy(c, &v, 8);
    std::memcpy(c + n - 8, &v, 8);
  } else {
    c[0] = static_cast<unsigned char>(v);
    c[n - 1] = static_cast<unsigned char>(v);
  }
}

bool stamp_ok(const void* p, int64_t n, uint64_t v) {
  const auto* c = static_cast<const unsigned char*>(p);
  if (n >= 16) {
    uint64_t a, b;
    std::memcpy(&a, c, 8);
    std::memcpy(&b, c + n - 8, 8);
    return a == v && b == v;
  }
  return c[0] == static_cast<unsigned char>(v) && c[n - 1] == static_cast<unsigned char>(v);
}

TEST_P(RandomInvariants, AllInvariantsHold) {
  const RandomCase& rc = GetParam();
  const uint64_t seed = ember::testing::test_seed() ^ (std::hash<std::string>{}(rc.name) * 0x9E3779B97F4A7C15ull);
  SCOPED_TRACE(std::string("case ") + rc.name + ", seed " + std::to_string(seed) + " (from EMBER_TEST_SEED " +
               std::to_string(ember::testing::test_seed()) + ")");
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  auto alloc = make_allocator(rc.capacity, parse_alloc_config(rc.conf), rc.materialize);
  SimulatedBacking& sim = sim_of(*alloc);
  const bool poisoned = poison_allocations();

  std::unordered_map<void*, LiveInfo> live;
  std::vector<void*> order;  // live pointers, for random picks
  std::unordered_map<void*, uint64_t> stamps;
  std::unordered_set<void*> used_elsewhere;        // record_stream was called on it
  std::unordered_set<uint64_t> pending, completed;  // freed blocks waiting for / past their streams' events
  int64_t live_bytes = 0, target_bytes = 0, last_syncs = 0;
  int64_t n_alloc = 0, n_free = 0, n_oom = 0, n_empty = 0, n_record = 0, n_complete = 0, checks = 0;
  uint64_t next_stamp = 1;
  const StreamId streams[] = {0, 0, 0, 0, 1, 1, 2};

  auto check = [&](bool after_empty) {
    std::unordered_set<uint64_t> may_pend = pending;
    may_pend.insert(completed.begin(), completed.end());
    Verifier v{&live, &may_pend, &pending, after_empty};
    const std::string e = v(*alloc);
    ++checks;
    if (!e.empty()) return e;
    try {
      alloc->check_invariants();
    } catch (const Error& ex) {
      return std::string("check_invariants: ") + ex.what();
    }
    return std::string();
  };

  // Frees order[i]; false when its stamp was overwritten (another allocation overlapped it).
  auto free_one = [&](size_t i) {
    void* p = order[i];
    order[i] = order.back();
    order.pop_back();
    const LiveInfo info = live.at(p);
    bool intact = true;
    if (rc.materialize) {
      intact = stamp_ok(p, info.requested, stamps.at(p));
      stamps.erase(p);
    }
    live.erase(p);
    live_bytes -= info.requested;
    if (used_elsewhere.erase(p)) pending.insert(addr(p));
    alloc->deallocate(p);
    ++n_free;
    return intact;
  };

  int64_t op = 0, next_check = rc.check_every, next_empty = rc.ops / 8;
  size_t max_live = 0;
  while (op < rc.ops) {
    if (op % 4096 == 0) target_bytes = static_cast<int64_t>(u(rng) * 1.3 * double(alloc->allowed_memory()));
    const bool do_alloc = order.empty() || u(rng) < (live_bytes < target_bytes ? 0.7 : 0.3);
    if (do_alloc) {
      const int64_t n = draw_size(rng, rc.materialize);
      const StreamId s = streams[rng() % std::size(streams)];
      completed.clear();  // allocate() first processes every completed event
      void* p = nullptr;
      try {
        p = alloc->allocate(n, s);
        const int64_t syncs = alloc->device_stats().num_sync_all_streams;
        if (syncs != last_syncs) pending.clear();  // the OOM ladder synchronised every stream and succeeded
        last_syncs = syncs;
      } catch (const OutOfMemoryError& e) {
        last_syncs = alloc->device_stats().num_sync_all_streams;
        ++n_oom;
        pending.clear();  // the OOM ladder synchronised every stream
        ASSERT_EQ(e.requested(), n);
        // Free about a third of the live set and carry on.
        for (size_t k = order.size() / 3; k > 0 && !order.empty(); --k) {
          ASSERT_TRUE(free_one(rng() % order.size())) << "an allocation was overwritten (op " << op << ")";
          ++op;
        }
        ++op;
        continue;
      }
      ASSERT_NE(p, nullptr);
      ASSERT_EQ(addr(p) % 512, 0u);
      ++n_alloc;
      ASSERT_TRUE(live.emplace(p, LiveInfo{n, s}).second) << "pointer " << p << " handed out twice";
      order.push_back(p);
      live_bytes += n;
      if (rc.materialize) {
        const auto* c = static_cast<const unsigned char*>(p);
        if (poisoned) ASSERT_TRUE(c[0] == kPoisonByte && c[n - 1] == kPoisonByte) << "allocation not poisoned";
        stamps[p] = next_stamp;
        stamp(p, n, next_stamp++);
      }
      if (u(rng) < 0.05) {  // also used on another stream (3 never allocates)
        StreamId other = (s + 1 + rng() % 3) % 4;
        alloc->record_stream(p, other);
        used_elsewhere.insert(p);
        ++n_record;
      }
    } else {
      ASSERT_TRUE(free_one(rng() % order.size())) << "an allocation was overwritten (op " << op << ")";
    }
    ++op;
    if (u(rng) < 0.01) {
      sim.complete_events();
      completed.insert(pending.begin(), pending.end());
      pending.clear();
      ++n_complete;
    }
    if (u(rng) < 1.0 / 20000 || op >= next_empty) {
      next_empty = std::max(next_empty, op) + rc.ops / 8;
      alloc->empty_cache();
      pending.clear();
      completed.clear();
      last_syncs = alloc->device_stats().num_sync_all_streams;
      ++n_empty;
      const std::string e = check(true);
      ASSERT_EQ(e, "") << "after empty_cache at op " << op;
    }
    if (u(rng) < 1.0 / 50000) alloc->reset_peak_stats();
    max_live = std::max(max_live, order.size());
    if (op >= next_check) {
      next_check = op + rc.check_every;
      const std::string e = check(false);
      ASSERT_EQ(e, "") << "at op " << op;
    }
  }
  // Drain: free everything, empty the cache: nothing is left.
  while (!order.empty()) ASSERT_TRUE(free_one(order.size() - 1)) << "an allocation was overwritten";
  alloc->empty_cache();
  pending.clear();
  completed.clear();
  ASSERT_EQ(check(true), "");
  EXPECT_TRUE(alloc->snapshot().empty());
  EXPECT_EQ(sim.used(), 0);
  const DeviceStats st = alloc->device_stats();
  EXPECT_EQ(st.allocation[kAggregatePool].allocated, n_alloc);
  EXPECT_EQ(st.allocation[kAggregatePool].freed, n_free);
  EXPECT_EQ(st.num_ooms, n_oom);
  EXPECT_EQ(alloc->stats().num_ooms, n_oom);
  std::printf("[ random %s ] %lld ops: %lld allocs, %lld frees, %lld OOMs, %lld record_stream, %lld event "
              "completions, %lld empty_cache, %lld full checks, %lld alloc retries, %zu live at most\n",
              rc.name, static_cast<long long>(op), static_cast<long long>(n_alloc), static_cast<long long>(n_free),
              static_cast<long long>(n_oom), static_cast<long long>(n_record), static_cast<long long>(n_complete),
              static_cast<long long>(n_empty), static_cast<long long>(checks),
              static_cast<long long>(st.num_alloc_retries), max_live);
  // The run exercised what it claims to.
  EXPECT_GT(n_oom, 0);
  EXPECT_GT(n_record, 0);
  EXPECT_GT(n_empty, 0);
}

INSTANTIATE_TEST_SUITE_P(Caching, RandomInvariants, ::testing::ValuesIn(kRandomCases),
                         [](const ::testing::TestParamInfo<RandomCase>& i) { return std::string(i.param.name); });

TEST(RandomInvariantsTotal, AtLeastAMillionOperations) {
  int64_t total = 0;
  for (const RandomCase& c : kRandomCases)
    total += c.ops;
  EXPECT_GE(total, 1000000);
}

// ---- threads ------------------------------------------------------------------------------------------------

TEST(CachingThreads, ConcurrentAllocFree) {
  auto a = make_allocator(8 * GiB);
  constexpr int kThreads = 4, kOps = 20000;
  std::vector<std::vector<std::pair<void*, int64_t>>> kept(kThreads);
  std::atomic<int64_t> allocs{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(ember::testing::test_seed() + static_cast<uint64_t>(t));
      std::vector<std::pair<void*, int64_t>>& mine = kept[static_cast<size_t>(t)];
      for (int i = 0; i < kOps; ++i) {
        if (mine.size() < 64 && (mine.empty() || rng() % 2 == 0)) {
          const int64_t n = (rng() % 10 == 0) ? MiB + static_cast<int64_t>(rng() % (8 * MiB))
                                              : 1 + static_cast<int64_t>(rng() % (256 * KiB));
          void* p = a->allocate(n, static_cast<StreamId>(t % 2));
          mine.emplace_back(p, n);
          allocs.fetch_add(1);
        } else {
          const size_t k = rng() % mine.size();
          a->deallocate(mine[k].first);
          mine[k] = mine.back();
          mine.pop_back();
        }
      }
    });
  for (auto& th : threads) th.join();
  std::unordered_map<void*, LiveInfo> live;
  for (int t = 0; t < kThreads; ++t)
    for (auto [p, n] : kept[static_cast<size_t>(t)])
      ASSERT_TRUE(live.emplace(p, LiveInfo{n, static_cast<StreamId>(t % 2)}).second) << "pointer given twice";
  EXPECT_EQ(Verifier{&live}(*a), "");
  EXPECT_NO_THROW(a->check_invariants());
  for (auto& [p, info] : live) a->deallocate(p);
  a->empty_cache();
  EXPECT_EQ(a->stats().num_allocs, allocs.load());
  EXPECT_EQ(a->stats().allocated_bytes, 0);
  EXPECT_EQ(a->stats().reserved_bytes, 0);
  EXPECT_NO_THROW(a->check_invariants());
}

}  // namespace
