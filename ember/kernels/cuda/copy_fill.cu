// CUDA kernels behind core's stubs (core_stubs.h): strided copy with dtype cast, fill, arange and Philox draws.
// Invariant: results equal the CPU kernels' (kernels/cpu/copy_fill_random.cpp) bit for bit: casts and fill values
// follow Note [Casts] (kernels/convert.h, the code the CPU uses), arange and random math is done without FMA
// contraction, and draws follow Note [Philox stream] (core/philox.h) and Note [Uniform upper bound] (convert.h).
// Dtypes are runtime arguments, so few kernels are instantiated.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "ember/base/cuda_check.h"
#include "ember/core/core_stubs.h"
#include "ember/core/philox.h"
#include "ember/kernels/cuda/stream.h"
#include "ember/kernels/convert.h"
#include "ember/kernels/cuda/tensor_iter.cuh"

namespace ember::kernels::cuda {
namespace {

using ::ember::cuda::DeviceGuard;
using ::ember::cuda::grid_for;
using ::ember::cuda::grid_stride_begin;
using ::ember::cuda::grid_stride_step;
using ::ember::cuda::kElementwiseThreads;
using ::ember::cuda::make_offset_calculator;
using ::ember::cuda::OffsetCalculator;
using ::ember::cuda::Pack;
using ::ember::cuda::pack_aligned;

// ---- dtype-erased element access ------------------------------------------------------------------------------
// A loaded element in its op_math type: floating values (exact in double) or integers/bool (exact in int64).
struct Value {
  double f;
  int64_t i;
  bool is_float;
};

__device__ __forceinline__ Value load_value(const void* base, DType dt, int64_t off) {
  switch (dt) {
    case DType::f32: return {static_cast<double>(static_cast<const float*>(base)[off]), 0, true};
    case DType::f64: return {static_cast<const double*>(base)[off], 0, true};
    case DType::f16: return {static_cast<double>(static_cast<float>(static_cast<const Half*>(base)[off])), 0, true};
    case DType::bf16:
      return {static_cast<double>(static_cast<float>(static_cast<const BFloat16*>(base)[off])), 0, true};
    case DType::i32: return {0.0, static_cast<const int32_t*>(base)[off], false};
    case DType::i64: return {0.0, static_cast<const int64_t*>(base)[off], false};
    case DType::u8: return {0.0, static_cast<const uint8_t*>(base)[off], false};
    case DType::b8: return {0.0, static_cast<const bool*>(base)[off] ? 1 : 0, false};
    case DType::i8: return {0.0, static_cast<const int8_t*>(base)[off], false};
    case DType::i16: return {0.0, static_cast<const int16_t*>(base)[off], false};
  }
  return {0.0, 0, false};
}

// Note [Casts] (kernels/convert.h): the widened value (double or int64, both exact) converts as the typed source would.
template <class To>
__device__ __forceinline__ To cast_value(const Value& v) {
  return v.is_float ? convert<To>(v.f) : convert<To>(v.i);
}

__device__ __forceinline__ void store_value(void* base, DType dt, int64_t off, const Value& v) {
  switch (dt) {
    case DType::f32: static_cast<float*>(base)[off] = cast_value<float>(v); return;
    case DType::f64: static_cast<double*>(base)[off] = cast_value<double>(v); return;
    case DType::f16: static_cast<Half*>(base)[off] = cast_value<Half>(v); return;
    case DType::bf16: static_cast<BFloat16*>(base)[off] = cast_value<BFloat16>(v); return;
    case DType::i32: static_cast<int32_t*>(base)[off] = cast_value<int32_t>(v); return;
    case DType::i64: static_cast<int64_t*>(base)[off] = cast_value<int64_t>(v); return;
    case DType::u8: static_cast<uint8_t*>(base)[off] = cast_value<uint8_t>(v); return;
    case DType::b8: static_cast<bool*>(base)[off] = cast_value<bool>(v); return;
    case DType::i8: static_cast<int8_t*>(base)[off] = cast_value<int8_t>(v); return;
    case DType::i16: static_cast<int16_t*>(base)[off] = cast_value<int16_t>(v); return;
  }
}

// Unsigned word of each element size, for copies and fills that move bits without looking at them.
template <int Bytes> struct word_of;
template <> struct word_of<1> { using type = uint8_t; };
template <> struct word_of<2> { using type = uint16_t; };
template <> struct word_of<4> { using type = uint32_t; };
template <> struct word_of<8> { using type = uint64_t; };

// ---- kernels ----------------------------------------------------------------------------------------------------

__global__ void cast_copy_kernel(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n,
                                 OffsetCalculator<2> calc) {
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) {
    const auto o = calc.get(i);
    store_value(dst, dst_dtype, o.v[0], load_value(src, src_dtype, o.v[1]));
  }
}

// Note [Dense casts]: between f32 and f16/bf16 (autocast's weight casts, the mixed-precision optimizer's copies),
// with both tensors contiguous and 16-byte aligned, a thread converts 8 elements at a time, read and written as whole
// 16-byte packs (one pack of 8 halves, two of 4 floats), the tail one by one. Same convert<To>(From) as the generic
// kernel, which widens to double first: the result is the same (Note [Casts]), bit for bit.
template <class From, class To>
__global__ void cast_dense_kernel(const From* src, To* dst, int64_t n) {
  constexpr int V = 8, kFrom = Pack<From>::kSize, kTo = Pack<To>::kSize;
  static_assert(V % kFrom == 0 && V % kTo == 0, "whole packs of both types");
  const int64_t steps = n / V;
  for (int64_t i = grid_stride_begin(); i < steps; i += grid_stride_step()) {
    Pack<From> in[V / kFrom];
    EMBER_UNROLL
    for (int k = 0; k < V / kFrom; ++k) in[k] = reinterpret_cast<const Pack<From>*>(src)[i * (V / kFrom) + k];
    Pack<To> out[V / kTo];
    EMBER_UNROLL
    for (int e = 0; e < V; ++e) out[e / kTo].v[e % kTo] = convert<To>(in[e / kFrom].v[e % kFrom]);
    EMBER_UNROLL
    for (int k = 0; k < V / kTo; ++k) reinterpret_cast<Pack<To>*>(dst)[i * (V / kTo) + k] = out[k];
  }
  for (int64_t i = steps * V + grid_stride_begin(); i < n; i += grid_stride_step()) dst[i] = convert<To>(src[i]);
}

template <class From, class To>
void launch_cast_dense(const Tensor& src, const Tensor& dst, cudaStream_t stream) {
  const int64_t n = dst.numel();
  cast_dense_kernel<From, To><<<grid_for(std::max<int64_t>(n / 8, 1), dst.device().index), kElementwiseThreads, 0,
                                stream>>>(static_cast<const From*>(src.raw_data()), static_cast<To*>(dst.raw_data()),
                                          n);
  EMBER_CUDA_LAUNCH_CHECK();
}

// Note [Dense casts]: whether the pair has a dense kernel and both tensors allow it; launches it if so.
bool try_cast_dense(const Tensor& src, const Tensor& dst, cudaStream_t stream) {
  if (!src.is_contiguous() || !dst.is_contiguous() || !pack_aligned(src.raw_data()) || !pack_aligned(dst.raw_data()))
    return false;
  const DType from = src.dtype(), to = dst.dtype();
  if (from == DType::f32 && to == DType::bf16) return launch_cast_dense<float, BFloat16>(src, dst, stream), true;
  if (from == DType::f32 && to == DType::f16) return launch_cast_dense<float, Half>(src, dst, stream), true;
  if (from == DType::bf16 && to == DType::f32) return launch_cast_dense<BFloat16, float>(src, dst, stream), true;
  if (from == DType::f16 && to == DType::f32) return launch_cast_dense<Half, float>(src, dst, stream), true;
  return false;
}

template <class Word>
__global__ void strided_copy_kernel(Word* dst, const Word* src, int64_t n, OffsetCalculator<2> calc) {
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) {
    const auto o = calc.get(i);
    dst[o.v[0]] = src[o.v[1]];
  }
}

