// CUDA embedding kernels, registered for the `embedding` (row gather) and `embedding_backward` (row scatter-add)
// stubs; weights, gradients and indices of any strides. Invariant: every index is checked against V before any row
// is touched (Note [Index checks on the device]), and the backward sums each weight row's gradients in the CPU
// kernel's order in op_math_t, starting from the row's current value and rounding once: results equal the CPU's bit
// for bit and do not depend on scheduling (Note [Deterministic embedding backward]).
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "ember/base/cuda_check.h"
#include "ember/kernels/cuda/index_check.cuh"
#include "ember/kernels/cuda/stream.h"
#include "ember/kernels/cuda/tensor_iter.cuh"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cuda {
namespace {

using ::ember::cuda::BadIndex;
using ::ember::cuda::DeviceGuard;
using ::ember::cuda::find_bad_index;
using ::ember::cuda::grid_for;
using ::ember::cuda::grid_stride_begin;
using ::ember::cuda::grid_stride_step;
using ::ember::cuda::kElementwiseThreads;

// Note [Deterministic embedding backward]
// grad_weight[indices[i], :] += grad_out[i, :] has colliding rows whenever an index repeats (a frequent token), so
// per-position atomics would sum in scheduling order, and for f16/bf16 would round after every add or need an f32
// copy of all of grad_weight. Instead the positions are sorted by index (CUB's radix sort, which is stable, keyed on
// the low ceil(log2 V) bits only), so equal indices form runs in increasing position order. One warp owns the run
// that starts at each sorted position (a position whose predecessor has another index) and, lanes over D, adds the
// run's gradient rows to the weight row in op_math_t, starting from the row's current value, and stores it once.
// That is the CPU kernel's order of additions for every element, so f32/f64 results match it bit for bit and f16/bf16
// ones round once, as the CPU's float accumulator does. Workspace (allocator tensors): keys and positions, each in
// and out of the sort (4 x N int64), plus CUB's temporary storage. A run is summed serially by one warp: a single
// index repeated across most of a huge batch makes that warp the long pole, which is acceptable for token batches.
constexpr int kWarp = 32;

// Element-size words: the forward copies rows without looking at the values, so one kernel serves every dtype.
template <int Bytes>
struct word_of;
template <>
struct word_of<1> {
  using type = uint8_t;
};
template <>
struct word_of<2> {
  using type = uint16_t;
};
template <>
struct word_of<4> {
  using type = uint32_t;
};
template <>
struct word_of<8> {
  using type = uint64_t;
};

// The i-th index of the 1-d i32/i64 view (stride `is0`); the dtype flag is uniform across the grid.
__device__ __forceinline__ int64_t load_index(const void* indices, bool i64, int64_t is0, int64_t i) {
  return i64 ? static_cast<const int64_t*>(indices)[i * is0]
             : static_cast<int64_t>(static_cast<const int32_t*>(indices)[i * is0]);
}

// ---- kernels ----------------------------------------------------------------------------------------------------

// out[i, j] = weight[indices[i], j] over the contiguous out [N, D], one thread per element: consecutive threads
// take consecutive j of a row, so the loads of a row (unit column stride) and the stores are coalesced.
template <class Word>
__global__ void embedding_kernel(const Word* weight, int64_t ws0, int64_t ws1, const void* indices, bool i64,
                                 int64_t is0, Word* out, int64_t n, int64_t d) {
  const int64_t total = n * d;
  for (int64_t e = grid_stride_begin(); e < total; e += grid_stride_step()) {
    const int64_t i = e / d, j = e - i * d;
    out[e] = weight[load_index(indices, i64, is0, i) * ws0 + j * ws1];
  }
}

// Sort input: key = the (already checked, so non-negative) index, value = its position.
__global__ void sort_input_kernel(const void* indices, bool i64, int64_t is0, int64_t n, uint64_t* keys,
                                  int64_t* positions) {
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) {
    keys[i] = static_cast<uint64_t>(load_index(indices, i64, is0, i));
    positions[i] = i;
  }
}

