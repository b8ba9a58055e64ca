// The CPU kernels of the three `ember bench train` configurations (mlp, cnn, gpt) against the ceilings of the
// machine they run on, measured in the same run at each thread count — a roofline:
//   - peak: the f32 multiply-add rate of a loop of independent fused multiply-adds in registers (the ISA the build
//     targets: 16-wide FMA under AVX-512, 8-wide under AVX2+FMA), all threads busy;
//   - bandwidth: the better of a copy loop and an in-place update loop (regular stores, the kernels' kind) over the
//     kernel's own footprint (the distinct bytes it touches), so a kernel whose operands fit in a cache is held to
//     that cache's rate, not to DRAM's. Near a cache's capacity the loops and a kernel with more operand streams
//     may land on different sides of it: a share above 100% there means the kernel kept more in cache than the loop.
// A kernel's floor is max(flops / peak, bytes / bandwidth), its flops counted as the textbook formula (GEMM 2mnk,
// attention's products over the blocks the kernel computes) and its bytes the minimum it must move (each input read
// once, each output written once); "% of roof" is that floor over the measured time, and "bound" names the larger
// term. A round times every kernel as the median of 5 repetitions (each of enough calls to last >= 20 ms, after 2
// warm-up calls) and every ceiling as the best of its 5; over the rounds, each takes its best.
// Usage: cpu_roofline [--threads 1,2] [--rounds 5] [--quick] [--json]
//   --rounds N: measure the whole list N times (default 5): a kernel's time is the best of its rounds (each the median
//               of 5 repetitions), a ceiling the best of its rounds. --quick: one round of 5 ms repetitions, for a
//               smoke run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#if defined(__AVX__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "ember/core/parallel.h"
#include "ember/kernels/ops.h"

using namespace ember;

namespace {

using Clock = std::chrono::steady_clock;
double g_min_rep_seconds = 0.02;

// The seconds per call of fn() over 5 repetitions: their median (a kernel's time), or with best their minimum (a
// ceiling: the rate the machine reached, which another tenant's load can only lower).
double median_seconds(const std::function<void()>& fn, bool best = false) {
  fn();
  fn();
  int calls = 1;
  for (;;) {  // calls per repetition: enough to last g_min_rep_seconds
    const auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) fn();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s >= g_min_rep_seconds || calls >= (1 << 20)) break;
    calls = s <= 0 ? calls * 16 : std::max(calls + 1, static_cast<int>(calls * 1.3 * g_min_rep_seconds / s));
  }
  std::vector<double> reps;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) fn();
    reps.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / calls);
  }
  std::sort(reps.begin(), reps.end());
  return best ? reps[0] : reps[2];
}

// ---- ceilings -------------------------------------------------------------------------------------------------

constexpr int kAccumulators = 12;  // independent chains: > FMA latency x FMA ports (4 x 2 on current x86 cores)

#if defined(__AVX512F__)
// The build's widest FMA (Note [AVX-512 builds] in cmake/EmberCpuIsa.cmake): Eigen's GEMM runs 16 lanes there, so
// the 8-lane ceiling would put it above 100% of its roof.
const char* const kPeakIsa = "AVX-512F FMA, 16 f32 lanes";
float fma_chains(int64_t iterations, float seed) {
  __m512 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_set1_ps(seed + static_cast<float>(i));
  const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it)
    for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_fmadd_ps(acc[i], m, a);
  __m512 s = acc[0];
  for (int i = 1; i < kAccumulators; ++i) s = _mm512_add_ps(s, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0] + out[15];
}
constexpr int kLanes = 16;
constexpr int kFlopsPerOp = 2;
#elif defined(__AVX__) && defined(__FMA__)
const char* const kPeakIsa = "AVX2+FMA, 8 f32 lanes";
float fma_chains(int64_t iterations, float seed) {
  __m256 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm256_set1_ps(seed + static_cast<float>(i));
  const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it)
    for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm256_fmadd_ps(acc[i], m, a);
  __m256 s = acc[0];
  for (int i = 1; i < kAccumulators; ++i) s = _mm256_add_ps(s, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[7];
}
constexpr int kLanes = 8;
constexpr int kFlopsPerOp = 2;
#else
const char* const kPeakIsa = "generic (separate multiply and add, 4 f32 lanes)";
using v4 = float __attribute__((vector_size(16)));
float fma_chains(int64_t iterations, float seed) {
  v4 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = v4{} + (seed + static_cast<float>(i));
  const v4 m = v4{} + 0.999999f, a = v4{} + 1e-7f;
  for (int64_t it = 0; it < iterations; ++it)
    for (int i = 0; i < kAccumulators; ++i) acc[i] = acc[i] * m + a;
  v4 s = acc[0];
  for (int i = 1; i < kAccumulators; ++i) s += acc[i];
  return s[0] + s[3];
}
constexpr int kLanes = 4;
constexpr int kFlopsPerOp = 2;
#endif

