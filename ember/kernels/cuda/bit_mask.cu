// CUDA kernels of the bit-packed masks (ops_sparse.h): pack a bool mask into bytes, unpack, and zero the elements of
// a floating tensor whose bit is 0. Invariant: bit i of a packed mask is bit i % 8 of byte i / 8 (LSB first), pack
// writes every byte of its output with padding bits 0, and zeroing writes all-zero bits (+0 in every floating dtype).
#include <cstdint>

#include "ember/base/cuda_check.h"
#include "ember/kernels/cuda/stream.h"
#include "ember/kernels/cuda/tensor_iter.cuh"
#include "ember/kernels/ops_sparse.h"

namespace ember::kernels::cuda {
namespace {

using ::ember::cuda::DeviceGuard;
using ::ember::cuda::grid_for;
using ::ember::cuda::grid_stride_begin;
using ::ember::cuda::grid_stride_step;
using ::ember::cuda::kElementwiseThreads;

// ---- kernels ------------------------------------------------------------------------------------------------------

// One thread per output byte: byte b holds the mask elements 8b .. 8b + 7 that exist (n elements in all).
__global__ void pack_mask_kernel(const bool* __restrict__ mask, uint8_t* __restrict__ out, int64_t n, int64_t nbytes) {
  for (int64_t b = grid_stride_begin(); b < nbytes; b += grid_stride_step()) {
    const int64_t first = b * 8;
    const int64_t count = n - first < 8 ? n - first : 8;
    unsigned byte = 0;
    for (int64_t j = 0; j < count; ++j) byte |= mask[first + j] ? (1u << j) : 0u;
    out[b] = static_cast<uint8_t>(byte);
  }
}

// One thread per output element.
__global__ void unpack_mask_kernel(const uint8_t* __restrict__ packed, bool* __restrict__ out, int64_t n) {
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step())
    out[i] = ((packed[i >> 3] >> (i & 7)) & 1u) != 0;
}

// t[i] = 0 (all-zero bits) where bit i is 0; kept elements are not written. Word is an unsigned integer of the
// element's size, so the four floating dtypes take three instantiations.
template <class Word>
__global__ void masked_zero_kernel(Word* __restrict__ t, const uint8_t* __restrict__ packed, int64_t n) {
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step())
    if (((packed[i >> 3] >> (i & 7)) & 1u) == 0) t[i] = Word(0);
}

// ---- entry points ---------------------------------------------------------------------------------------------------

// The layout ops_sparse.cpp guarantees, re-checked because the kernels index flat arrays.
void check_flat(const char* op, const Tensor& t, Device device) {
  EMBER_CHECK(t.device() == device && device.is_cuda(), DeviceError, op, ": the CUDA kernel got ", t.description(),
              " (expected ", device.str(), ")");
  EMBER_CHECK(t.is_contiguous(), ValueError, op, ": the CUDA kernel needs a contiguous tensor, got ", t.description());
}

void pack_mask_cuda(const Tensor& mask, const Tensor& out) {
  const char* op = "pack_mask";
  const Device device = out.device();
  check_flat(op, mask, device);
  check_flat(op, out, device);
  const int64_t n = mask.numel(), nbytes = out.numel();
  EMBER_CHECK(mask.dtype() == DType::b8 && out.dtype() == DType::u8 && nbytes == (n + 7) / 8, ShapeError, op,
              ": expects bool [n] -> u8 [ceil(n / 8)], got ", mask.description(), " -> ", out.description());
  if (nbytes == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  pack_mask_kernel<<<grid_for(nbytes, device.index), kElementwiseThreads, 0, stream>>>(
      static_cast<const bool*>(mask.raw_data()), static_cast<uint8_t*>(out.raw_data()), n, nbytes);
  EMBER_CUDA_LAUNCH_CHECK();
}

void unpack_mask_cuda(const Tensor& packed, const Tensor& out) {
  const char* op = "unpack_mask";
  const Device device = out.device();
  check_flat(op, packed, device);
  check_flat(op, out, device);
  const int64_t n = out.numel();
  EMBER_CHECK(packed.dtype() == DType::u8 && out.dtype() == DType::b8 && packed.numel() * 8 >= n, ShapeError, op,
              ": expects u8 [>= ceil(n / 8)] -> bool [n], got ", packed.description(), " -> ", out.description());
  if (n == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  unpack_mask_kernel<<<grid_for(n, device.index), kElementwiseThreads, 0, stream>>>(
      static_cast<const uint8_t*>(packed.raw_data()), static_cast<bool*>(out.raw_data()), n);
  EMBER_CUDA_LAUNCH_CHECK();
}

template <class Word>
void launch_masked_zero(const Tensor& t, const Tensor& packed, int64_t n, int device, cudaStream_t stream) {
  masked_zero_kernel<Word><<<grid_for(n, device), kElementwiseThreads, 0, stream>>>(
      static_cast<Word*>(t.raw_data()), static_cast<const uint8_t*>(packed.raw_data()), n);
  EMBER_CUDA_LAUNCH_CHECK();
}

void masked_zero_cuda(const Tensor& t, const Tensor& packed) {
  const char* op = "masked_zero_";
  const Device device = t.device();
  check_flat(op, t, device);
  check_flat(op, packed, device);
  const int64_t n = t.numel();
  EMBER_CHECK(is_floating(t.dtype()), DTypeError, op, ": expects a floating tensor, got ", t.description());
  EMBER_CHECK(packed.dtype() == DType::u8 && packed.numel() * 8 >= n, ShapeError, op, ": a packed mask of ", n,
              " elements is u8 [", (n + 7) / 8, "], got ", packed.description());
  if (n == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  switch (t.itemsize()) {
    case 2:
      launch_masked_zero<uint16_t>(t, packed, n, device.index, stream);
      return;
    case 4:
      launch_masked_zero<uint32_t>(t, packed, n, device.index, stream);
      return;
    case 8:
      launch_masked_zero<uint64_t>(t, packed, n, device.index, stream);
      return;
    default:
      throw_unsupported_dtype(op, t.dtype());
  }
}

}  // namespace

EMBER_REGISTER_KERNEL(pack_mask, DeviceType::CUDA, pack_mask_cuda);
EMBER_REGISTER_KERNEL(unpack_mask, DeviceType::CUDA, unpack_mask_cuda);
EMBER_REGISTER_KERNEL(masked_zero, DeviceType::CUDA, masked_zero_cuda);

}  // namespace ember::kernels::cuda
