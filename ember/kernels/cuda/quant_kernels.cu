// CUDA int8 kernels (ops_quant.h): per-channel quantize / dequantize, the weight-only linear (tiles dequantized then
// gemm()) and the int8 x int8 linear (dp4a, int32 sums). Invariant: bit-exact with cpu/quant_kernels.cpp where the
// contract is exact; never more than kInt8DequantBlockBytes of dequantized weight; scratch from the caching allocator.
#include <cfloat>
#include <cstdint>

#include "ember/base/cuda_check.h"
#include "ember/kernels/cuda/blas.h"
#include "ember/kernels/cuda/block_reduce.cuh"
#include "ember/kernels/cuda/stream.h"
#include "ember/kernels/cuda/tensor_iter.cuh"
#include "ember/kernels/ops_quant.h"

namespace ember::kernels::cuda {
namespace {

using ::ember::cuda::block_all_reduce;
using ::ember::cuda::DeviceGuard;
using ::ember::cuda::grid_for;
using ::ember::cuda::grid_stride_begin;
using ::ember::cuda::grid_stride_step;
using ::ember::cuda::kElementwiseThreads;
using ::ember::cuda::MatrixRef;
using ::ember::cuda::MaxOp;

// Note [One host sync]
// The CPU kernels reject bad inputs with ValueError (quantize: a non-finite weight, or an f64 row maximum beyond the
// f32 range; int8_dynamic_linear: a non-finite activation). On the GPU the kernels detect them and atomicMin an
// error record, one u64 in a small allocator tensor preset to all ones; the entry point copies those 8 bytes to the
// host and synchronises the stream once per call, after every kernel of the call is enqueued, and raises the same
// ValueError. That copy is the only host synchronisation of this file.
constexpr unsigned long long kNoError = ~0ull;

// Scratch for work queued on `stream`: the allocator reuses its bytes only behind that work (stream-ordered reuse).
Tensor scratch(const Shape& shape, DType dtype, int device, cudaStream_t stream) {
  return empty_on_stream(shape, TensorOptions(dtype, Device::cuda(device)),
                         static_cast<memory::StreamId>(reinterpret_cast<uintptr_t>(stream)));
}

// A record the kernels can atomicMin into (preset to kNoError on `stream`).
Tensor make_error_record(int device, cudaStream_t stream) {
  Tensor rec = scratch({8}, DType::u8, device, stream);
  EMBER_CUDA_CHECK(cudaMemsetAsync(rec.raw_data(), 0xFF, 8, stream));
  return rec;
}

// Note [One host sync]: waits for the call's kernels and returns the record.
unsigned long long read_error_record(const Tensor& rec, cudaStream_t stream) {
  unsigned long long host = kNoError;
  EMBER_CUDA_CHECK(cudaMemcpyAsync(&host, rec.raw_data(), sizeof host, cudaMemcpyDeviceToHost, stream));
  EMBER_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

unsigned int capped_blocks(int64_t work, int device, int per_sm) {
  const int64_t cap = static_cast<int64_t>(::ember::cuda::device_properties(device).sm_count) * per_sm;
  const int64_t b = work < cap ? work : cap;
  return static_cast<unsigned int>(b < 1 ? 1 : b);
}

// ---- quantize / dequantize (Note [Symmetric per-channel int8] in ops_quant.h) ---------------------------------------

constexpr int kRowThreads = 256;

// Threads per row: the row length rounded up to a warp, at most kRowThreads.
unsigned int row_threads(int64_t cols) {
  const int64_t warps = (cols + 31) / 32;
  return static_cast<unsigned int>(32 * (warps < 1 ? 1 : (warps < kRowThreads / 32 ? warps : kRowThreads / 32)));
}

// One block per row (grid-stride over rows; every loop bound is block-uniform, so the barriers are never divergent).
// amax is the exact max |w| in f64; scale = f32(amax) / 127 in f32 (1 when that is not > 0); q = clamp(rint(w /
// scale), -127, 127) with the quotient in f64 and rint rounding half to even, as std::nearbyint does on the CPU.
// A rejected row writes nothing and records (row << 1) | kind, kind 0 = non-finite, 1 = beyond f32 (the CPU checks
// finiteness first, so a row has one kind), so the record's minimum is the row the CPU would report.
template <class T>
__global__ void quantize_rows_kernel(const T* __restrict__ w, int8_t* __restrict__ q, float* __restrict__ scale,
                                     int64_t rows, int64_t cols, unsigned long long* __restrict__ err) {
  __shared__ double slots[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = w + r * cols;
    double amax = 0.0;
    int bad = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const double v = static_cast<double>(static_cast<op_math_t<T>>(row[j]));
      if (isfinite(v))
        amax = fmax(amax, fabs(v));
      else
        bad = 1;
    }
    bad = __syncthreads_or(bad);
    amax = block_all_reduce(amax, MaxOp{}, 0.0, slots);
    if (bad != 0 || amax > static_cast<double>(FLT_MAX)) {  // block-uniform
      if (threadIdx.x == 0) atomicMin(err, (static_cast<unsigned long long>(r) << 1) | (bad != 0 ? 0ull : 1ull));
      continue;
    }
    float s = __fdiv_rn(__double2float_rn(amax), 127.0f);
    if (!(s > 0.0f)) s = 1.0f;  // zero row (or an underflowing maximum): q = 0, dequantized exactly to 0
    if (threadIdx.x == 0) scale[r] = s;
    const double sd = static_cast<double>(s);
    int8_t* qrow = q + r * cols;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const double v = static_cast<double>(static_cast<op_math_t<T>>(row[j]));
      qrow[j] = static_cast<int8_t>(fmin(fmax(rint(v / sd), -127.0), 127.0));
    }
  }
}

// out[i] = q[i] * scale[row of i], the product in op_math_t<T> (f32; f64 for an f64 out), rounded to T.
template <class T>
__global__ void dequantize_kernel(const int8_t* __restrict__ q, const float* __restrict__ scale, T* __restrict__ out,
                                  int64_t n, int64_t cols) {
  using A = op_math_t<T>;
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step())
    out[i] = T(static_cast<A>(q[i]) * static_cast<A>(scale[i / cols]));
}