volatile float g_sink;

// FLOP/s of every thread running fma_chains at once.
double peak_flops() {
  const int64_t threads = get_num_threads(), iterations = 1 << 20;
  const double s = median_seconds(
      [&] {
        parallel::parallel_for(threads, 1, 1, [&](int64_t, int64_t b, int64_t e) {
          for (int64_t t = b; t < e; ++t) g_sink = fma_chains(iterations, static_cast<float>(t));
        });
      },
      true);
  return static_cast<double>(threads) * iterations * kAccumulators * kLanes * kFlopsPerOp / s;
}

// Bytes/s moved by a loop over two arrays of footprint / 2 bytes each, split over the threads as an elementwise
// kernel's loop is: the better of a copy, dst[i] = src[i] + 0 (8 bytes per element: a fresh output, as most kernels
// write; its stores first read each line, a traffic no byte count here sees), and an update in place, a[i] += b[i]
// (12 bytes per element: a read twice and written once, as the optimizer steps do). + 0.0f keeps the copy a loop: the
// compiler may not turn it into memcpy, whose large-size path uses non-temporal stores no ember kernel uses.
double stream_bandwidth(double footprint) {
  const int64_t n = std::max<int64_t>(1024, static_cast<int64_t>(footprint / 8));
  std::vector<float> x(n, 1.0f), y(n, 0.0f);
  const auto loop = [&](auto&& body) {
    return median_seconds(
        [&] {
          parallel::parallel_for(n, 1 << 14, 16, [&](int64_t, int64_t b, int64_t e) {
            const float* __restrict in = x.data();
            float* __restrict out = y.data();
            for (int64_t i = b; i < e; ++i) body(out[i], in[i]);
          });
        },
        true);
  };
  const double copy = loop([](float& o, float i) { o = i + 0.0f; });
  const double update = loop([](float& o, float i) { o += i; });
  g_sink = y[n / 2];
  return std::max(8.0 * n / copy, 12.0 * n / update);
}

// ---- kernels --------------------------------------------------------------------------------------------------

struct Case {
  std::string config, kernel, shape;
  double flops, bytes;  // work and minimum traffic of one call
  std::function<void()> run;
  double footprint = 0;  // distinct bytes touched, when fewer than `bytes` (an operand both read and written)
};

double nbytes(std::initializer_list<Tensor> ts) {
  double b = 0;
  for (const Tensor& t : ts) b += static_cast<double>(t.nbytes());
  return b;
}

Tensor targets(int64_t rows, int64_t classes) {
  Tensor t = empty({rows}, TensorOptions(DType::i64));
  for (int64_t i = 0; i < rows; ++i) t.data<int64_t>()[i] = (i * 7919) % classes;
  return t;
}

Tensor sink;  // keeps each result alive until the next call, as a step's activations are

// A linear layer's three products at [rows, in] -> out: forward (with bias), grad of x, grad of the weight.
void add_linear(std::vector<Case>& cases, const std::string& config, int64_t rows, int64_t in, int64_t out) {
  Tensor x = randn({rows, in}), w = randn({out, in}), b = randn({out}), g = randn({rows, out});
  const std::string shape = std::to_string(rows) + "x" + std::to_string(in) + " -> " + std::to_string(out);
  const double f = 2.0 * rows * in * out;
  Tensor y = ops::linear(x, w, b);
  cases.push_back({config, "linear forward", shape, f, nbytes({x, w, b, y}), [=] { sink = ops::linear(x, w, b); }});
  cases.push_back({config, "linear grad x (g W)", shape, f, nbytes({g, w, x}), [=] { sink = ops::matmul(g, w); }});
  cases.push_back(
      {config, "linear grad W (g^T x)", shape, f, nbytes({g, x, w}), [=] { sink = ops::matmul(g.t(), x); }});
}

