// CPU int8 kernels: per-channel symmetric quantization / dequantization, the weight-only int8 linear (weight rows
// dequantized a block at a time into allocator scratch and multiplied by the CPU bmm kernel), and the int8 x int8
// linear with int32 accumulation. Invariant: no kernel here holds more than kInt8DequantBlockBytes (or one row) of
// dequantized weight; every scratch byte comes from the host allocator (Note [Kernel workspace] in conv_pool.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "ember/kernels/cpu/meta_workspace.h"
#include "ember/kernels/ops_quant.h"

namespace ember::kernels::cpu {
namespace {

// ---- quantize / dequantize (Note [Symmetric per-channel int8] in ops_quant.h) -----------------------------------------

template <class T>
void quantize_typed(const Tensor& w, const Tensor& q, const Tensor& scale) {
  const int64_t o = w.size(0), r = w.size(1);
  const T* wp = static_cast<const T*>(w.raw_data());
  int8_t* qp = static_cast<int8_t*>(q.raw_data());
  float* sp = static_cast<float*>(scale.raw_data());
  for (int64_t i = 0; i < o; ++i) {
    const T* row = wp + i * r;
    double amax = 0.0;
    for (int64_t j = 0; j < r; ++j) {
      const double v = static_cast<double>(static_cast<op_math_t<T>>(row[j]));
      EMBER_CHECK(std::isfinite(v), ValueError, "quantize_per_channel_symmetric: row ", i, " holds a non-finite value (",
                  v, ") at index ", j, "; int8 quantization needs finite weights");
      amax = std::max(amax, std::fabs(v));
    }
    // An f64 row beyond f32's range would give an infinite (and, cast from double, undefined) f32 scale.
    EMBER_CHECK(amax <= static_cast<double>(std::numeric_limits<float>::max()), ValueError,
                "quantize_per_channel_symmetric: row ", i, " has max |w| = ", amax,
                ", beyond the f32 range of the scales");
    float s = static_cast<float>(amax) / 127.0f;
    if (!(s > 0.0f)) s = 1.0f;  // zero row (or an underflowing maximum): q = 0, dequantized exactly to 0
    sp[i] = s;
    const double sd = s;
    for (int64_t j = 0; j < r; ++j) {
      const double v = static_cast<double>(static_cast<op_math_t<T>>(row[j]));
      const double qv = std::clamp(std::nearbyint(v / sd), -127.0, 127.0);  // round half to even (FE_TONEAREST)
      qp[i * r + j] = static_cast<int8_t>(qv);
    }
  }
}

void quantize_kernel(const Tensor& w, const Tensor& q, const Tensor& scale) {
  EMBER_DISPATCH_FLOAT(w.dtype(), "quantize_per_channel_symmetric", [&] { quantize_typed<scalar_t>(w, q, scale); });
}

template <class T>
void dequantize_typed(const Tensor& q, const Tensor& scale, const Tensor& out) {
  const int64_t o = q.size(0), r = q.size(1);
  const int8_t* qp = static_cast<const int8_t*>(q.raw_data());
  const float* sp = static_cast<const float*>(scale.raw_data());
  T* op = static_cast<T*>(out.raw_data());
  for (int64_t i = 0; i < o; ++i)
    for (int64_t j = 0; j < r; ++j) {
      op[i * r + j] = T(static_cast<op_math_t<T>>(qp[i * r + j]) * static_cast<op_math_t<T>>(sp[i]));
    }
}

void dequantize_kernel(const Tensor& q, const Tensor& scale, const Tensor& out) {
  EMBER_DISPATCH_FLOAT(out.dtype(), "dequantize_per_channel", [&] { dequantize_typed<scalar_t>(q, scale, out); });
}

// ---- weight-only int8 linear ------------------------------------------------------------------------------------------

// Note [Blocked dequantization]
// int8_weight_linear never materialises W = q * scale. Rows of x are taken kRowChunk at a time (widened to f32 for
// f16/bf16 inputs); for each chunk the weight is walked in tiles of nb rows x kb columns (nb * kb * sizeof(acc) <=
// kInt8DequantBlockBytes): each tile is dequantized into one scratch block and multiplied by the CPU bmm kernel with
// the matching [chunk, kb] slice of x. When whole rows fit with at least kTileRows of them, kb = K and the product
// is the result; otherwise nb = min(N, kTileRows) and the K tiles' products are summed into an accumulator (a narrow
// [chunk, K] x [K, few] product would be bound by reading x once per few output columns). The chunk's result is
// written (+ bias, rounded to out's dtype) into its columns of out. Re-dequantizing the weight once per chunk costs
// N*K operations against the chunk's kRowChunk*N*K multiply-adds. Workspace: tile + accumulator (+ tile product when
// K is split) (+ f16/bf16 staging) + the bmm's own, all from the allocator.
constexpr int64_t kRowChunk = 128;
constexpr int64_t kTileRows = 64;

struct LinearBlocking {
  int64_t mb, nb, kb;  // rows of x per chunk; weight rows and columns per dequantized tile
};
LinearBlocking linear_blocking(int64_t m, int64_t n, int64_t k, int64_t acc_size) {
  const int64_t rows_fit = kInt8DequantBlockBytes / (k * acc_size);
  if (rows_fit >= std::min(n, kTileRows)) return {std::min(m, kRowChunk), std::min(rows_fit, n), k};
  const int64_t nb = std::min(n, kTileRows);
  return {std::min(m, kRowChunk), nb, std::clamp<int64_t>(kInt8DequantBlockBytes / (nb * acc_size), 1, k)};
}

template <class T>
void weight_linear_typed(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& bias,
                         const Tensor& out) {
  using acc_t = op_math_t<T>;  // float for f32/f16/bf16, double for f64
  constexpr bool kWiden = !std::is_same_v<acc_t, T>;
  const int64_t m = x.size(0), k = x.size(1), n = q.size(0);
  const TensorOptions acc_opts(dtype_of_v<acc_t>, Device::cpu());
  const acc_t* sp = static_cast<const acc_t*>(scale.raw_data());
  const acc_t* bp = bias.defined() ? static_cast<const acc_t*>(bias.raw_data()) : nullptr;
  T* op = static_cast<T*>(out.raw_data());
  if (k == 0) {  // empty sums: out = bias (or 0)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) op[i * n + j] = T(bp ? bp[j] : acc_t(0));
    return;
  }
  const LinearBlocking b = linear_blocking(m, n, k, sizeof(acc_t));
  const bool split_k = b.kb < k;
  const Tensor tile = empty({b.nb, b.kb}, acc_opts);                      // dequantized weight tile
  const Tensor accum = empty({b.mb * b.nb}, acc_opts);                    // one chunk x row block result
  const Tensor prod = split_k ? empty({b.mb * b.nb}, acc_opts) : Tensor();  // one K tile's product
  const Tensor staging = kWiden ? empty({b.mb, k}, acc_opts) : Tensor();
  acc_t* tp = static_cast<acc_t*>(tile.raw_data());
  acc_t* ap = static_cast<acc_t*>(accum.raw_data());
  const acc_t* pp = split_k ? static_cast<const acc_t*>(prod.raw_data()) : nullptr;
  const int8_t* qp = static_cast<const int8_t*>(q.raw_data());
  const T* xp = static_cast<const T*>(x.raw_data());
  const BmmFn gemm = bmm_stub.get(DeviceType::CPU);

  for (int64_t m0 = 0; m0 < m; m0 += b.mb) {
    const int64_t mc = std::min(b.mb, m - m0);
    Tensor xa;  // [mc, K] in acc_t
    if constexpr (kWiden) {
      acc_t* st = static_cast<acc_t*>(staging.raw_data());
      for (int64_t e = 0; e < mc * k; ++e) st[e] = static_cast<acc_t>(xp[m0 * k + e]);
      xa = staging.narrow(0, 0, mc);
    } else {
      xa = x.narrow(0, m0, mc);
    }
    for (int64_t n0 = 0; n0 < n; n0 += b.nb) {
      const int64_t nc = std::min(b.nb, n - n0);
      for (int64_t k0 = 0; k0 < k; k0 += b.kb) {
        const int64_t kc = std::min(b.kb, k - k0);
        for (int64_t i = 0; i < nc; ++i) {
          const int8_t* qr = qp + (n0 + i) * k + k0;
          const acc_t s = sp[n0 + i];
          acc_t* dst = tp + i * kc;
          for (int64_t j = 0; j < kc; ++j) dst[j] = static_cast<acc_t>(qr[j]) * s;
        }
        const Tensor wt = tile.view({-1}).narrow(0, 0, nc * kc).view({nc, kc}).t().unsqueeze(0);  // column-major
        const Tensor a = xa.narrow(1, k0, kc).unsqueeze(0);                                     // [1, mc, kc]
        const Tensor& dst = k0 == 0 ? accum : prod;
        gemm(a, wt, dst.narrow(0, 0, mc * nc).view({1, mc, nc}), /*accumulate=*/false);
        if (k0 > 0) {
          for (int64_t e = 0; e < mc * nc; ++e) ap[e] += pp[e];
        }
      }
      for (int64_t i = 0; i < mc; ++i) {
        T* orow = op + (m0 + i) * n + n0;
        const acc_t* rrow = ap + i * nc;
        for (int64_t j = 0; j < nc; ++j) orow[j] = T(bp ? rrow[j] + bp[n0 + j] : rrow[j]);
      }
    }
  }
}

void weight_linear_kernel(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& bias,
                          const Tensor& out) {
  EMBER_DISPATCH_FLOAT(x.dtype(), "int8_weight_linear",
                       [&] { weight_linear_typed<scalar_t>(x, q, scale, bias, out); });
}

// The same workspace on meta (Note [Meta kernels] in kernels/stubs.h), in the CPU kernel's order.
void weight_linear_meta_kernel(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& bias,
                               const Tensor& out) {
  const int64_t m = x.size(0), k = x.size(1), n = q.size(0);
  if (k == 0) return;
  const DType acc = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const LinearBlocking b = linear_blocking(m, n, k, itemsize(acc));
  MetaWorkspace ws;
  ws.take(b.nb * b.kb, acc);
  ws.take(b.mb * b.nb, acc);
  if (b.kb < k) ws.take(b.mb * b.nb, acc);
  if (is_reduced_float(x.dtype())) ws.take(b.mb * k, acc);
  // The bmm calls: the first chunk, row block and K tile have the largest shapes; each call frees its workspace.
  // x's slice is row-major with row stride K; the tile's transpose is column-major with column stride kb.
  replay_bmm_workspace(acc, 1, b.mb, b.kb, b.nb, k, 1, 1, b.kb);
}

// ---- int8 x int8 linear ------------------------------------------------------------------------------------------------

// Note [Int8 dot products]
// out[m, n] = float(acc) * (act_scale * scale[n]) + bias[n] with acc = sum_k int32(qx[m, k]) * int32(q[n, k]),
// exact in int32 for K <= kInt8DotMaxK. x is quantized kRowChunk rows at a time into an int8 scratch chunk
// (x / act_scale in f64, rounded half to even, clamped to +-127), and each chunk row is dotted with four weight rows
// at a time so that the activation row is loaded once per four outputs.
inline int32_t dot_i8(const int8_t* a, const int8_t* b, int64_t k) {
  int32_t acc = 0;
  for (int64_t j = 0; j < k; ++j) acc += static_cast<int32_t>(a[j]) * static_cast<int32_t>(b[j]);
  return acc;
}

void dynamic_linear_kernel(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& bias, bool dynamic,
                           float act_scale, const Tensor& out) {
  const int64_t m = x.size(0), k = x.size(1), n = q.size(0);
  const float* xp = static_cast<const float*>(x.raw_data());
  const int8_t* qp = static_cast<const int8_t*>(q.raw_data());
  const float* sp = static_cast<const float*>(scale.raw_data());
  const float* bp = bias.defined() ? static_cast<const float*>(bias.raw_data()) : nullptr;
  float* op = static_cast<float*>(out.raw_data());
  if (dynamic) {
    float amax = 0.0f;  // a NaN is skipped here and rejected below
    for (int64_t e = 0; e < m * k; ++e) amax = std::max(amax, std::fabs(xp[e]));
    act_scale = amax / 127.0f;
    if (!(act_scale > 0.0f)) act_scale = 1.0f;  // all-zero input (Note [Symmetric per-channel int8])
  }
  const double scale_d = static_cast<double>(act_scale);
  const int64_t mb = std::min(m, kRowChunk);
  const Tensor chunk = empty({std::max<int64_t>(mb * k, 1)}, TensorOptions(DType::i8, Device::cpu()));
  int8_t* qx = static_cast<int8_t*>(chunk.raw_data());
  for (int64_t m0 = 0; m0 < m; m0 += mb) {
    const int64_t mc = std::min(mb, m - m0);
    for (int64_t e = 0; e < mc * k; ++e) {
      const float xv = xp[m0 * k + e];
      EMBER_CHECK(std::isfinite(xv), ValueError, "int8_dynamic_linear: the input holds a non-finite value (", xv,
                  ") at row ", m0 + e / k, ", column ", e % k);
      const double v = std::nearbyint(static_cast<double>(xv) / scale_d);
      qx[e] = static_cast<int8_t>(std::clamp(v, -127.0, 127.0));
    }
    for (int64_t i = 0; i < mc; ++i) {
      const int8_t* xr = qx + i * k;
      float* orow = op + (m0 + i) * n;
      int64_t j = 0;
      for (; j + 4 <= n; j += 4) {
        const int8_t* w0 = qp + j * k;
        const int8_t* w1 = w0 + k;
        const int8_t* w2 = w1 + k;
        const int8_t* w3 = w2 + k;
        int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        for (int64_t t = 0; t < k; ++t) {
          const int32_t xv = xr[t];
          a0 += xv * w0[t];
          a1 += xv * w1[t];
          a2 += xv * w2[t];
          a3 += xv * w3[t];
        }
        const int32_t acc[4] = {a0, a1, a2, a3};
        for (int u = 0; u < 4; ++u)
          orow[j + u] = static_cast<float>(acc[u]) * (act_scale * sp[j + u]) + (bp ? bp[j + u] : 0.0f);
      }
      for (; j < n; ++j)
        orow[j] = static_cast<float>(dot_i8(xr, qp + j * k, k)) * (act_scale * sp[j]) + (bp ? bp[j] : 0.0f);
    }
  }
}

void dynamic_linear_meta_kernel(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& bias,
                                bool dynamic, float act_scale, const Tensor& out) {
  MetaWorkspace ws;
  ws.take(std::max<int64_t>(std::min(x.size(0), kRowChunk) * x.size(1), 1), DType::i8);
}

}  // namespace

EMBER_REGISTER_KERNEL(quantize_per_channel, DeviceType::CPU, quantize_kernel);
EMBER_REGISTER_KERNEL(dequantize_per_channel, DeviceType::CPU, dequantize_kernel);
EMBER_REGISTER_KERNEL(int8_weight_linear, DeviceType::CPU, weight_linear_kernel);
EMBER_REGISTER_KERNEL(int8_weight_linear, DeviceType::Meta, weight_linear_meta_kernel);
EMBER_REGISTER_KERNEL(int8_dynamic_linear, DeviceType::CPU, dynamic_linear_kernel);
EMBER_REGISTER_KERNEL(int8_dynamic_linear, DeviceType::Meta, dynamic_linear_meta_kernel);

}  // namespace ember::kernels::cpu