// ---- weight-only int8 linear ----------------------------------------------------------------------------------------

// Note [Blocked dequantization on the GPU]
// int8_weight_linear never materialises W = q * scale: the weight is walked in tiles of nb rows x kb columns,
// nb * kb * sizeof(x's dtype) <= kInt8DequantBlockBytes (kb = K whenever one row fits: K up to 32Ki for f64, 64Ki
// for f32, 128Ki for f16/bf16), each tile dequantized into one allocator tensor of x's dtype and multiplied by gemm()
// (cuBLASLt, f32 accumulation for f16/bf16, f64 for f64) into its columns out[:, n0:n0+nb] directly; further K tiles of
// the same rows accumulate with beta = 1. The bias is added by one kernel at the end. Differences from the CPU kernel,
// within the tolerances of its dtype: f16/bf16 inputs are multiplied against a tile rounded to x's dtype (the CPU
// widens x and keeps the tile in f32), the product is rounded to x's dtype before the bias add (the CPU rounds once,
// after it), and when K is split (rows longer than a block) the partial sums between K tiles are stored in x's dtype.
// The tile tensor is reused across tiles: the kernels that write it and the GEMMs that read it run in order on one
// stream.

// tile [nc, kc] (row-major) = q[n0 + i, k0 + j] * scale[n0 + i] in A (f32; f64 for f64), rounded to T.
template <class T>
__global__ void dequantize_tile_kernel(const int8_t* __restrict__ q, const op_math_t<T>* __restrict__ scale,
                                       T* __restrict__ tile, int64_t n0, int64_t nc, int64_t k0, int64_t kc,
                                       int64_t k) {
  using A = op_math_t<T>;
  const int64_t total = nc * kc;
  for (int64_t e = grid_stride_begin(); e < total; e += grid_stride_step()) {
    const int64_t i = e / kc, j = e - i * kc;
    tile[e] = T(static_cast<A>(q[(n0 + i) * k + k0 + j]) * scale[n0 + i]);
  }
}

