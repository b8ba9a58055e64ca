// Launchers of the flash attention kernels (attention_flash.cu) for the CUDA attention entry points (attention.cu).
// Invariant: callers pass a contiguous qkv [B, T, 3 C] of f16/bf16 with C / H covered by flash_attention_supported
// (attention.h), lse [B, H, T] f32, 16-byte aligned qkv and grad_out, and have made `device` current.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ember/core/dtype.h"
#include "ember/kernels/cuda/attention.h"

namespace ember::cuda {

// Adds one to flash_attention_calls() (attention.h).
void count_flash_attention_call();

// Whether the flash kernels run this call: the Flash strategy, dtype and head size covered, qkv 16-byte aligned, sm_80
// or later; qkv alone decides (Note [One attention path a call] in attention.cu). The kernels also need the result
// (out, grad_qkv) 4-byte aligned, the backward's grad_out 16-byte aligned and `out`, when passed, 4-byte aligned: the
// caller stages or copies what is not.
bool flash_attention_applies(DType dtype, const FlashShape& s, const void* qkv, int device);

// out [B, T, C] and lse [B, H, T] of qkv (f32 lse, natural log of the scaled scores' exponential sums).
void flash_attention_forward(DType dtype, const FlashShape& s, bool causal, const void* qkv, void* out, float* lse,
                             int device, cudaStream_t stream);
// grad_qkv [B, T, 3 C] of grad_out [B, T, C], recomputing the weights from lse; `out` is the forward's output
// [B, T, C] or nullptr (then recomputed, two more tile products per tile pair).
void flash_attention_backward(DType dtype, const FlashShape& s, bool causal, const void* grad_out, const void* qkv,
                              const void* out, const float* lse, void* grad_qkv, int device, cudaStream_t stream);

}  // namespace ember::cuda
