// PTX wrappers of the Hopper GEMM (tc_gemm_sm90_kernel.cuh): mbarriers with transaction counts (local and across a
// cluster), TMA tile loads (cp.async.bulk.tensor, plain and multicast to a cluster), cluster rank and barrier,
// warpgroup MMA (wgmma.mma_async m64nNk16 for N = 64, 128, 256, f32 accumulators, both operands in shared memory
// through matrix descriptors) and the register reallocation of warp-specialised kernels (setmaxnreg).
// Invariant: every body is sm_90a code (EMBER_HAS_WGMMA: wgmma and setmaxnreg need the arch-specific target, TMA and
// transaction-count mbarriers sm_90) and compiles to nothing for other targets, where the launcher never runs the
// kernel (wgmma_gemm_supported). tests/harness/simt_emulator.h defines the same names for the CPU.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ember/core/dtype.h"

#if defined(__CUDACC__)
#include <cuda.h>  // CUtensorMap (the type only; the driver entry point is fetched at run time)
#endif

namespace ember::cuda {

// A shared-memory operand of wgmma: start address and the two strides of its matrix descriptor (PTX ISA, "Matrix
// Descriptor Format"; Note [Hopper GEMM] in tc_gemm_sm90_kernel.cuh gives the values the GEMM uses). Always in the
// 128-byte swizzle mode, whose 8-row x 128-byte atoms must start 1024-byte aligned.
struct SmemOperand {
  const void* start;
  uint32_t lbo, sbo;  // leading / stride dimension byte offsets
};

#if defined(__CUDACC__) && !defined(EMBER_SIMT_EMULATION)
using TmaDescriptor = CUtensorMap;

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define EMBER_HAS_WGMMA 1
#endif

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
#if defined(EMBER_HAS_WGMMA)
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#endif
}

// Makes the barriers' initialisation visible to the async proxy (the TMA unit) before any copy signals them.
__device__ __forceinline__ void fence_mbarrier_init() {
#if defined(EMBER_HAS_WGMMA)
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#if defined(EMBER_HAS_WGMMA)
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
#endif
}

// One arrival that also expects `bytes` more bytes of transactions (the TMA copies of this phase).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
#if defined(EMBER_HAS_WGMMA)
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
#endif
}

// True once the phase of parity `parity` has completed.
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, unsigned parity) {
#if defined(EMBER_HAS_WGMMA)
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
#else
  return true;
#endif
}

// Waits for the phase of parity `parity` of bar. A wait of more than kMbarHangNs (no pipeline stage takes more than
// microseconds, even under compute-sanitizer) means the phase will never come, a kernel bug: it traps, so the launch
// fails in seconds with cudaErrorLaunchFailure where a spin would hold the GPU until the test's timeout.
constexpr uint64_t kMbarHangNs = uint64_t{20} * 1000 * 1000 * 1000;
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t = 0;
#if defined(EMBER_HAS_WGMMA)
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
#endif
  return t;
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  if (mbar_try_wait(bar, parity)) return;
  const uint64_t start = global_timer_ns();
  while (!mbar_try_wait(bar, parity)) {
    if (global_timer_ns() - start > kMbarHangNs) __trap();
  }
}

// The box of `map` at coordinates (c0 innermost, c1, c2) into shared memory at dst; completes `bytes` (the whole box,
// out-of-range elements zero-filled) on bar.
__device__ __forceinline__ void tma_load_3d(void* dst, const TmaDescriptor* map, int c0, int c1, int c2,
                                            uint64_t* bar) {
#if defined(EMBER_HAS_WGMMA)
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
#endif
}

// The same box into the shared memory of every block of the cluster whose bit is set in cta_mask, at dst's offset
// there, completing the bytes on the mbarrier at bar's offset in each of those blocks.
__device__ __forceinline__ void tma_load_3d_multicast(void* dst, const TmaDescriptor* map, int c0, int c1, int c2,
                                                      uint64_t* bar, uint16_t cta_mask) {
#if defined(EMBER_HAS_WGMMA)
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
      "[%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "h"(cta_mask)
      : "memory");
#endif
}

// Rank of this block in its cluster (%cluster_ctarank).
__device__ __forceinline__ unsigned cluster_ctarank() {
  unsigned rank = 0;
#if defined(EMBER_HAS_WGMMA)
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
#endif
  return rank;
}

// Every thread of every block of the cluster arrives, then waits for all (release / acquire at cluster scope).
__device__ __forceinline__ void cluster_sync() {
#if defined(EMBER_HAS_WGMMA)
  __syncwarp();  // .aligned: every thread of the warp executes the same barrier instruction
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

// One arrival on the mbarrier at bar's offset in block `rank` of the cluster (this block's own included). The
// default semantics (release at CTA scope) suffice: what the arrival orders is the stage's reads by wgmma, complete at
// the thread's wgmma_wait, before the other block's TMA writes, which wait for the phase. The .release.cluster form
// compiled to a GPU-scope MEMBAR before every arrival, which also waited for the thread's epilogue stores.
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, unsigned rank) {
#if defined(EMBER_HAS_WGMMA)
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_u32(bar)),
      "r"(rank)
      : "memory");