// out [m, n] (flat, total elements): accumulate: out = T(A(out) + bias[col]); else out = T(bias[col]) (or 0 without
// a bias): the K == 0 result.
template <class T>
__global__ void bias_rows_kernel(T* __restrict__ out, const op_math_t<T>* __restrict__ bias, int64_t total, int64_t n,
                                 bool accumulate) {
  using A = op_math_t<T>;
  for (int64_t i = grid_stride_begin(); i < total; i += grid_stride_step()) {
    const A b = bias != nullptr ? bias[i % n] : A(0);
    out[i] = accumulate ? T(static_cast<A>(out[i]) + b) : T(b);
  }
}

template <class T>
void weight_linear_typed(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& bias, const Tensor& out,
                         int device, cudaStream_t stream) {
  using A = op_math_t<T>;
  const int64_t m = x.size(0), k = x.size(1), n = q.size(0);
  const A* sp = static_cast<const A*>(scale.raw_data());
  const A* bp = bias.defined() ? static_cast<const A*>(bias.raw_data()) : nullptr;
  T* op = static_cast<T*>(out.raw_data());
  const int64_t total = m * n;
  if (k == 0) {  // empty sums: out = bias (or 0)
    bias_rows_kernel<T><<<grid_for(total, device), kElementwiseThreads, 0, stream>>>(op, bp, total, n, false);
    EMBER_CUDA_LAUNCH_CHECK();
    return;
  }
  // Note [Blocked dequantization on the GPU]
  const int64_t budget = kInt8DequantBlockBytes / static_cast<int64_t>(sizeof(T));  // tile elements
  const int64_t kb = k < budget ? k : budget;
  const int64_t rows_fit = budget / kb;
  const int64_t nb = rows_fit < n ? rows_fit : n;
  const Tensor tile = scratch({nb * kb}, x.dtype(), device, stream);
  T* tp = static_cast<T*>(tile.raw_data());
  const int8_t* qp = static_cast<const int8_t*>(q.raw_data());
  const T* xp = static_cast<const T*>(x.raw_data());
  for (int64_t n0 = 0; n0 < n; n0 += nb) {
    const int64_t nc = nb < n - n0 ? nb : n - n0;
    for (int64_t k0 = 0; k0 < k; k0 += kb) {
      const int64_t kc = kb < k - k0 ? kb : k - k0;
      dequantize_tile_kernel<T>
          <<<grid_for(nc * kc, device), kElementwiseThreads, 0, stream>>>(qp, sp, tp, n0, nc, k0, kc, k);
      EMBER_CUDA_LAUNCH_CHECK();
      // out[:, n0:n0+nc] (+)= x[:, k0:k0+kc] @ tile^T; tile^T [kc, nc] has element (r, c) at tile + c * kc + r.
      const MatrixRef a{xp + k0, 0, k, 1};
      const MatrixRef b{tp, 0, 1, kc};
      ::ember::cuda::gemm(x.dtype(), 1, m, nc, kc, a, b, op + n0, 0, n, /*alpha=*/1.0, /*beta=*/k0 == 0 ? 0.0 : 1.0,
                          device, stream);
    }
  }
  if (bp != nullptr) {
    bias_rows_kernel<T><<<grid_for(total, device), kElementwiseThreads, 0, stream>>>(op, bp, total, n, true);
    EMBER_CUDA_LAUNCH_CHECK();
  }
}

// ---- int8 x int8 linear ---------------------------------------------------------------------------------------------

