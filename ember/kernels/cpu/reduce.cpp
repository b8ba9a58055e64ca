// CPU reduction kernel: the input's kept dims index the (contiguous, keepdim-shaped) output in row-major order and
// the reduced dims are walked per output element. Floating sums accumulate in double (the reference path), integer
// sums in int64; var is two-pass (mean, then squared deviations); max/min/argmax/argmin propagate NaN.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "ember/core/parallel.h"
#include "ember/kernels/cpu/loops.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {
namespace {

// The reduced dims, coalesced where they are contiguous with each other.
struct ReducedGeometry {
  Shape sizes, strides;  // innermost last
  int64_t numel = 1;
};

ReducedGeometry reduced_geometry(const Tensor& in, const std::vector<int64_t>& dims) {
  ReducedGeometry g;
  for (int64_t d : dims) {
    const int64_t n = in.size(d), s = in.stride(d);
    g.numel *= n;
    if (n == 1) continue;
    if (!g.sizes.empty() && g.strides.back() == s * n) {
      g.sizes.back() *= n;
      g.strides.back() = s;
      continue;
    }
    g.sizes.push_back(n);
    g.strides.push_back(s);
  }
  return g;
}

// Calls f(offset) with the offset of the first element of every innermost run of the reduced dims (g.sizes.back()
// elements, g.strides.back() apart), in row-major order of the outer reduced dims. g has at least one dim.
template <class F>
void for_each_run(const ReducedGeometry& g, F&& f) {
  const int64_t nd = static_cast<int64_t>(g.sizes.size());
  int64_t idx_buf[16] = {};
  std::vector<int64_t> idx_vec;
  int64_t* idx = idx_buf;
  if (nd > 16) {
    idx_vec.assign(static_cast<size_t>(nd), 0);
    idx = idx_vec.data();
  }
  int64_t base = 0;
  while (true) {
    f(base);
    int64_t d = nd - 2;
    for (; d >= 0; --d) {
      ++idx[d];
      base += g.strides[d];
      if (idx[d] < g.sizes[d]) break;
      base -= g.strides[d] * g.sizes[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

// Calls f(element_offset, k) for k = 0 .. numel-1 in row-major order of the reduced dims.
template <class F>
void for_each_reduced(const ReducedGeometry& g, F&& f) {
  if (g.numel == 0) return;
  if (g.sizes.empty()) {
    f(int64_t{0}, int64_t{0});
    return;
  }
  const int64_t inner_n = g.sizes.back(), inner_s = g.strides.back();
  int64_t k = 0;
  for_each_run(g, [&](int64_t base) {
    for (int64_t i = 0; i < inner_n; ++i) f(base + i * inner_s, k++);
  });
}

// The sum of the reduced elements at p as acc_t (double for floating types, int64 for integers), in a fixed order
// that depends only on the geometry (never on threads). When the innermost reduced run is contiguous, each run is
// added in kLanes interleaved partial sums, combined pairwise, then added to the total in run order: independent
// lanes let the compiler vectorise the widening adds, where one running sum waits on each add's latency. Otherwise
// the elements are added one by one in row-major order of the reduced dims (the order sum_columns keeps).
template <class acc_t, class math_t, class T>
acc_t sum_reduced(const ReducedGeometry& g, const T* p) {
  constexpr int64_t kLanes = 8;
  acc_t total = 0;
  if (g.numel == 0) return total;  // an empty input may have no storage
  const int64_t nd = static_cast<int64_t>(g.sizes.size());
  if (nd == 0 || g.strides[nd - 1] != 1) {
    for_each_reduced(g, [&](int64_t off, int64_t) { total += static_cast<acc_t>(static_cast<math_t>(p[off])); });
    return total;
  }
  const int64_t inner_n = g.sizes[nd - 1];
  auto run_sum = [&](const T* q) {  // one contiguous innermost run
    acc_t lane[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= inner_n; i += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) lane[l] += static_cast<acc_t>(static_cast<math_t>(q[i + l]));
    for (; i < inner_n; ++i) lane[i % kLanes] += static_cast<acc_t>(static_cast<math_t>(q[i]));
    for (int64_t w = kLanes / 2; w > 0; w /= 2)
      for (int64_t l = 0; l < w; ++l) lane[l] += lane[l + w];
    return lane[0];
  };
  for_each_run(g, [&](int64_t base) { total += run_sum(p + base); });
  return total;
}

// The sums of n consecutive outputs whose elements sit side by side (unit stride along the outputs, the reduced dims
// strided: a bias gradient's sum over the batch), into acc[0 .. n): each reduced element's row of n is added in
// row-major order of the reduced dims, so each output is summed in sum_reduced's one-by-one order, and the adds run
// along the contiguous row (vectorised) instead of down a strided column per output.
template <class acc_t, class math_t, class T>
void sum_columns(const ReducedGeometry& g, const T* p, int64_t n, acc_t* acc) {
  std::fill(acc, acc + n, acc_t(0));
  for_each_reduced(g, [&](int64_t off, int64_t) {
    const T* row = p + off;
    for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<acc_t>(static_cast<math_t>(row[j]));
  });
}

template <class T>
bool is_nan_value(T v) {
  if constexpr (std::is_floating_point_v<op_math_t<T>>)
    return std::isnan(static_cast<op_math_t<T>>(v));
  else
    return false;
}

template <class T, class OutT>
void reduce_typed(ReduceOp op, const Tensor& in, const Tensor& out, const std::vector<int64_t>& dims,
                  int64_t correction) {
  using math_t = op_math_t<T>;
  constexpr bool kFloat = std::is_floating_point_v<math_t>;
  using acc_t = std::conditional_t<kFloat, double, int64_t>;

  const ReducedGeometry g = reduced_geometry(in, dims);
  // Kept dims: the odometer over them visits outputs in row-major (= contiguous output) order.
  std::vector<bool> is_reduced(static_cast<size_t>(in.dim()), false);
  for (int64_t d : dims) is_reduced[static_cast<size_t>(d)] = true;
  Shape kept_sizes, kept_strides;
  for (int64_t d = 0; d < in.dim(); ++d) {
    if (is_reduced[static_cast<size_t>(d)] || in.size(d) == 1) continue;
    kept_sizes.push_back(in.size(d));
    kept_strides.push_back(in.stride(d));
  }
  const T* src = static_cast<const T*>(in.raw_data());
  OutT* dst = static_cast<OutT*>(out.raw_data());
  const int64_t n_out = out.numel();
  const int64_t nk = static_cast<int64_t>(kept_sizes.size());

  // Outputs are independent (each walks its own reduced elements in the same order), so they are split over the CPU
  // threads; a chunk starts its odometer at its first output.
  const int64_t grain = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(g.numel, 1));
  // Sums over strided rows whose outputs lie side by side in the input take sum_columns (same order per output).
  const bool columns = (op == ReduceOp::Sum || op == ReduceOp::Mean) && src != nullptr && nk > 0 &&
                       kept_strides[nk - 1] == 1 && !g.sizes.empty() && g.strides.back() != 1;
  parallel::parallel_for(n_out, grain, [&](int64_t o_begin, int64_t o_end) {
    std::vector<int64_t> kidx(static_cast<size_t>(nk), 0);
    int64_t base = 0;
    for (int64_t d = nk - 1, rem = o_begin; d >= 0; --d) {
      kidx[d] = rem % kept_sizes[d];
      rem /= kept_sizes[d];
      base += kidx[d] * kept_strides[d];
    }
    if (columns) {
      constexpr int64_t kBlock = 256;
      acc_t acc[kBlock];
      for (int64_t o = o_begin; o < o_end;) {
        // Outputs o .. o+n-1 run along the innermost kept dim (input stride 1) without wrapping.
        const int64_t n = std::min({o_end - o, kept_sizes[nk - 1] - kidx[nk - 1], kBlock});
        sum_columns<acc_t, math_t>(g, src + base, n, acc);
        for (int64_t j = 0; j < n; ++j) {
          if (op == ReduceOp::Mean) {
            if constexpr (kFloat) dst[o + j] = convert<OutT>(acc[j] / static_cast<double>(g.numel));
          } else {
            dst[o + j] = convert<OutT>(acc[j]);
          }
        }
        o += n;
        kidx[nk - 1] += n;
        base += n;
        if (kidx[nk - 1] < kept_sizes[nk - 1]) continue;
        for (int64_t d = nk - 1; d >= 0; --d) {  // carry: the innermost kept dim wrapped
          if (d < nk - 1) {
            ++kidx[d];
            base += kept_strides[d];
          }
          if (kidx[d] < kept_sizes[d]) break;
          base -= kept_strides[d] * kept_sizes[d];
          kidx[d] = 0;
        }
      }
      return;
    }
    for (int64_t o = o_begin; o < o_end; ++o) {
      // An empty input (a reduced dim of size 0) may have no storage: nothing is read, so the offset is not applied.
      const T* p = src == nullptr ? src : src + base;
      switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Mean: {
          const acc_t acc = sum_reduced<acc_t, math_t>(g, p);
          if (op == ReduceOp::Mean) {
            if constexpr (kFloat) dst[o] = convert<OutT>(acc / static_cast<double>(g.numel));
          } else {
            dst[o] = convert<OutT>(acc);
          }
          break;
        }
        case ReduceOp::Var: {
          if constexpr (kFloat) {
            double s = 0.0;
            for_each_reduced(g, [&](int64_t off, int64_t) { s += static_cast<double>(static_cast<math_t>(p[off])); });
            const double m = s / static_cast<double>(g.numel);
            double ss = 0.0;
            for_each_reduced(g, [&](int64_t off, int64_t) {
              const double dv = static_cast<double>(static_cast<math_t>(p[off])) - m;
              ss += dv * dv;
            });
            const double denom = std::max<double>(0.0, static_cast<double>(g.numel - correction));
            dst[o] = convert<OutT>(ss / denom);
          }
          break;
        }
        case ReduceOp::Max:
        case ReduceOp::Min: {
          const bool is_max = op == ReduceOp::Max;
          math_t best = static_cast<math_t>(p[0]);
          for_each_reduced(g, [&](int64_t off, int64_t) {
            const math_t v = static_cast<math_t>(p[off]);
            if (is_nan_value(best)) return;
            if (is_nan_value(v) || (is_max ? v > best : v < best)) best = v;
          });
          dst[o] = convert<OutT>(best);
          break;
        }
        case ReduceOp::ArgMax:
        case ReduceOp::ArgMin: {
          const bool is_max = op == ReduceOp::ArgMax;
          math_t best = static_cast<math_t>(p[0]);
          int64_t best_k = 0;
          for_each_reduced(g, [&](int64_t off, int64_t k) {
            const math_t v = static_cast<math_t>(p[off]);
            if (is_nan_value(best)) return;  // the first NaN wins
            if (is_nan_value(v) || (is_max ? v > best : v < best)) {
              best = v;
              best_k = k;
            }
          });
          dst[o] = static_cast<OutT>(best_k);
          break;
        }
      }
      for (int64_t d = nk - 1; d >= 0; --d) {  // odometer over the kept dims
        ++kidx[d];
        base += kept_strides[d];
        if (kidx[d] < kept_sizes[d]) break;
        base -= kept_strides[d] * kept_sizes[d];
        kidx[d] = 0;
      }
    }
  });
}

void reduce_kernel(ReduceOp op, const Tensor& in, const Tensor& out, const std::vector<int64_t>& dims,
                   int64_t correction) {
  if (out.numel() == 0) return;
  EMBER_DISPATCH_ALL(in.dtype(), "reduce", [&] {
    if (out.dtype() == in.dtype()) {
      reduce_typed<scalar_t, scalar_t>(op, in, out, dims, correction);
    } else {
      EMBER_CHECK(out.dtype() == DType::i64, DTypeError, "reduce: unexpected output dtype ", dtype_name(out.dtype()),
                  " for input ", in.description());
      reduce_typed<scalar_t, int64_t>(op, in, out, dims, correction);
    }
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(reduce, DeviceType::CPU, reduce_kernel);

}  // namespace ember::kernels::cpu