// Note [Deterministic embedding backward]: warp w takes sorted position s; only the first of a run works.
template <class T>
__global__ void embedding_backward_kernel(const T* grad_out, int64_t gs0, int64_t gs1, const uint64_t* keys,
                                          const int64_t* positions, int64_t n, int64_t d, T* grad_weight, int64_t ws0,
                                          int64_t ws1) {
  using acc_t = op_math_t<T>;
  const int64_t warps_per_block = blockDim.x / kWarp;
  const int64_t lane = threadIdx.x % kWarp;
  for (int64_t s = static_cast<int64_t>(blockIdx.x) * warps_per_block + threadIdx.x / kWarp; s < n;
       s += static_cast<int64_t>(gridDim.x) * warps_per_block) {
    const uint64_t key = keys[s];
    if (s > 0 && keys[s - 1] == key) continue;  // inside a run: the warp at the run's start owns the row
    T* row = grad_weight + static_cast<int64_t>(key) * ws0;
    for (int64_t j = lane; j < d; j += kWarp) {
      acc_t acc = static_cast<acc_t>(row[j * ws1]);
      for (int64_t t = s; t < n && keys[t] == key; ++t)
        acc += static_cast<acc_t>(grad_out[positions[t] * gs0 + j * gs1]);
      row[j * ws1] = T(acc);
    }
  }
}

// ---- launchers --------------------------------------------------------------------------------------------------

template <int Bytes>
void launch_embedding(const Tensor& weight, const Tensor& indices, const Tensor& out, cudaStream_t stream) {
  using Word = typename word_of<Bytes>::type;
  const int64_t n = out.size(0), d = out.size(1);
  embedding_kernel<Word><<<grid_for(n * d, out.device().index), kElementwiseThreads, 0, stream>>>(
      static_cast<const Word*>(weight.raw_data()), weight.stride(0), weight.stride(1), indices.raw_data(),
      indices.dtype() == DType::i64, indices.stride(0), static_cast<Word*>(out.raw_data()), n, d);
  EMBER_CUDA_LAUNCH_CHECK();
}

// Bits that hold every index below v (at least 1): the radix sort looks at no others.
int key_bits(int64_t v) {
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) < v) ++bits;
  return bits;
}

// Sorts the positions by index (Note [Deterministic embedding backward]); `ws` holds keys and positions, in and out.
void sort_by_index(const Tensor& indices, int64_t v, const Tensor& ws, cudaStream_t stream) {
  const int64_t n = indices.size(0);
  const Device device = indices.device();
  auto* base = static_cast<int64_t*>(ws.raw_data());
  uint64_t* keys_in = reinterpret_cast<uint64_t*>(base);
  uint64_t* keys_out = reinterpret_cast<uint64_t*>(base + n);
  int64_t* pos_in = base + 2 * n;
  int64_t* pos_out = base + 3 * n;
  sort_input_kernel<<<grid_for(n, device.index), kElementwiseThreads, 0, stream>>>(
      indices.raw_data(), indices.dtype() == DType::i64, indices.stride(0), n, keys_in, pos_in);
  EMBER_CUDA_LAUNCH_CHECK();
  const int end_bit = key_bits(v);
  size_t temp_bytes = 0;
  EMBER_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, pos_in, pos_out, n, 0, end_bit, stream));
  const Tensor temp = empty({static_cast<int64_t>(temp_bytes) + 1}, TensorOptions(DType::u8, device));
  EMBER_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes, keys_in, keys_out, pos_in, pos_out, n,
                                                   0, end_bit, stream));
}

template <class T>
void launch_embedding_backward(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_weight,
                               cudaStream_t stream) {
  const int64_t n = grad_out.size(0), d = grad_out.size(1), v = grad_weight.size(0);
  const Device device = grad_out.device();
  const Tensor ws = empty({4 * n}, TensorOptions(DType::i64, device));
  sort_by_index(indices, v, ws, stream);
  const auto* base = static_cast<const int64_t*>(ws.raw_data());
  // One warp per sorted position: kElementwiseThreads / kWarp positions per block.
  embedding_backward_kernel<T><<<grid_for(n * kWarp, device.index), kElementwiseThreads, 0, stream>>>(
      static_cast<const T*>(grad_out.raw_data()), grad_out.stride(0), grad_out.stride(1),
      reinterpret_cast<const uint64_t*>(base + n), base + 3 * n, n, d, static_cast<T*>(grad_weight.raw_data()),
      grad_weight.stride(0), grad_weight.stride(1));
  EMBER_CUDA_LAUNCH_CHECK();
}