// Note [Int8 dot products on the GPU]
// The CPU's math (Note [Int8 dot products] in cpu/quant_kernels.cpp), kernel by kernel on one stream:
//   absmax (dynamic only): max |x| over finite-or-inf values (fmaxf drops a NaN as std::max does on the CPU), one
//     atomicMax per block on the f32 bits (monotonic for non-negative floats) into a device word;
//   act_scale (dynamic only): act_scale = amax / 127 in f32 (1 when not > 0), one float in device memory that the
//     next kernels read, so the host never waits for it;
//   quantize_act: qx = clamp(rint(x / act_scale), -127, 127), the quotient in f64, into an i8 [M, K] allocator tensor;
//     a non-finite x records its flat index (Note [One host sync]);
//   int8_gemm: 64 x 64 output tiles, 256 threads with 4 x 4 outputs each, K in steps of 32 bytes through shared
//     memory (rows padded to 9 words so that the column reads hit 16 distinct banks), __dp4a int32 sums (exact for
//     K <= kInt8DotMaxK), then out = f32(acc) * (act_scale * scale[n]) + bias[n] with __fmul_rn / __fadd_rn: the
//     CPU's operations in its order, never contracted into an FMA (the CPU build uses -ffp-contract=off).
constexpr int kTileM = 64, kTileN = 64, kTileKBytes = 32;
constexpr int kTileKWords = kTileKBytes / 4;
constexpr int kTilePitch = kTileKWords + 1;  // words per shared row (padding against bank conflicts)
constexpr int kGemmThreads = 256;            // 16 x 16; thread (ty, tx) owns rows ty + 16i, columns tx + 16j
static_assert(kTileM == kTileN && kTileM == 4 * 16 && kGemmThreads == 16 * 16, "load_tile and the 4 x 4 outputs");

__device__ __forceinline__ float load_act_scale(const float* act_dev, float act_host) {
  return act_dev != nullptr ? *act_dev : act_host;
}

__global__ void absmax_kernel(const float* __restrict__ x, int64_t n, unsigned int* __restrict__ amax_bits) {
  __shared__ float slots[32];
  float m = 0.0f;
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) m = fmaxf(m, fabsf(x[i]));
  m = block_all_reduce(m, MaxOp{}, 0.0f, slots);
  if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(m));
}

__global__ void act_scale_kernel(const unsigned int* __restrict__ amax_bits, float* __restrict__ act_scale) {
  if (threadIdx.x != 0) return;
  float s = __fdiv_rn(__uint_as_float(*amax_bits), 127.0f);
  if (!(s > 0.0f)) s = 1.0f;  // all-zero input (Note [Symmetric per-channel int8])
  *act_scale = s;
}

__global__ void quantize_act_kernel(const float* __restrict__ x, int8_t* __restrict__ qx, int64_t n,
                                    const float* __restrict__ act_dev, float act_host,
                                    unsigned long long* __restrict__ err) {
  const double sd = static_cast<double>(load_act_scale(act_dev, act_host));
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) {
    const float xv = x[i];
    if (!isfinite(xv)) {
      atomicMin(err, static_cast<unsigned long long>(i));
      qx[i] = 0;
      continue;
    }
    qx[i] = static_cast<int8_t>(fmin(fmax(rint(static_cast<double>(xv) / sd), -127.0), 127.0));
  }
}

// Loads rows r0 .. r0 + 63, bytes k0 .. k0 + 31 of the row-major int8 [rows, k] matrix src into tile [64][kTilePitch]
// words, zero outside the matrix. words: k % 4 == 0 and src 4-byte aligned (a whole word is in or out of range).
__device__ __forceinline__ void load_tile(const int8_t* __restrict__ src, int64_t rows, int64_t k, int64_t r0,
                                          int64_t k0, bool words, int (*tile)[kTilePitch]) {
  const int tid = static_cast<int>(threadIdx.x);
  if (words) {
    for (int w = tid; w < kTileM * kTileKWords; w += kGemmThreads) {
      const int r = w / kTileKWords, c = w % kTileKWords;
      const int64_t gr = r0 + r, gk = k0 + 4 * c;
      tile[r][c] = (gr < rows && gk < k) ? *reinterpret_cast<const int*>(src + gr * k + gk) : 0;
    }
  } else {
    for (int b = tid; b < kTileM * kTileKBytes; b += kGemmThreads) {
      const int r = b / kTileKBytes, c = b % kTileKBytes;
      const int64_t gr = r0 + r, gk = k0 + c;
      reinterpret_cast<int8_t*>(tile[r])[c] = (gr < rows && gk < k) ? src[gr * k + gk] : int8_t(0);
    }
  }
}