template <class Word>
__global__ void fill_kernel(Word* dst, Word value, int64_t n, OffsetCalculator<1> calc) {
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) dst[calc.get(i).v[0]] = value;
}

// Element i = start + i * step in double, rounded once per operation (no FMA), as the CPU computes it.
// int_path: integer dtype with integer start/step, computed exactly in int64 (as the CPU kernel does).
__global__ void arange_kernel(void* dst, DType dtype, double start, double step, int64_t istart, int64_t istep,
                              bool int_path, int64_t n) {
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) {
    if (int_path) {
      store_value(dst, dtype, i, Value{0.0, istart + i * istep, false});
    } else {
      const double v = __dadd_rn(start, __dmul_rn(static_cast<double>(i), step));
      store_value(dst, dtype, i, Value{v, 0, true});
    }
  }
}

// Note [Philox stream]: element i depends only on (seed, offset, i). The affine map runs in the CPU kernel's
// op_math type (double for f64, else float) without FMA contraction, so every device rounds it identically.
__global__ void random_kernel(void* dst, DType dtype, bool normal, double a, double b, uint64_t seed,
                              uint64_t offset, int64_t n) {
  const float af = static_cast<float>(a), bf = static_cast<float>(b);
  const float spanf = bf - af;
  const double span = b - a;
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) {
    const uint64_t k = static_cast<uint64_t>(i);
    const float r = normal ? philox_normal_element(seed, offset, k) : philox_uniform_element(seed, offset, k);
    if (dtype == DType::f64) {
      const double v = normal ? __dadd_rn(a, __dmul_rn(b, static_cast<double>(r)))
                              : __dadd_rn(a, __dmul_rn(span, static_cast<double>(r)));
      static_cast<double*>(dst)[i] = normal ? v : uniform_store<double>(v, a, b);
    } else {
      const float v = normal ? __fadd_rn(af, __fmul_rn(bf, r)) : __fadd_rn(af, __fmul_rn(spanf, r));
      switch (dtype) {  // Note [Uniform upper bound] for uniform draws
        case DType::f32: static_cast<float*>(dst)[i] = normal ? v : uniform_store<float>(v, af, bf); break;
        case DType::f16: static_cast<Half*>(dst)[i] = normal ? Half(v) : uniform_store<Half>(v, af, bf); break;
        case DType::bf16:
          static_cast<BFloat16*>(dst)[i] = normal ? BFloat16(v) : uniform_store<BFloat16>(v, af, bf);
          break;
        default: break;
      }
    }
  }
}

