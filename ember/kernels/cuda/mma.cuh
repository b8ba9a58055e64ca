// PTX wrappers of the tensor-core kernels (the hand-written GEMM in tc_gemm.cu, the flash attention in
// attention_flash_kernels.cuh, the Hopper GEMM's epilogue): shared-memory addresses, cp.async, ldmatrix and
// mma.sync.m16n8k16 with f32 accumulators, and pack2 (two floats rounded into one 32-bit word of f16 or bf16).
// Invariant: sm_80 or later at run time (callers check); the fragment layouts are those of Note [Tensor-core GEMM] in
// tc_gemm.cu (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type").
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include "ember/base/host_device.h"
#include "ember/core/dtype.h"
#include "ember/core/half.h"
#include "ember/kernels/cuda/kernel_macros.h"

namespace ember::cuda {

#if defined(__CUDACC__)
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// The same from a generic pointer into shared memory (the form the emulator of tests/harness/simt_emulator.h also
// provides).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) { ldmatrix_x4(r, smem_addr(smem)); }
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  ldmatrix_x4_trans(r, smem_addr(smem));
}

// 16-byte global -> shared copy (cp.async.cg); the bytes past src_bytes (0 or 16) are zero-filled and src is not read
// for them. Completion: cp_async_commit groups the copies issued so far, cp_async_wait<N> waits until at most N groups
// are pending.
__device__ __forceinline__ void cp_async_16(void* dst_smem, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst_smem)), "l"(src), "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// d += A (16 x 16) * B (16 x 8) with f32 accumulation (fragments as in Note [Tensor-core GEMM]).
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, Half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<T, BFloat16>, "f16 or bf16 operands");
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
#endif  // __CUDACC__

// Two floats rounded to nearest even as 16-bit T, `lo` in the low half. On the device by one conversion instruction
// for the pair (the same rounding as core/half.h for every non-NaN value; a NaN may keep another payload).
template <class T>
EMBER_HD_INLINE uint32_t pack2(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, Half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
#else
  return static_cast<uint32_t>(T(lo).bits) | (static_cast<uint32_t>(T(hi).bits) << 16);
#endif
}

}  // namespace ember::cuda