__global__ void __launch_bounds__(kGemmThreads)
    int8_gemm_kernel(const int8_t* __restrict__ qx, const int8_t* __restrict__ qw, const float* __restrict__ scale,
                     const float* __restrict__ bias, float* __restrict__ out, int64_t m, int64_t n, int64_t k,
                     const float* __restrict__ act_dev, float act_host, bool words) {
  __shared__ int a_tile[kTileM][kTilePitch];
  __shared__ int b_tile[kTileN][kTilePitch];
  const float act = load_act_scale(act_dev, act_host);
  const int tx = static_cast<int>(threadIdx.x) % 16, ty = static_cast<int>(threadIdx.x) / 16;
  const int64_t tiles_n = (n + kTileN - 1) / kTileN;
  const int64_t tiles = ((m + kTileM - 1) / kTileM) * tiles_n;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {  // block-uniform: the barriers below are not divergent
    const int64_t m0 = (t / tiles_n) * kTileM, n0 = (t % tiles_n) * kTileN;
    int acc[4][4] = {};
    for (int64_t k0 = 0; k0 < k; k0 += kTileKBytes) {
      load_tile(qx, m, k, m0, k0, words, a_tile);
      load_tile(qw, n, k, n0, k0, words, b_tile);
      __syncthreads();
      EMBER_UNROLL
      for (int w = 0; w < kTileKWords; ++w) {
        int av[4], bv[4];
        EMBER_UNROLL
        for (int i = 0; i < 4; ++i) av[i] = a_tile[ty + 16 * i][w];
        EMBER_UNROLL
        for (int j = 0; j < 4; ++j) bv[j] = b_tile[tx + 16 * j][w];
        EMBER_UNROLL
        for (int i = 0; i < 4; ++i) {
          EMBER_UNROLL
          for (int j = 0; j < 4; ++j) acc[i][j] = __dp4a(av[i], bv[j], acc[i][j]);
        }
      }
      __syncthreads();  // the next step's loads overwrite the tiles
    }
    EMBER_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int64_t row = m0 + ty + 16 * i;
      if (row >= m) continue;
      EMBER_UNROLL
      for (int j = 0; j < 4; ++j) {
        const int64_t col = n0 + tx + 16 * j;
        if (col >= n) continue;
        const float prod = __fmul_rn(__int2float_rn(acc[i][j]), __fmul_rn(act, scale[col]));
        out[row * n + col] = __fadd_rn(prod, bias != nullptr ? bias[col] : 0.0f);
      }
    }
  }
}

// ---- entry points ---------------------------------------------------------------------------------------------------

void check_operand(const char* op, const Tensor& t, Device device, DType dtype) {
  EMBER_CHECK(t.device() == device && device.is_cuda(), DeviceError, op, ": the CUDA kernel got ", t.description(),
              " (expected ", device.str(), ")");
  EMBER_CHECK(t.dtype() == dtype, DTypeError, op, ": expected ", dtype_name(dtype), ", got ", t.description());
  EMBER_CHECK(t.is_contiguous(), ValueError, op, ": the CUDA kernel needs contiguous operands, got ", t.description());
}