// ---- entry points -----------------------------------------------------------------------------------------------

void check_on_device(const char* op, const Tensor& t, Device device) {
  EMBER_CHECK(t.device() == device, DeviceError, op, ": the CUDA kernel got ", t.description(), " (expected ",
              device.str(), ")");
}

void check_indices(const char* op, const Tensor& indices, int64_t n) {
  EMBER_CHECK(indices.dtype() == DType::i32 || indices.dtype() == DType::i64, DTypeError, op,
              ": indices must be i32 or i64, got ", indices.description());
  EMBER_CHECK(indices.dim() == 1 && indices.size(0) == n, ShapeError, op, ": indices ", indices.description(),
              " must be 1-d with ", n, " elements");
}

// IndexError in the CPU kernel's words when an index lies outside [0, v) (Note [Index checks on the device]).
void check_index_range(const char* op, const Tensor& indices, int64_t v, cudaStream_t stream) {
  const BadIndex bad = find_bad_index(indices, v, op, stream);
  EMBER_CHECK(bad.position < 0, IndexError, op, ": index ", bad.value, " (at flat position ", bad.position,
              ") is out of range for an embedding of ", v, " rows");
}

void embedding_cuda(const Tensor& weight, const Tensor& indices, const Tensor& out) {
  const char* op = "embedding";
  const Device device = out.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, op, ": the CUDA kernel got ", out.description());
  check_on_device(op, weight, device);
  check_on_device(op, indices, device);
  EMBER_CHECK(weight.dim() == 2 && out.dim() == 2 && out.size(1) == weight.size(1), ShapeError, op, ": weight ",
              weight.description(), " and output ", out.description(), " must be [V, D] and [N, D]");
  check_indices(op, indices, out.size(0));
  EMBER_CHECK(weight.dtype() == out.dtype(), DTypeError, op, ": weight ", weight.description(), " and output ",
              out.description(), " differ in dtype");
  EMBER_CHECK(out.is_contiguous(), ValueError, op, ": the CUDA kernel needs a contiguous output, got ",
              out.description());
  if (out.numel() == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  check_index_range(op, indices, weight.size(0), stream);
  switch (out.itemsize()) {
    case 1:
      return launch_embedding<1>(weight, indices, out, stream);
    case 2:
      return launch_embedding<2>(weight, indices, out, stream);
    case 4:
      return launch_embedding<4>(weight, indices, out, stream);
    case 8:
      return launch_embedding<8>(weight, indices, out, stream);
    default:
      EMBER_THROW(DTypeError, op, ": unsupported element size ", out.itemsize(), " of ", out.description());
  }
}

void embedding_backward_cuda(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_weight) {
  const char* op = "embedding_backward";
  const Device device = grad_weight.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, op, ": the CUDA kernel got ", grad_weight.description());
  check_on_device(op, grad_out, device);
  check_on_device(op, indices, device);
  EMBER_CHECK(grad_out.dim() == 2 && grad_weight.dim() == 2 && grad_out.size(1) == grad_weight.size(1), ShapeError, op,
              ": grad_out ", grad_out.description(), " and grad_weight ", grad_weight.description(),
              " must be [N, D] and [V, D]");
  check_indices(op, indices, grad_out.size(0));
  EMBER_CHECK(grad_out.dtype() == grad_weight.dtype(), DTypeError, op, ": grad_out ", grad_out.description(),
              " and grad_weight ", grad_weight.description(), " differ in dtype");
  if (!is_floating(grad_weight.dtype())) throw_unsupported_dtype(op, grad_weight.dtype());
  if (grad_out.numel() == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  check_index_range(op, indices, grad_weight.size(0), stream);
  EMBER_DISPATCH_FLOAT(grad_weight.dtype(), op,
                       [&] { launch_embedding_backward<scalar_t>(grad_out, indices, grad_weight, stream); });
}

}  // namespace

EMBER_REGISTER_KERNEL(embedding, DeviceType::CUDA, embedding_cuda);
EMBER_REGISTER_KERNEL(embedding_backward, DeviceType::CUDA, embedding_backward_cuda);

}  // namespace ember::kernels::cuda