// ---- launchers (grid math, current stream) ----------------------------------------------------------------------

template <int Bytes>
void launch_strided_copy(const Tensor& src, const Tensor& dst, cudaStream_t stream) {
  using Word = typename word_of<Bytes>::type;
  const int64_t n = dst.numel();
  const auto calc = make_offset_calculator<2>({&dst, &src}, "copy");
  strided_copy_kernel<Word><<<grid_for(n, dst.device().index), kElementwiseThreads, 0, stream>>>(
      static_cast<Word*>(dst.raw_data()), static_cast<const Word*>(src.raw_data()), n, calc);
  EMBER_CUDA_LAUNCH_CHECK();
}

template <int Bytes>
void launch_fill(const Tensor& dst, const void* value_bits, cudaStream_t stream) {
  using Word = typename word_of<Bytes>::type;
  Word w;
  std::memcpy(&w, value_bits, sizeof w);
  const int64_t n = dst.numel();
  const auto calc = make_offset_calculator<1>({&dst}, "fill");
  fill_kernel<Word><<<grid_for(n, dst.device().index), kElementwiseThreads, 0, stream>>>(
      static_cast<Word*>(dst.raw_data()), w, n, calc);
  EMBER_CUDA_LAUNCH_CHECK();
}

// ---- entry points (registered in the stubs) ----------------------------------------------------------------------

void check_on_cuda(const char* op, const Tensor& t) {
  EMBER_CHECK(t.device().is_cuda(), DeviceError, op, ": the CUDA kernel got ", t.description());
}