void quantize_cuda(const Tensor& w, const Tensor& q, const Tensor& scale) {
  const char* op = "quantize_per_channel_symmetric";
  const Device device = w.device();
  check_operand(op, w, device, w.dtype());
  check_operand(op, q, device, DType::i8);
  check_operand(op, scale, device, DType::f32);
  EMBER_CHECK(w.dim() == 2 && q.sizes() == w.sizes() && scale.numel() == w.size(0), ShapeError, op,
              ": expects w [O, R] -> q [O, R], scale [O], got ", w.description(), ", ", q.description(), ", ",
              scale.description());
  const int64_t rows = w.size(0), cols = w.size(1);
  if (rows == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  const Tensor err = make_error_record(device.index, stream);
  auto* err_p = static_cast<unsigned long long*>(err.raw_data());
  EMBER_DISPATCH_FLOAT(w.dtype(), op, [&] {
    quantize_rows_kernel<scalar_t><<<capped_blocks(rows, device.index, 8), row_threads(cols), 0, stream>>>(
        static_cast<const scalar_t*>(w.raw_data()), static_cast<int8_t*>(q.raw_data()),
        static_cast<float*>(scale.raw_data()), rows, cols, err_p);
    EMBER_CUDA_LAUNCH_CHECK();
  });
  const unsigned long long e = read_error_record(err, stream);  // Note [One host sync]
  if (e == kNoError) return;
  const int64_t row = static_cast<int64_t>(e >> 1);
  if ((e & 1ull) == 0)
    EMBER_THROW(ValueError, op, ": row ", row, " holds a non-finite value; int8 quantization needs finite weights");
  EMBER_THROW(ValueError, op, ": row ", row, " has a max |w| beyond the f32 range of the scales");
}

void dequantize_cuda(const Tensor& q, const Tensor& scale, const Tensor& out) {
  const char* op = "dequantize_per_channel";
  const Device device = out.device();
  check_operand(op, q, device, DType::i8);
  check_operand(op, scale, device, DType::f32);
  check_operand(op, out, device, out.dtype());
  EMBER_CHECK(q.dim() == 2 && out.sizes() == q.sizes() && scale.numel() == q.size(0), ShapeError, op,
              ": expects q [O, R], scale [O] -> out [O, R], got ", q.description(), ", ", scale.description(), ", ",
              out.description());
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  EMBER_DISPATCH_FLOAT(out.dtype(), op, [&] {
    dequantize_kernel<scalar_t><<<grid_for(n, device.index), kElementwiseThreads, 0, stream>>>(
        static_cast<const int8_t*>(q.raw_data()), static_cast<const float*>(scale.raw_data()),
        static_cast<scalar_t*>(out.raw_data()), n, q.size(1));
    EMBER_CUDA_LAUNCH_CHECK();
  });
}

// The operands of a linear: x [M, K], q [N, K] i8, scale [N] and bias [N] (or undefined) of `param`, out [M, N] of
// `out_dtype`, all contiguous on one CUDA device.
void check_linear(const char* op, const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& bias,
                  const Tensor& out, DType param, DType out_dtype) {
  const Device device = out.device();
  check_operand(op, x, device, x.dtype());
  check_operand(op, q, device, DType::i8);
  check_operand(op, scale, device, param);
  if (bias.defined()) check_operand(op, bias, device, param);
  check_operand(op, out, device, out_dtype);
  EMBER_CHECK(x.dim() == 2 && q.dim() == 2 && out.dim() == 2 && q.size(1) == x.size(1) && out.size(0) == x.size(0) &&
                  out.size(1) == q.size(0) && scale.numel() == q.size(0) &&
                  (!bias.defined() || bias.numel() == q.size(0)),
              ShapeError, op, ": expects x [M, K], q [N, K], scale [N], bias [N] -> out [M, N], got ", x.description(),
              ", ", q.description(), ", ", scale.description(), ", ",
              bias.defined() ? bias.description() : std::string("no bias"), " -> ", out.description());
}

void weight_linear_cuda(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& bias, const Tensor& out) {
  const char* op = "int8_weight_linear";
  const DType param = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  check_linear(op, x, q, scale, bias, out, param, x.dtype());
  if (out.numel() == 0) return;
  const Device device = out.device();
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  EMBER_DISPATCH_FLOAT(x.dtype(), op,
                       [&] { weight_linear_typed<scalar_t>(x, q, scale, bias, out, device.index, stream); });
}

bool word_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 4 == 0; }

