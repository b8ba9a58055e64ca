// The float64 reference of the fused attention over packed qkv (ops::attention_qkv and its backward, and the flash
// kernels run under the SIMT emulator): naive loops over every (batch, head, query row), and the normalised error
// the attention tests compare with.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace ember::testing {

// out [B, T, C], lse [B, H, T] and grad_qkv [B, T, 3 C] for grad_out [B, T, C], in float64.
struct Reference {
  std::vector<double> out, lse, grad;
};

inline Reference naive_attention(const std::vector<double>& x, const std::vector<double>& go, int64_t B, int64_t T,
                                 int64_t C, int64_t H, bool causal) {
  const int64_t hd = C / H, R = 3 * C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  Reference r{std::vector<double>(static_cast<size_t>(B * T * C), 0.0),
              std::vector<double>(static_cast<size_t>(B * H * T)),
              std::vector<double>(static_cast<size_t>(B * T * R), 0.0)};
  std::vector<double> p(static_cast<size_t>(T)), dp(static_cast<size_t>(T));
  auto qkv_index = [&](int64_t b, int64_t t, int64_t part, int64_t h) {
    return static_cast<size_t>((b * T + t) * R + part * C + h * hd);
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t n = causal ? i + 1 : T;
        const size_t qi = qkv_index(b, i, 0, h);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          const size_t kj = qkv_index(b, j, 1, h);
          double s = 0.0;
          for (int64_t e = 0; e < hd; ++e) s += x[qi + e] * x[kj + e];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < n; ++j) sum += std::exp(p[j] - mx);
        const double lse = mx + std::log(sum);
        r.lse[static_cast<size_t>((b * H + h) * T + i)] = lse;
        const size_t oi = static_cast<size_t>((b * T + i) * C + h * hd);
        double dot = 0.0;  // <d weights, weights> of row i
        for (int64_t j = 0; j < n; ++j) {
          const size_t vj = qkv_index(b, j, 2, h);
          p[j] = std::exp(p[j] - lse);
          double d = 0.0;
          for (int64_t e = 0; e < hd; ++e) {
            r.out[oi + e] += p[j] * x[vj + e];
            d += go[oi + e] * x[vj + e];
          }
          dp[j] = d;
          dot += p[j] * d;
        }
        for (int64_t j = 0; j < n; ++j) {
          const double ds = p[j] * (dp[j] - dot) * scale;  // d score ij
          const size_t kj = qkv_index(b, j, 1, h), vj = qkv_index(b, j, 2, h);
          for (int64_t e = 0; e < hd; ++e) {
            r.grad[qi + e] += ds * x[kj + e];
            r.grad[kj + e] += ds * x[qi + e];
            r.grad[vj + e] += p[j] * go[oi + e];
          }
        }
      }
  return r;
}

// max |actual - expected| / max |expected| (infinite when actual holds a NaN or the sizes differ).
inline double normalised_error(const std::vector<double>& a, const std::vector<double>& expected) {
  if (a.size() != expected.size()) return std::numeric_limits<double>::infinity();
  double diff = 0.0, ref = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(a[i] - expected[i]);
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, d);
    ref = std::max(ref, std::abs(expected[i]));
  }
  return ref > 0.0 ? diff / ref : diff;
}

}  // namespace ember::testing