void copy_cuda(const Tensor& src, const Tensor& dst) {
  check_on_cuda("copy", src);
  check_on_cuda("copy", dst);
  EMBER_CHECK(src.sizes() == dst.sizes(), ShapeError, "copy: source ", src.description(), " and destination ",
              dst.description(), " differ in shape");
  EMBER_CHECK(src.device() == dst.device(), DeviceError, "copy: source ", src.description(),
              " and destination ", dst.description(), " are on different devices");
  const int64_t n = dst.numel();
  if (n == 0) return;
  const int device = dst.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = ::ember::cuda::current_stream(device).get();
  if (src.dtype() == dst.dtype()) {
    if (src.raw_data() == dst.raw_data() && src.strides() == dst.strides()) return;  // copy onto itself
    if (src.is_contiguous() && dst.is_contiguous()) {
      EMBER_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), static_cast<size_t>(dst.nbytes()),
                                       cudaMemcpyDeviceToDevice, stream));
      return;
    }
    switch (dst.itemsize()) {
      case 1: launch_strided_copy<1>(src, dst, stream); return;
      case 2: launch_strided_copy<2>(src, dst, stream); return;
      case 4: launch_strided_copy<4>(src, dst, stream); return;
      case 8: launch_strided_copy<8>(src, dst, stream); return;
      default: EMBER_THROW(DTypeError, "copy: unsupported element size ", dst.itemsize(), " of ", dst.description());
    }
  }
  if (try_cast_dense(src, dst, stream)) return;
  const auto calc = make_offset_calculator<2>({&dst, &src}, "copy");
  cast_copy_kernel<<<grid_for(n, device), kElementwiseThreads, 0, stream>>>(dst.raw_data(), dst.dtype(),
                                                                            src.raw_data(), src.dtype(), n, calc);
  EMBER_CUDA_LAUNCH_CHECK();
}

void fill_cuda(const Tensor& dst, Scalar value) {
  check_on_cuda("fill", dst);
  if (dst.numel() == 0) return;
  // The value is converted on the host as the CPU fill kernel converts it (Note [Casts]), then written as raw bits.
  alignas(8) unsigned char bits[8] = {};
  EMBER_DISPATCH_ALL(dst.dtype(), "fill", [&] {
    const scalar_t v = convert_scalar<scalar_t>(value);
    std::memcpy(bits, &v, sizeof v);
  });
  const int device = dst.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = ::ember::cuda::current_stream(device).get();
  switch (dst.itemsize()) {
    case 1: launch_fill<1>(dst, bits, stream); return;
    case 2: launch_fill<2>(dst, bits, stream); return;
    case 4: launch_fill<4>(dst, bits, stream); return;
    case 8: launch_fill<8>(dst, bits, stream); return;
    default: EMBER_THROW(DTypeError, "fill: unsupported element size ", dst.itemsize(), " of ", dst.description());
  }
}

void arange_cuda(const Tensor& dst, Scalar start, Scalar step) {
  check_on_cuda("arange", dst);
  EMBER_CHECK(dst.is_contiguous(), ValueError, "arange: the CUDA kernel needs a contiguous output, got ",
              dst.description());
  const int64_t n = dst.numel();
  if (n == 0) return;
  const int device = dst.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = ::ember::cuda::current_stream(device).get();
  const bool int_path = is_integral(dst.dtype()) && start.is_integral() && step.is_integral();
  arange_kernel<<<grid_for(n, device), kElementwiseThreads, 0, stream>>>(
      dst.raw_data(), dst.dtype(), start.to_double(), step.to_double(), start.to_int(), step.to_int(), int_path, n);
  EMBER_CUDA_LAUNCH_CHECK();
}

void random_cuda(const Tensor& dst, RandomKind kind, double a, double b, uint64_t seed, uint64_t offset) {
  check_on_cuda("random", dst);
  if (!is_floating(dst.dtype())) throw_unsupported_dtype("random", dst.dtype());
  EMBER_CHECK(dst.is_contiguous(), ValueError, "random: the CUDA kernel needs a contiguous output, got ",
              dst.description());
  const int64_t n = dst.numel();
  if (n == 0) return;
  const int device = dst.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = ::ember::cuda::current_stream(device).get();
  random_kernel<<<grid_for(n, device), kElementwiseThreads, 0, stream>>>(
      dst.raw_data(), dst.dtype(), kind == RandomKind::Normal, a, b, seed, offset, n);
  EMBER_CUDA_LAUNCH_CHECK();
}

}  // namespace

EMBER_REGISTER_KERNEL(copy, DeviceType::CUDA, copy_cuda);
EMBER_REGISTER_KERNEL(fill, DeviceType::CUDA, fill_cuda);
EMBER_REGISTER_KERNEL(arange, DeviceType::CUDA, arange_cuda);
EMBER_REGISTER_KERNEL(random, DeviceType::CUDA, random_cuda);

}  // namespace ember::kernels::cuda
