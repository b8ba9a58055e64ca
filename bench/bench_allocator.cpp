// Caching allocator benchmarks: cached alloc+free pairs on a simulated device (target <= 100 ns per pair on CPU),
// alloc+free with 1000 live blocks in the pool, and replay of a recorded trace; with --fragmentation, replays three
// training-like traces (bench/traces.h) under several configurations and prints 1 - peak_allocated/peak_reserved.
// Usage: bench_allocator [--benchmark_filter=...]   |   bench_allocator --fragmentation
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "traces.h"
#include "ember/memory/caching_allocator.h"

using namespace ember;
using namespace ember::memory;

namespace {

constexpr int64_t kMiBytes = kMiB;
constexpr int64_t kGiBytes = 1024 * kMiB;

std::unique_ptr<CachingAllocator> simulated(int64_t capacity = 64 * kGiBytes, const AllocatorConfig& c = {}) {
  return std::make_unique<CachingAllocator>(make_simulated_backing(capacity, /*materialize=*/false), c);
}

// One cached allocation and its free: the block is in the pool after the first iteration.
void bm_cached_alloc_free(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto a = simulated();
  a->deallocate(a->allocate(n));  // warm: the segment exists
  for (auto _ : state) {
    void* p = a->allocate(n);
    benchmark::DoNotOptimize(p);
    a->deallocate(p);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel("one alloc+free pair per iteration");
}

// The same over host memory (materialised, what CPU tensors use).
void bm_cached_alloc_free_host(benchmark::State& state) {
  const int64_t n = state.range(0);
  CachingAllocator a(make_host_backing());
  a.deallocate(a.allocate(n));
  for (auto _ : state) {
    void* p = a.allocate(n);
    benchmark::DoNotOptimize(p);
    a.deallocate(p);
  }
  state.SetItemsProcessed(state.iterations());
}

// For scale: the C library's malloc/free pair of the same size.
void bm_malloc_free(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    void* p = std::malloc(n);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
  state.SetItemsProcessed(state.iterations());
}

// Alloc+free of varied sizes (512 B..8 MiB) while 1000 other blocks are live: the pools hold many blocks and
// split segments, so the best-fit search and coalescing do real work.
void bm_alloc_free_1000_live(benchmark::State& state) {
  auto a = simulated();
  std::mt19937_64 rng(42);
  auto draw = [&]() -> int64_t {
    return rng() % 4 == 0 ? kMiBytes + static_cast<int64_t>(rng() % (7 * kMiBytes))
                          : 512 + static_cast<int64_t>(rng() % (512 * 1024));
  };
  std::vector<void*> live;
  for (int i = 0; i < 2000; ++i) live.push_back(a->allocate(draw()));
  for (int i = 0; i < 1000; ++i) {  // free every other one: 1000 live, ~1000 free blocks between them
    a->deallocate(live[static_cast<size_t>(i)]);
    live[static_cast<size_t>(i)] = live.back();
    live.pop_back();
  }
  std::vector<int64_t> sizes(4096);
  for (auto& s : sizes) s = draw();
  size_t i = 0;
  for (auto _ : state) {
    void* p = a->allocate(sizes[i++ & 4095]);
    benchmark::DoNotOptimize(p);
    a->deallocate(p);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["live_blocks"] = static_cast<double>(a->device_stats().allocation[kAggregatePool].current);
  state.counters["segments"] = static_cast<double>(a->device_stats().segment[kAggregatePool].current);
  for (void* p : live) a->deallocate(p);
}

// A trace recorded from an allocator (the churn workload run with the trace enabled), replayed through a fresh
// allocator per iteration: events/s.
const std::vector<TraceEvent>& recorded_trace() {
  static const std::vector<TraceEvent> events = [] {
    const std::vector<TraceEvent> workload = bench::random_churn_trace(100000, int64_t{4} << 30, 11);
    auto a = simulated();
    a->enable_trace(workload.size() * 2);
    std::unordered_map<uint64_t, void*> live;
    for (const TraceEvent& e : workload) {
      if (e.action == TraceAction::Alloc) {
        live[e.id] = a->allocate(e.size, e.stream);
      } else {
        a->deallocate(live.at(e.id));
        live.erase(e.id);
      }
    }
    return a->trace();  // alloc, free and segment events, as a user would record them
  }();
  return events;
}

void bm_replay_trace(benchmark::State& state) {
  const std::vector<TraceEvent>& events = recorded_trace();
  ReplayResult r;
  for (auto _ : state) {
    r = replay_trace(events, AllocatorConfig{}, 64 * kGiBytes);
    benchmark::DoNotOptimize(r.peak_reserved);
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(events.size()));
  state.counters["events"] = static_cast<double>(events.size());
  state.counters["peak_reserved_MiB"] = static_cast<double>(r.peak_reserved) / kMiBytes;
}

BENCHMARK(bm_cached_alloc_free)->Arg(512)->Arg(64 << 10)->Arg(4 << 20)->Repetitions(5)->DisplayAggregatesOnly(true);
BENCHMARK(bm_cached_alloc_free_host)->Arg(512)->Arg(64 << 10)->Arg(4 << 20)->Repetitions(5)
    ->DisplayAggregatesOnly(true);
BENCHMARK(bm_malloc_free)->Arg(512)->Arg(64 << 10)->Arg(4 << 20)->Repetitions(5)->DisplayAggregatesOnly(true);
BENCHMARK(bm_alloc_free_1000_live)->Repetitions(5)->DisplayAggregatesOnly(true);
BENCHMARK(bm_replay_trace)->Unit(benchmark::kMillisecond)->Repetitions(3)->DisplayAggregatesOnly(true);

// ---- --fragmentation ----------------------------------------------------------------------------------------

// Checks that a generated trace is a well-formed replay input: every id allocated once and freed at most once,
// after its allocation.
bool well_formed(const std::vector<TraceEvent>& events) {
  std::unordered_map<uint64_t, int> state;  // 1 = live, 2 = freed
  for (const TraceEvent& e : events) {
    int& s = state[e.id];
    if (e.action == TraceAction::Alloc) {
      if (s != 0 || e.size <= 0) return false;
      s = 1;
    } else if (e.action == TraceAction::Free) {
      if (s != 1) return false;
      s = 2;
    }
  }
  return true;  // ids still live at the end (parameters, optimizer state) are fine
}

// Replays each trace under each configuration on a simulated device of `device(trace)` bytes and prints a table.
int fragmentation_table(const std::vector<std::string>& configs) {
  struct Trace {
    const char* name;
    std::vector<TraceEvent> events;
    int64_t sized_device;  // a device the trace fits with some headroom
  };
  std::vector<Trace> traces;
  traces.push_back({"gpt (20 steps)", bench::gpt_training_trace(20), 16 * kGiBytes});
  traces.push_back({"cnn (batch 32..256)", bench::cnn_variable_batch_trace(30, 32, 256, 1), 8 * kGiBytes});
  traces.push_back({"random churn", bench::random_churn_trace(200000, int64_t{8} << 30, 7), 12 * kGiBytes});
  for (const Trace& t : traces)
    if (!well_formed(t.events)) {
      std::fprintf(stderr, "trace %s is not a well-formed replay input\n", t.name);
      return 1;
    }
  for (bool sized : {false, true}) {
    std::printf("\n%s\n\n", sized ? "On a device sized to the trace (GPT 16 GiB, CNN 8 GiB, churn 12 GiB): the OOM "
                                      "ladder returns cached memory under pressure"
                                    : "On a simulated 80 GiB device (no memory pressure: nothing is ever released)");
    std::printf("| trace | events | peak requested | device | config | peak allocated | peak reserved | "
                "fragmentation | 1 - peak requested/peak reserved | device allocs | OOMs |\n"
                "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|\n");
    for (const Trace& t : traces) {
      const int64_t device = sized ? t.sized_device : 80 * kGiBytes;
      for (const std::string& conf : configs) {
        const ReplayResult r = replay_trace(t.events, parse_alloc_config(conf), device);
        const double req_frag =
            r.peak_reserved > 0 ? 1.0 - static_cast<double>(r.peak_requested) / static_cast<double>(r.peak_reserved)
                                : 0.0;
        std::printf("| %s | %zu | %s | %s | %s | %s | %s | %.2f%% | %.2f%% | %lld | %lld |\n", t.name,
                    t.events.size(), format_bytes(r.peak_requested).c_str(), format_bytes(device).c_str(),
                    conf.empty() ? "default" : conf.c_str(), format_bytes(r.peak_allocated).c_str(),
                    format_bytes(r.peak_reserved).c_str(), 100.0 * r.fragmentation, 100.0 * req_frag,
                    static_cast<long long>(r.num_device_allocs), static_cast<long long>(r.num_ooms));
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace

// --fragmentation [--configs="a;b;..."]: the table (by default: the default configuration, one knob each and two
// common pairs).
int main(int argc, char** argv) {
  bool fragmentation = false;
  std::vector<std::string> configs = {"",
                                      "max_split_size_mb:128",
                                      "roundup_power2_divisions:4",
                                      "expandable_segments:True",
                                      "expandable_segments:True,roundup_power2_divisions:4",
                                      "max_split_size_mb:128,garbage_collection_threshold:0.8"};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--fragmentation") == 0) fragmentation = true;
    if (std::strncmp(argv[i], "--configs=", 10) == 0) {
      configs.clear();
      std::string list = argv[i] + 10;
      for (size_t pos = 0; pos <= list.size();) {
        const size_t end = std::min(list.find(';', pos), list.size());
        configs.push_back(list.substr(pos, end - pos));
        pos = end + 1;
      }
    }
  }
  if (fragmentation) return fragmentation_table(configs);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
