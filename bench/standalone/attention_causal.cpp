// The CPU fused causal attention (ops::attention_qkv and its backward) at the gpt config's width over longer contexts:
// the time of a forward and of a backward call at T = 64, 256 and 1024 (B x T = 768 rows, 1024 at T = 1024), each the
// minimum over many calls, since another tenant's load on a shared machine only adds time. Threads: EMBER_NUM_THREADS
// (default: every CPU). Written to compare libraries side by side (LD_LIBRARY_PATH) for Note [Causal attention by
// row blocks] in ember/kernels/cpu/attention.cpp.
// Usage: attention_causal [--calls N] [--width C] [--heads H]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ember/ember.h"

using namespace ember;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t calls = 30, C = 128, H = 4;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h" || i + 1 == argc) {
      std::printf("usage: attention_causal [--calls N] [--width C] [--heads H]\n");
      return flag == "--help" || flag == "-h" ? 0 : 2;
    }
    const int64_t v = std::atoll(argv[++i]);
    if (v < 1 || (flag != "--calls" && flag != "--width" && flag != "--heads")) {
      std::fprintf(stderr, "attention_causal: bad flag or value %s %s\n", flag.c_str(), argv[i]);
      return 2;
    }
    (flag == "--calls" ? calls : flag == "--width" ? C : H) = v;
  }
  if (C % H != 0) {
    std::fprintf(stderr, "attention_causal: --width must be a multiple of --heads\n");
    return 2;
  }
  std::printf("causal attention, width %lld, %lld heads, %d thread(s), min of %lld calls\n\n",
              static_cast<long long>(C), static_cast<long long>(H), get_num_threads(),
              static_cast<long long>(calls));
  std::printf("| T | batch | forward ms | backward ms |\n|---:|---:|---:|---:|\n");
  for (int64_t T : {64, 256, 1024}) {
    const int64_t B = std::max<int64_t>(1, 768 / T);
    const Tensor qkv = randn({B, T, 3 * C}), g = randn({B, T, C});
    double fwd = 1e30, bwd = 1e30;
    for (int64_t c = 0; c < calls + 2; ++c) {  // two warm-up calls
      auto t0 = std::chrono::steady_clock::now();
      const AttentionResult r = ops::attention_qkv(qkv, H, true);
      const double f = ms_since(t0);
      t0 = std::chrono::steady_clock::now();
      const Tensor gq = ops::attention_qkv_backward(g, qkv, r.lse, H, true);
      const double b = ms_since(t0);
      if (c >= 2) fwd = std::min(fwd, f), bwd = std::min(bwd, b);
    }
    std::printf("| %lld | %lld | %.3f | %.3f |\n", static_cast<long long>(T), static_cast<long long>(B), fwd, bwd);
  }
  return 0;
}