void dynamic_linear_cuda(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& bias, bool dynamic,
                         float act_scale, const Tensor& out) {
  const char* op = "int8_dynamic_linear";
  EMBER_CHECK(x.dtype() == DType::f32, DTypeError, op, ": int8 activations are quantized from f32 inputs, got ",
              x.description());
  check_linear(op, x, q, scale, bias, out, DType::f32, DType::f32);
  const int64_t m = x.size(0), k = x.size(1), n = q.size(0);
  EMBER_CHECK(k <= kInt8DotMaxK, ValueError, op, ": in_features ", k, " exceeds ", kInt8DotMaxK,
              ", the largest K whose int8 x int8 sums fit in int32");
  if (m == 0 || n == 0) return;
  const Device device = out.device();
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  const Tensor err = make_error_record(device.index, stream);
  auto* err_p = static_cast<unsigned long long*>(err.raw_data());
  const float* xp = static_cast<const float*>(x.raw_data());
  const int64_t total = m * k;

  // Note [Int8 dot products on the GPU]: act_scale stays on the device in dynamic mode.
  Tensor act;  // [0, 4): the f32 bits of max |x|; [4, 8): act_scale
  const float* act_dev = nullptr;
  if (dynamic) {
    act = scratch({8}, DType::u8, device.index, stream);
    EMBER_CUDA_CHECK(cudaMemsetAsync(act.raw_data(), 0, 8, stream));
    auto* amax_bits = static_cast<unsigned int*>(act.raw_data());
    float* act_p = reinterpret_cast<float*>(static_cast<unsigned char*>(act.raw_data()) + 4);
    absmax_kernel<<<grid_for(total, device.index), kElementwiseThreads, 0, stream>>>(xp, total, amax_bits);
    EMBER_CUDA_LAUNCH_CHECK();
    act_scale_kernel<<<1, 32, 0, stream>>>(amax_bits, act_p);
    EMBER_CUDA_LAUNCH_CHECK();
    act_dev = act_p;
  }
  const Tensor qx = scratch({total > 0 ? total : 1}, DType::i8, device.index, stream);
  auto* qx_p = static_cast<int8_t*>(qx.raw_data());
  quantize_act_kernel<<<grid_for(total, device.index), kElementwiseThreads, 0, stream>>>(xp, qx_p, total, act_dev,
                                                                                         act_scale, err_p);
  EMBER_CUDA_LAUNCH_CHECK();

  const int8_t* qw = static_cast<const int8_t*>(q.raw_data());
  const bool words = k % 4 == 0 && word_aligned(qx_p) && word_aligned(qw);
  const int64_t tiles = ((m + kTileM - 1) / kTileM) * ((n + kTileN - 1) / kTileN);
  int8_gemm_kernel<<<capped_blocks(tiles, device.index, 16), kGemmThreads, 0, stream>>>(
      qx_p, qw, static_cast<const float*>(scale.raw_data()),
      bias.defined() ? static_cast<const float*>(bias.raw_data()) : nullptr, static_cast<float*>(out.raw_data()), m, n,
      k, act_dev, act_scale, words);
  EMBER_CUDA_LAUNCH_CHECK();

  const unsigned long long e = read_error_record(err, stream);  // Note [One host sync]
  if (e != kNoError) {
    const int64_t i = static_cast<int64_t>(e);
    EMBER_THROW(ValueError, op, ": the input holds a non-finite value at row ", i / k, ", column ", i % k);
  }
}

}  // namespace

EMBER_REGISTER_KERNEL(quantize_per_channel, DeviceType::CUDA, quantize_cuda);
EMBER_REGISTER_KERNEL(dequantize_per_channel, DeviceType::CUDA, dequantize_cuda);
EMBER_REGISTER_KERNEL(int8_weight_linear, DeviceType::CUDA, weight_linear_cuda);
EMBER_REGISTER_KERNEL(int8_dynamic_linear, DeviceType::CUDA, dynamic_linear_cuda);

}  // namespace ember::kernels::cuda
