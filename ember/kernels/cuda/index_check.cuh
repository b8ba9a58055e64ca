// Range check of an i32/i64 index tensor on the device, shared by the CUDA kernels that read memory through indices
// (embedding, embedding_backward, max_pool2d_backward). Invariant: it reports the lowest row-major position whose
// index lies outside [0, bound), the element the CPU kernels' in-order scans stop at, so both devices raise the same
// IndexError; no kernel reads or writes through an index before this check has passed.
#pragma once

#include <cstdint>

#include "ember/base/cuda_check.h"
#include "ember/core/tensor.h"
#include "ember/kernels/cuda/tensor_iter.cuh"

namespace ember::cuda {

// Note [Index checks on the device]
// The CPU kernels raise IndexError for an index outside [0, bound). A CUDA kernel cannot throw, and a device-side
// assert would leave the context unusable, so the entry points check first, in a pass of their own: a small
// grid-stride kernel takes the atomicMin of the positions of bad indices into one 8-byte word of allocator scratch
// (set to all ones by cudaMemsetAsync), the word is copied back and the stream is synchronised. That host
// synchronisation is required by the contract (the error must reach the caller before the op returns) and is the
// only one these ops make: one extra launch, an 8-byte copy and a stream sync per call, a few microseconds of latency
// that drains the queue of launched work but moves no data. Checking before the main kernel, rather than flagging
// bad indices inside it, keeps every later access in bounds and leaves the outputs untouched on error (the CPU's
// embedding_backward writes nothing when an index is bad, and grad_weight is accumulated into). Only on the error
// path is a second 8-byte copy made: the bad index's value, for the message.

struct BadIndex {
  int64_t position = -1;  // row-major position in the index tensor; -1 when every index is in range
  int64_t value = 0;      // the index found there
};

#if defined(__CUDACC__)
template <class Idx>
__global__ void find_bad_index_kernel(const Idx* indices, int64_t n, int64_t bound, OffsetCalculator<1> calc,
                                      unsigned long long* first_bad) {
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) {
    const int64_t k = static_cast<int64_t>(indices[calc.get(i).v[0]]);
    if (k < 0 || k >= bound) atomicMin(first_bad, static_cast<unsigned long long>(i));
  }
}

// The first index of `indices` (i32 or i64, any shape and strides, on a CUDA device) outside [0, bound), in
// row-major order; synchronises `stream` (Note [Index checks on the device]). The caller holds a DeviceGuard.
inline BadIndex find_bad_index(const Tensor& indices, int64_t bound, const char* op, cudaStream_t stream) {
  BadIndex bad;
  const int64_t n = indices.numel();
  if (n == 0) return bad;
  EMBER_CHECK(indices.dtype() == DType::i32 || indices.dtype() == DType::i64, DTypeError, op,
              ": indices must be i32 or i64, got ", indices.description());
  const Tensor scratch = empty({1}, TensorOptions(DType::i64, indices.device()));
  auto* first_bad = static_cast<unsigned long long*>(scratch.raw_data());
  EMBER_CUDA_CHECK(cudaMemsetAsync(first_bad, 0xff, sizeof(unsigned long long), stream));
  const OffsetCalculator<1> calc = make_offset_calculator<1>({&indices}, op);
  const unsigned int blocks = grid_for(n, indices.device().index);
  const bool i64 = indices.dtype() == DType::i64;
  if (i64) {
    find_bad_index_kernel<int64_t><<<blocks, kElementwiseThreads, 0, stream>>>(
        static_cast<const int64_t*>(indices.raw_data()), n, bound, calc, first_bad);
  } else {
    find_bad_index_kernel<int32_t><<<blocks, kElementwiseThreads, 0, stream>>>(
        static_cast<const int32_t*>(indices.raw_data()), n, bound, calc, first_bad);
  }
  EMBER_CUDA_LAUNCH_CHECK();
  unsigned long long first = 0;
  EMBER_CUDA_CHECK(cudaMemcpyAsync(&first, first_bad, sizeof first, cudaMemcpyDeviceToHost, stream));
  EMBER_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (first >= static_cast<unsigned long long>(n)) return bad;
  // Error path: fetch the offending value for the message.
  bad.position = static_cast<int64_t>(first);
  const int64_t offset = calc.get(bad.position).v[0];
  const auto* at = static_cast<const unsigned char*>(indices.raw_data()) + offset * indices.itemsize();
  int64_t v64 = 0;
  int32_t v32 = 0;
  EMBER_CUDA_CHECK(cudaMemcpyAsync(i64 ? static_cast<void*>(&v64) : static_cast<void*>(&v32), at,
                                   static_cast<size_t>(indices.itemsize()), cudaMemcpyDeviceToHost, stream));
  EMBER_CUDA_CHECK(cudaStreamSynchronize(stream));
  bad.value = i64 ? v64 : static_cast<int64_t>(v32);
  return bad;
}
#endif

}  // namespace ember::cuda
