// Device-side strided indexing for N-operand elementwise kernels: OffsetCalculator maps a linear (row-major) index
// over the output's shape to an element offset per operand. Built on the host from same-shaped views (inputs already
// expanded, so broadcast dims have stride 0) and passed by value to kernels; plus grid sizing for grid-stride loops.
// Invariant: dims are coalesced exactly as cpu/loops.h does (size-1 dims dropped, a dim merged into its inner
// neighbour when every operand is contiguous across both), so offsets equal the CPU loop's for every operand.
#pragma once

#include <array>
#include <cstdint>

#include "ember/base/error.h"
#include "ember/base/host_device.h"
#include "ember/core/tensor.h"
#include "ember/kernels/cuda/device_info.h"

namespace ember::cuda {

inline constexpr int kMaxIterDims = 8;
inline constexpr int kElementwiseThreads = 256;

// 16 bytes of T, loaded and stored with one 128-bit access (4 f32, 2 f64, 8 f16/bf16): the dense elementwise paths'
// unit (Note [Dense elementwise path] in elementwise.cu). Its pointers must be 16-byte aligned.
template <class T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / static_cast<int>(sizeof(T));
  T v[kSize];
};

// Whether p is 16-byte aligned (a Pack may be read from or written to it).
inline bool pack_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int N>
struct Offsets {
  int64_t v[N];
};

// Note [Offset calculator layout]: dim 0 is the innermost (fastest varying) coalesced dim; sizes[d] and
// strides[d][k] (elements, operand k) for d < dims. `contiguous` means every operand's offset is the linear index.
template <int N>
struct OffsetCalculator {
  int dims = 0;
  bool contiguous = true;
  int64_t sizes[kMaxIterDims] = {};
  int64_t strides[kMaxIterDims][N] = {};

  EMBER_HD_INLINE Offsets<N> get(int64_t linear) const {
    Offsets<N> o;
EMBER_UNROLL
    for (int k = 0; k < N; ++k) o.v[k] = contiguous ? linear : 0;
    if (contiguous) return o;
EMBER_UNROLL
    for (int d = 0; d < kMaxIterDims; ++d) {
      if (d == dims) break;
      int64_t coord = linear;
      if (d + 1 < dims) {  // the outermost dim takes the remaining quotient unchanged
        const int64_t q = linear / sizes[d];
        coord = linear - q * sizes[d];
        linear = q;
      }
EMBER_UNROLL
      for (int k = 0; k < N; ++k) o.v[k] += coord * strides[d][k];
    }
    return o;
  }
};

// Host: coalesces `sizes` with per-operand `strides` (elements) into an OffsetCalculator; ShapeError naming `op`
// when more than kMaxIterDims dims remain after coalescing.
template <int N>
OffsetCalculator<N> make_offset_calculator(const Shape& sizes, const std::array<const Shape*, N>& strides,
                                           const char* op) {
  OffsetCalculator<N> c;
  c.dims = 0;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {  // innermost first
    const int64_t n = sizes[static_cast<size_t>(d)];
    if (n == 1) continue;
    int64_t st[N];
    for (int k = 0; k < N; ++k) st[k] = (*strides[k])[static_cast<size_t>(d)];
    if (c.dims > 0) {
      bool merge = true;
      for (int k = 0; k < N; ++k) merge = merge && st[k] == c.strides[c.dims - 1][k] * c.sizes[c.dims - 1];
      if (merge) {
        c.sizes[c.dims - 1] *= n;
        continue;
      }
    }
    EMBER_CHECK(c.dims < kMaxIterDims, ShapeError, op, ": the CUDA kernel supports at most ", kMaxIterDims,
                " non-mergeable dims, got shape ", shape_str(sizes));
    c.sizes[c.dims] = n;
    for (int k = 0; k < N; ++k) c.strides[c.dims][k] = st[k];
    ++c.dims;
  }
  c.contiguous = c.dims == 0;  // a single element (or none): offset 0 == linear index 0
  if (c.dims == 1) {
    c.contiguous = true;
    for (int k = 0; k < N; ++k) c.contiguous = c.contiguous && c.strides[0][k] == 1;
  }
  return c;
}

// Host: the calculator for same-shaped operands (operands[0] is the output, whose shape is iterated).
template <int N>
OffsetCalculator<N> make_offset_calculator(const std::array<const Tensor*, N>& operands, const char* op) {
  std::array<const Shape*, N> st;
  for (int k = 0; k < N; ++k) {
    EMBER_CHECK(operands[k]->sizes() == operands[0]->sizes(), ShapeError, op, ": operand ", k, " has shape ",
                shape_str(operands[k]->sizes()), " but the output has ", shape_str(operands[0]->sizes()));
    st[k] = &operands[k]->strides();
  }
  return make_offset_calculator<N>(operands[0]->sizes(), st, op);
}

// Blocks for a grid-stride loop over n elements with kElementwiseThreads per block: enough to fill the device a
// few times over, never more than there is work for.
inline unsigned int grid_for(int64_t n, int device) {
  const int64_t needed = (n + kElementwiseThreads - 1) / kElementwiseThreads;
  const int64_t cap = static_cast<int64_t>(device_properties(device).sm_count) * 32;
  const int64_t blocks = needed < cap ? needed : cap;
  return static_cast<unsigned int>(blocks < 1 ? 1 : blocks);
}

#if defined(__CUDACC__) || defined(EMBER_SIMT_EMULATION)
// First index and step of a grid-stride loop (int64 so that tensors beyond 2^31 elements index correctly).
__device__ __forceinline__ int64_t grid_stride_begin() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride_step() { return static_cast<int64_t>(blockDim.x) * gridDim.x; }
#endif

}  // namespace ember::cuda