void add_adamw(std::vector<Case>& cases, const std::string& config, int64_t params) {
  Tensor p = randn({params}), g = randn({params}), m = zeros({params}), v = zeros({params});
  AdamParams ap;
  ap.weight_decay = 0.01;
  ap.decoupled = true;
  // Reads p, g, m, v and writes p, m, v; ~15 flops per element (decay, two moments, bias corrections, sqrt, update).
  cases.push_back({config, "AdamW step", std::to_string(params) + " params", 15.0 * params, 7.0 * 4 * params,
                   [=] { ops::adam_step_(p, g, m, v, ap); }, 4.0 * 4 * params});
}

// The fused causal attention over qkv [B, T, 3 C], forward and backward. Its products skip the masked blocks (Note
// [Causal attention by row blocks] in ember/kernels/cpu/attention.cpp): query rows in blocks of r rows (r = T for
// T <= 32, else the larger of 32 and T / 8, rounded up to a multiple of 8), block [i0, i1) multiplying over keys
// j < i1 only, so the flops counted are sum over blocks of (i1 - i0) i1 for each [rows, keys] product.
void add_attention(std::vector<Case>& cs, const std::string& config, int64_t B, int64_t T, int64_t C, int64_t H) {
  const int64_t rows = T <= 32 ? T : (std::max<int64_t>(32, (T + 7) / 8) + 7) / 8 * 8;
  double pairs = 0;  // (query, key) pairs the products cover
  for (int64_t i0 = 0; i0 < T; i0 += rows) {
    const int64_t i1 = std::min(T, i0 + rows);
    pairs += double(i1 - i0) * double(i1);
  }
  Tensor qkv = randn({B, T, 3 * C}), go = randn({B, T, C});
  AttentionResult r = ops::attention_qkv(qkv, H, true);
  const double f = 4.0 * B * H * pairs * (C / H);  // q k^T and p v
  const std::string shape = "qkv [" + std::to_string(B) + "," + std::to_string(T) + "," + std::to_string(3 * C) +
                            "], " + std::to_string(H) + " heads";
  cs.push_back({config, "attention forward (causal)", shape, f, nbytes({qkv, r.out, r.lse}),
                [=] { sink = ops::attention_qkv(qkv, H, true).out; }});
  // Backward recomputes the scores (1 product) and forms dv, dp, dq, dk (4 products).
  cs.push_back({config, "attention backward", shape, 2.5 * f, nbytes({go, qkv, r.lse, qkv}),
                [=] { sink = ops::attention_qkv_backward(go, qkv, r.lse, H, true); }});
}

