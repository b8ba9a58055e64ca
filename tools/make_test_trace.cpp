// make_test_trace OUTDIR: records a small training-like run (parameters, forward activations, backward gradients and
// temporaries freed out of order, optimizer state, a workspace, and one request too large for the device) on a fresh
// caching allocator over a simulated device, and writes into OUTDIR (created if needed) trace.json (Chrome JSON with
// the configuration), trace.jsonl, expected.json (the recording allocator's own peaks) and garbage.json (not a
// trace). Built with the tests only: the `ember mem` tests replay these files and compare with expected.json.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ember/base/error.h"
#include "ember/memory/backing.h"
#include "ember/memory/caching_allocator.h"
#include "ember/memory/tags.h"
#include "ember/memory/trace.h"

namespace {

using namespace ember::memory;

constexpr int64_t KiB = 1024, MiB = 1024 * 1024;
constexpr const char* kConf = "max_split_size_mb:40,garbage_collection_threshold:0.5,capacity:256MiB";

int run(const std::string& dir) {
  std::filesystem::create_directories(dir);
  CachingAllocator a(make_simulated_backing(512 * MiB, /*materialize=*/false), parse_alloc_config(kConf), "caching");
  a.enable_trace(1 << 20);
  int64_t ooms = 0;
  auto alloc = [&](int64_t bytes, const std::string& tag) -> void* {
    TagScope scope(tag);
    try {
      return a.allocate(bytes);
    } catch (const ember::OutOfMemoryError&) {
      ++ooms;
      return nullptr;
    }
  };
  auto release = [&](void* p) {
    if (p) a.deallocate(p);
  };

  // A 4-layer model with layer widths that give mixed sizes: small (< 1 MiB), medium (1-10 MiB) and large.
  const int64_t width[] = {3 * MiB + 100, 700 * KiB, 12 * MiB + 4096, 45 * MiB};
  std::vector<void*> params, grads, state;
  for (int l = 0; l < 4; ++l) params.push_back(alloc(width[l] / 3 + 512, "mlp.fc" + std::to_string(l) + "/other"));
  for (int step = 0; step < 3; ++step) {
    a.annotate("step " + std::to_string(step));
    std::vector<void*> acts;
    for (int l = 0; l < 4; ++l) {
      const std::string tag = "mlp.fc" + std::to_string(l) + "/forward";
      acts.push_back(alloc(width[l] + step * 4096, tag));
      acts.push_back(alloc(width[(l + 1) % 4] / 2 + 333, tag));
    }
    for (int l = 3; l >= 0; --l) {
      const std::string tag = "mlp.fc" + std::to_string(l) + "/backward";
      void* t0 = alloc(width[l] + 512, tag);
      void* t1 = alloc(width[(l + 2) % 4] / 4 + 77, tag);
      if (step == 0) grads.push_back(alloc(width[l] / 3 + 512, tag));
      release(acts[2 * l + 1]);  // activations leave out of order
      release(t0);
      release(acts[2 * l]);
      release(t1);
    }
    if (step == 0)
      for (int l = 0; l < 4; ++l) state.push_back(alloc(2 * (width[l] / 3 + 512), "adamw/optimizer"));
    release(alloc(20 * MiB + 5, "cublas/workspace"));
  }
  release(alloc(1024 * MiB, "mlp.fc3/forward"));  // too large for the 256 MiB device: an OOM in the trace
  for (void* p : params) release(p);
  for (void* p : grads) release(p);
  for (void* p : state) release(p);

  const std::vector<TraceEvent> events = a.trace();
  const DeviceStats s = a.device_stats();
  const TraceFileOptions options{a.config().explicit_str(), a.name()};
  write_trace_file(dir + "/trace.json", events, options);
  write_trace_file(dir + "/trace.jsonl", events, options);
  nlohmann::ordered_json expected = {{"alloc_conf", options.alloc_conf},
                                     {"events", events.size()},
                                     {"peak_allocated_bytes", s.allocated_bytes[kAggregatePool].peak},
                                     {"peak_reserved_bytes", s.reserved_bytes[kAggregatePool].peak},
                                     {"recorded_ooms", ooms}};
  std::ofstream(dir + "/expected.json") << expected.dump() << "\n";
  std::ofstream(dir + "/garbage.json") << "this is not a trace\x01\x02\n";
  std::printf("%s\n", expected.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_test_trace OUTDIR\n");
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_test_trace: %s\n", e.what());
    return 1;
  }
}