#endif
}

// Register reallocation between the warpgroups of a block (whole warpgroups execute it).
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
#if defined(EMBER_HAS_WGMMA)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
#if defined(EMBER_HAS_WGMMA)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

__device__ __forceinline__ void wgmma_fence() {
#if defined(EMBER_HAS_WGMMA)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(EMBER_HAS_WGMMA)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N committed groups of this warpgroup's wgmma are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(EMBER_HAS_WGMMA)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// Keeps the compiler from moving accesses of the accumulators across this point (a wgmma in flight owns them until
// its wgmma_wait): an empty asm that reads and writes every register of d.
template <int R>
__device__ __forceinline__ void wgmma_fence_operand(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The 64-bit matrix descriptor of `op` in the 128-byte swizzle mode (PTX ISA, "Matrix Descriptor Format"): start
// address, LBO and SBO in 16-byte units (14 bits each), base offset 0 (atoms 1024-byte aligned), mode 1 in bits 62-63.
__device__ __forceinline__ uint64_t smem_descriptor(const SmemOperand& op) {
  return static_cast<uint64_t>((smem_u32(op.start) & 0x3FFFFu) >> 4) |
         (static_cast<uint64_t>((op.lbo & 0x3FFFFu) >> 4) << 16) |
         (static_cast<uint64_t>((op.sbo & 0x3FFFFu) >> 4) << 32) | (uint64_t{1} << 62);
}

#define EMBER_WGMMA_M64N64K16(TYPE, TA, TB) \
  asm volatile( \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " {" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
  "}, %32, %33, p, 1, 1, %35, %36;\n}\n" \
  : \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
  : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA), "n"(TB))
#define EMBER_WGMMA_M64N128K16(TYPE, TA, TB) \
  asm volatile( \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " {" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
  "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, " \
  "%59, %60, %61, %62, %63" \
  "}, %64, %65, p, 1, 1, %67, %68;\n}\n" \
  : \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
  : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA), "n"(TB))
#define EMBER_WGMMA_M64N256K16(TYPE, TA, TB) \
  asm volatile( \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " {" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
  "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, " \
  "%59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, " \
  "%78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, " \
  "%97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, " \
  "%113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
  "}, %128, %129, p, 1, 1, %131, %132;\n}\n" \
  : \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
    "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
    "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
    "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
  : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA), "n"(TB))

// d (64 x N per warpgroup, f32, fragment layout of Note [Hopper GEMM]) = a (64 x 16) @ b (16 x N) + (scale_d ? d : 0),
// for N = 64, 128 or 256, asynchronously: wgmma_commit, then wgmma_wait, before d is read or a, b overwritten. a is
// K-major (kTransA false) or M-major (true); b is N-major (kTransB true) or K-major (false): wgmma's imm-trans-a/b.
template <class T, int N, bool kTransA = false, bool kTransB = true>
__device__ __forceinline__ void wgmma_m64nk16(float (&d)[N / 2], const SmemOperand& a, const SmemOperand& b,
                                              int scale_d) {
  static_assert(N == 64 || N == 128 || N == 256, "N is 64, 128 or 256");
  static_assert(std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, "f16 or bf16 operands");
#if defined(EMBER_HAS_WGMMA)
  const uint64_t desc_a = smem_descriptor(a), desc_b = smem_descriptor(b);
  constexpr bool kHalf = std::is_same_v<T, Half>;
  constexpr int TA = kTransA ? 1 : 0, TB = kTransB ? 1 : 0;
  if constexpr (N == 64) {
    if constexpr (kHalf) {
      EMBER_WGMMA_M64N64K16("f16", TA, TB);
    } else {
      EMBER_WGMMA_M64N64K16("bf16", TA, TB);
    }
  } else if constexpr (N == 128) {
    if constexpr (kHalf) {
      EMBER_WGMMA_M64N128K16("f16", TA, TB);
    } else {
      EMBER_WGMMA_M64N128K16("bf16", TA, TB);
    }
  } else {
    if constexpr (kHalf) {
      EMBER_WGMMA_M64N256K16("f16", TA, TB);
    } else {
      EMBER_WGMMA_M64N256K16("bf16", TA, TB);
    }
  }
#else
  (void)d, (void)a, (void)b, (void)scale_d;
  __trap();  // not sm_90a code: the launcher never gets here (wgmma_gemm_supported)
#endif
}
#undef EMBER_WGMMA_M64N64K16
#undef EMBER_WGMMA_M64N128K16
#undef EMBER_WGMMA_M64N256K16
#endif  // __CUDACC__ && !EMBER_SIMT_EMULATION

}  // namespace ember::cuda