std::vector<Case> make_cases() {
  std::vector<Case> cs;
  // gpt: nanoGPT's char config, batch 12 x block 64 = 768 rows, width 128, 4 heads, vocab 65.
  const int64_t B = 12, T = 64, C = 128, H = 4, V = 65, M = B * T;
  add_linear(cs, "gpt", M, C, 3 * C);
  add_linear(cs, "gpt", M, C, 4 * C);
  add_linear(cs, "gpt", M, 4 * C, C);
  add_attention(cs, "gpt", B, T, C, H);
  add_attention(cs, "gpt, T 256", 3, 256, C, H);  // a longer context: eight causal row blocks
  {
    Tensor x = randn({M, 4 * C}), b = randn({4 * C}), g = randn({M, 4 * C});
    cs.push_back({"gpt", "bias + GELU forward", "768x512", 0, nbytes({x, b, x}), [=] { sink = ops::bias_gelu(x, b); }});
    cs.push_back({"gpt", "bias + GELU backward", "768x512", 0, nbytes({g, x, b, x, b}),
                  [=] { sink = ops::bias_gelu_backward(g, x, b, GeluApprox::None, true, true).x; }});
  }
  {
    Tensor x = randn({M, C}), r = randn({M, C}), w = randn({C}), b = randn({C}), g = randn({M, C});
    LayerNormResult ln = ops::layer_norm_with_stats(x, {C}, w, b);
    cs.push_back({"gpt", "layer norm forward", "768x128", 0, nbytes({x, w, b, ln.out, ln.mean, ln.rstd}),
                  [=] { sink = ops::layer_norm_with_stats(x, {C}, w, b).out; }});
    cs.push_back({"gpt", "residual add + layer norm", "768x128", 0, nbytes({x, r, w, b, x, ln.out, ln.mean, ln.rstd}),
                  [=] { sink = ops::add_layer_norm_with_stats(x, r, {C}, w, b).out; }});
    cs.push_back({"gpt", "layer norm backward", "768x128", 0, nbytes({g, x, w, ln.mean, ln.rstd, x, w, b}),
                  [=] { sink = ops::layer_norm_backward(g, x, w, ln.mean, ln.rstd, 1, true, true, true).x; }});
  }
  {
    Tensor logits = randn({M, V}), t = targets(M, V), gl = randn({M});
    CrossEntropyResult ce = ops::cross_entropy_rows(logits, t, -100, 0.0);
    cs.push_back({"gpt", "cross-entropy forward", "768x65", 0, nbytes({logits, t, ce.loss, ce.lse}),
                  [=] { sink = ops::cross_entropy_rows(logits, t, -100, 0.0).loss; }});
    cs.push_back({"gpt", "cross-entropy backward", "768x65", 0, nbytes({gl, logits, t, ce.lse, logits}),
                  [=] { sink = ops::cross_entropy_rows_backward(gl, logits, t, ce.lse, -100, 0.0); }});
  }
  add_adamw(cs, "gpt", 804096);  // the gpt config's parameter count (`ember estimate --model gpt`)

  // mlp: 784-1024-1024-10, batch 256.
  add_linear(cs, "mlp", 256, 784, 1024);
  add_linear(cs, "mlp", 256, 1024, 1024);
  {
    Tensor x = randn({256, 1024});
    cs.push_back({"mlp", "ReLU forward", "256x1024", 0, 2 * nbytes({x}), [=] { sink = ops::relu(x); }});
  }
  add_adamw(cs, "mlp", 1863690);

  // cnn: the MNIST Net, batch 64.
  {
    const Shape xs{64, 32, 26, 26}, ws{64, 32, 3, 3};
    Tensor x = randn(xs), w = randn(ws), b = randn({64}), g = randn({64, 64, 24, 24});
    const double f = 2.0 * 64 * 64 * 24 * 24 * 32 * 9;
    const std::string shape = "[64,32,26,26] * [64,32,3,3]";
    cs.push_back(
        {"cnn", "conv2d forward (conv2)", shape, f, nbytes({x, w, b, g}), [=] { sink = ops::conv2d(x, w, b); }});
    cs.push_back({"cnn", "conv2d grad x (conv2)", shape, f, nbytes({g, w, x}),
                  [=] { sink = ops::conv2d_backward_input(g, w, xs); }});
    cs.push_back({"cnn", "conv2d grad W (conv2)", shape, f, nbytes({g, x, w}),
                  [=] { sink = ops::conv2d_backward_weight(g, x, ws); }});
  }
  {
    Tensor x = randn({64, 1, 28, 28}), w = randn({32, 1, 3, 3}), b = randn({32});
    Tensor y = ops::conv2d(x, w, b);
    cs.push_back({"cnn", "conv2d forward (conv1)", "[64,1,28,28] * [32,1,3,3]", 2.0 * 64 * 32 * 26 * 26 * 9,
                  nbytes({x, w, b, y}), [=] { sink = ops::conv2d(x, w, b); }});
  }
  {
    Tensor x = randn({64, 64, 24, 24});
    MaxPoolResult mp = ops::max_pool2d_with_indices(x, {});
    cs.push_back({"cnn", "ReLU forward", "[64,64,24,24]", 0, 2 * nbytes({x}), [=] { sink = ops::relu(x); }});
    Tensor y = x.clone();  // relu_ rewrites it: after the first pass it holds no negatives, which costs the same
    cs.push_back({"cnn", "ReLU forward in place (relu_)", "[64,64,24,24]", 0, 2 * nbytes({y}), [=] { ops::relu_(y); }});
    cs.push_back({"cnn", "max pool 2x2 forward", "[64,64,24,24]", 0, nbytes({x, mp.out, mp.indices}),
                  [=] { sink = ops::max_pool2d_with_indices(x, {}).out; }});
    cs.push_back({"cnn", "max pool 2x2 backward", "[64,64,24,24]", 0, nbytes({mp.out, mp.indices, x}),
                  [=] { sink = ops::max_pool2d_backward(mp.out, mp.indices, x.shape()); }});
  }
  add_linear(cs, "cnn", 64, 9216, 128);
  add_adamw(cs, "cnn", 1199882);

  // A large square GEMM for reference: what the GEMM reaches when its shape is not the limit.
  {
    Tensor a = randn({1024, 1024}), b = randn({1024, 1024});
    cs.push_back({"ref", "matmul 1024^3", "1024x1024x1024", 2.0 * 1024 * 1024 * 1024, 3 * nbytes({a}),
                  [=] { sink = ops::matmul(a, b); }});
  }
  return cs;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::vector<int> parse_threads(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    const long v = std::strtol(p, &end, 10);
    if (end == p || v < 1 || v > 1024) {
      std::fprintf(stderr, "cpu_roofline: --threads takes a comma-separated list of integers in [1, 1024]\n");
      std::exit(2);
    }
    out.push_back(static_cast<int>(v));
    p = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') {
      std::fprintf(stderr, "cpu_roofline: bad --threads list '%s'\n", s);
      std::exit(2);
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> thread_counts{1, 2};
  bool json = false;
  int rounds = 5;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      thread_counts = parse_threads(argv[++i]);
    } else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
      if (rounds < 1 || rounds > 100) {
        std::fprintf(stderr, "cpu_roofline: --rounds takes an integer in [1, 100]\n");
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--quick")) {
      g_min_rep_seconds = 0.005;
      rounds = 1;
    } else if (!std::strcmp(argv[i], "--json")) {
      json = true;
    } else {
      std::fprintf(stderr, "usage: cpu_roofline [--threads 1,2] [--rounds 5] [--quick] [--json]\n");
      return 2;
    }
  }
  const std::vector<Case> cases = make_cases();
  for (int threads : thread_counts) {
    set_num_threads(threads);
    // Rounds over the whole list, so a burst of another tenant's load spoils one round of a kernel, not all of them;
    // such load only adds time, so a kernel's time is its best round (each the median of 5 repetitions) and a
    // ceiling its best round too.
    double peak = 0, dram = 0;
    std::vector<std::vector<double>> times(cases.size()), bws(cases.size());
    for (int r = 0; r < rounds; ++r) {
      peak = std::max(peak, peak_flops());
      dram = std::max(dram, stream_bandwidth(512.0 * (1 << 20)));
      for (size_t i = 0; i < cases.size(); ++i) {
        times[i].push_back(median_seconds(cases[i].run));
        bws[i].push_back(stream_bandwidth(cases[i].footprint > 0 ? cases[i].footprint : cases[i].bytes));
      }
    }
    if (!json) {
      std::printf("\n### %d thread%s: peak %.1f GFLOP/s (%s), stream bandwidth %.1f GB/s over 512 MiB\n\n", threads,
                  threads == 1 ? "" : "s", peak / 1e9, kPeakIsa, dram / 1e9);
      std::printf(
          "| config | kernel | shape | MFLOP | KiB moved | FLOP/B | ms | GFLOP/s | GB/s | stream GB/s there "
          "| bound | %% of roof |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|\n");
    }
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      const double s = *std::min_element(times[i].begin(), times[i].end());
      const double bw = *std::max_element(bws[i].begin(), bws[i].end());
      const double t_compute = c.flops / peak, t_memory = c.bytes / bw;
      const double floor = std::max(t_compute, t_memory);
      const char* bound = t_compute >= t_memory ? "compute" : "memory";
      if (json) {
        std::printf(
            "{\"threads\":%d,\"config\":\"%s\",\"kernel\":\"%s\",\"flops\":%.0f,\"bytes\":%.0f,\"seconds\":%.9f,"
            "\"peak_flops\":%.4g,\"stream_bytes_per_s\":%.4g,\"bound\":\"%s\",\"fraction_of_roof\":%.4f}\n",
            threads, c.config.c_str(), c.kernel.c_str(), c.flops, c.bytes, s, peak, bw, bound, floor / s);
      } else {
        std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c.config.c_str(),
                    c.kernel.c_str(), c.shape.c_str(), c.flops > 0 ? fmt("%.1f", c.flops / 1e6).c_str() : "—",
                    fmt("%.0f", c.bytes / 1024).c_str(), c.flops > 0 ? fmt("%.1f", c.flops / c.bytes).c_str() : "—",
                    fmt("%.3f", s * 1e3).c_str(), c.flops > 0 ? fmt("%.1f", c.flops / s / 1e9).c_str() : "—",
                    fmt("%.1f", c.bytes / s / 1e9).c_str(), fmt("%.1f", bw / 1e9).c_str(), bound,
                    fmt("%.0f%%", 100.0 * floor / s).c_str());
      }
    }
    std::fflush(stdout);
  }
  return 0;
}
