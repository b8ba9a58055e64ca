// Launchers of the flash attention kernels (attention_flash_kernels.cuh, Note [Flash attention]) for the Flash
// strategy of attention.h: f16/bf16 qkv with head size 32 or 64, every (batch, head, row tile) a block of one launch.
// Invariant: a call runs here only when flash_attention_applies; the forward is one launch and the backward two on
// the caller's stream, the second reading the delta scratch the first wrote.
#include <cstdint>

#include "ember/base/cuda_check.h"
#include "ember/core/tensor.h"
#include "ember/kernels/cuda/attention.h"
#include "ember/kernels/cuda/attention_flash.h"
#include "ember/kernels/cuda/attention_flash_kernels.cuh"
#include "ember/kernels/cuda/device_info.h"

namespace ember::cuda {
namespace {

using flash::FlashParams;
using flash::kThreads;

// ---- launchers --------------------------------------------------------------------------------------------------

unsigned grid_of(const FlashParams& p) {
  const int64_t blocks = flash::flash_blocks(p);
  EMBER_CHECK(blocks <= INT32_MAX, ShapeError, "flash attention: ", blocks, " blocks (B ", p.B, ", H ", p.H, ", T ",
              p.T, ") exceed the grid");
  return static_cast<unsigned>(blocks);
}

template <class T, int HD>
void launch_forward(const FlashParams& p, cudaStream_t stream) {
  flash::flash_forward_kernel<T, HD><<<grid_of(p), kThreads, 0, stream>>>(p);
  EMBER_CUDA_LAUNCH_CHECK();
}

template <class T, int HD>
void launch_backward(const FlashParams& p, cudaStream_t stream) {
  flash::flash_backward_dq_kernel<T, HD><<<grid_of(p), kThreads, 0, stream>>>(p);
  EMBER_CUDA_LAUNCH_CHECK();
  flash::flash_backward_dkdv_kernel<T, HD><<<grid_of(p), kThreads, 0, stream>>>(p);  // reads the delta written above
  EMBER_CUDA_LAUNCH_CHECK();
}

// Runs fn.template operator()<T, HD>() for the call's dtype and head size (flash_attention_supported).
template <class Fn>
void dispatch(DType dtype, int64_t head_dim, Fn&& fn) {
  const bool half = dtype == DType::f16;
  if (head_dim == 32) {
    half ? fn.template operator()<Half, 32>() : fn.template operator()<BFloat16, 32>();
  } else {
    half ? fn.template operator()<Half, 64>() : fn.template operator()<BFloat16, 64>();
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool flash_attention_applies(DType dtype, const FlashShape& s, const void* qkv, int device) {
  return attention_strategy() == AttentionStrategy::Flash && s.H > 0 && s.C % s.H == 0 &&
         flash_attention_supported(dtype, s.C / s.H) && aligned16(qkv) && device_properties(device).major >= 8;
}

void flash_attention_forward(DType dtype, const FlashShape& s, bool causal, const void* qkv, void* out, float* lse,
                             int device, cudaStream_t stream) {
  (void)device;
  FlashParams p = flash::make_params(s, causal);
  p.qkv = static_cast<const uint16_t*>(qkv);
  p.out = static_cast<uint16_t*>(out);
  p.lse = lse;
  dispatch(dtype, s.C / s.H, [&]<class T, int HD>() { launch_forward<T, HD>(p, stream); });
  count_flash_attention_call();
}

void flash_attention_backward(DType dtype, const FlashShape& s, bool causal, const void* grad_out, const void* qkv,
                              const void* out, const float* lse, void* grad_qkv, int device, cudaStream_t stream) {
  const Tensor delta = empty_on_stream({s.B * s.H * s.T}, TensorOptions(DType::f32, Device::cuda(device)),
                                       static_cast<memory::StreamId>(reinterpret_cast<uintptr_t>(stream)));
  FlashParams p = flash::make_params(s, causal);
  p.qkv = static_cast<const uint16_t*>(qkv);
  p.grad_out = static_cast<const uint16_t*>(grad_out);
  p.o = static_cast<const uint16_t*>(out);
  p.out = static_cast<uint16_t*>(grad_qkv);
  p.lse = const_cast<float*>(lse);  // read only by the backward kernels
  p.delta = static_cast<float*>(delta.raw_data());
  dispatch(dtype, s.C / s.H, [&]<class T, int HD>() { launch_backward<T, HD>(p, stream); });
  count_flash_attention_call();
}

}  // namespace ember::cuda
