// The hand-written tensor-core GEMM (tensor_core_gemm in blas.h): the entry point, which sends what the Hopper kernel
// takes to it (tc_gemm_sm90.cu) and the rest to the mma.sync kernel launched here (mma.sync.m16n8k16 with f32
// accumulators, ldmatrix fragment loads and a 4-stage cp.async shared-memory pipeline), for f16/bf16 batched
// row-major products.
// Invariant: every global access is bounds-checked (zero-filled loads, guarded stores), so any M, N, K >= 1 is exact
// up to f32 accumulation and one rounding per output element; the layouts follow Note [Tensor-core GEMM].
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

#include "ember/base/cuda_check.h"
#include "ember/core/dtype.h"
#include "ember/kernels/cuda/blas.h"
#include "ember/kernels/cuda/device_info.h"
#include "ember/kernels/cuda/tc_gemm_kernel.cuh"
#include "ember/kernels/cuda/tc_gemm_sm90.h"

namespace ember::cuda {
namespace {

using tc::kMaxGridYZ;
using tc::kSmemBytes;
using tc::kThreads;
using tc::tc_gemm_kernel;
using tc::TcGemmParams;
constexpr int kBlockM = tc::kBlockM, kBlockN = tc::kBlockN;

// ---- launcher ---------------------------------------------------------------------------------------------------

bool aligned_to(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Checks that `device` can run the kernel and raises its dynamic shared-memory limit, once per (dtype, device).
template <class T>
void prepare_device(int device) {
  static std::mutex mu;
  static std::vector<bool> done;
  std::lock_guard<std::mutex> lock(mu);
  if (device < static_cast<int>(done.size()) && done[static_cast<size_t>(device)]) return;
  const DeviceProperties& props = device_properties(device);
  EMBER_CHECK(props.major >= 8, DeviceError, "tensor_core_gemm: needs sm_80 or later (mma.sync m16n8k16, cp.async); ",
              props.summary(), " is ", props.arch());
  EMBER_CHECK(props.shared_memory_per_block_optin >= static_cast<int64_t>(kSmemBytes), DeviceError,
              "tensor_core_gemm: needs ", kSmemBytes, " bytes of shared memory per block; ", props.summary(),
              " allows ", props.shared_memory_per_block_optin);
  EMBER_CUDA_CHECK(cudaFuncSetAttribute(tc_gemm_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kSmemBytes)));
  EMBER_CUDA_CHECK(cudaFuncSetAttribute(tc_gemm_kernel<T>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        static_cast<int>(cudaSharedmemCarveoutMaxShared)));
  if (device >= static_cast<int>(done.size())) done.resize(static_cast<size_t>(device) + 1, false);
  done[static_cast<size_t>(device)] = true;
}

template <class T>
void launch_tc_gemm(int64_t batch, int64_t M, int64_t N, int64_t K, const void* a, const void* b, void* out,
                    cudaStream_t stream) {
  int device = 0;
  EMBER_CUDA_CHECK(cudaGetDevice(&device));
  prepare_device<T>(device);

  TcGemmParams p;
  p.a = static_cast<const uint16_t*>(a);
  p.b = static_cast<const uint16_t*>(b);
  p.out = static_cast<uint16_t*>(out);
  p.M = M;
  p.N = N;
  p.K = K;
  p.a_vec = K % 8 == 0 && aligned_to(a, 16);
  p.b_vec = N % 8 == 0 && aligned_to(b, 16);
  p.out_vec2 = N % 2 == 0 && aligned_to(out, 4);

  const int64_t n_tiles = (N + kBlockN - 1) / kBlockN;
  const int64_t m_tiles = (M + kBlockM - 1) / kBlockM;
  EMBER_CHECK(n_tiles <= INT32_MAX, ShapeError, "tensor_core_gemm: N = ", N, " needs more than 2^31 - 1 blocks");
  for (int64_t b0 = 0; b0 < batch; b0 += kMaxGridYZ) {
    for (int64_t mt0 = 0; mt0 < m_tiles; mt0 += kMaxGridYZ) {
      p.batch_begin = b0;
      p.m_tile_begin = mt0;
      const dim3 grid(static_cast<unsigned>(n_tiles),
                      static_cast<unsigned>(m_tiles - mt0 < kMaxGridYZ ? m_tiles - mt0 : kMaxGridYZ),
                      static_cast<unsigned>(batch - b0 < kMaxGridYZ ? batch - b0 : kMaxGridYZ));
      tc_gemm_kernel<T><<<grid, kThreads, kSmemBytes, stream>>>(p);
      EMBER_CUDA_LAUNCH_CHECK();
    }
  }
}

}  // namespace

// ---- entry point ------------------------------------------------------------------------------------------------

namespace {
std::atomic<int64_t> g_calls{0}, g_wgmma_calls{0};  // tensor_core_gemm_calls, wgmma_gemm_calls
}  // namespace

int64_t tensor_core_gemm_calls() { return g_calls.load(std::memory_order_relaxed); }
int64_t wgmma_gemm_calls() { return g_wgmma_calls.load(std::memory_order_relaxed); }

void tensor_core_gemm(DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K, const TcGemmOperands& ops, void* out,
                      cudaStream_t stream, TcGemmKernel kernel) {
  EMBER_CHECK(is_reduced_float(dtype), DTypeError, "tensor_core_gemm: dtype ", dtype_name(dtype),
              " is not supported (f16 or bf16)");
  EMBER_CHECK(batch >= 0 && M >= 0 && N >= 0 && K >= 0, ShapeError, "tensor_core_gemm: negative size (batch ", batch,
              ", M ", M, ", N ", N, ", K ", K, ")");
  if (batch == 0 || M == 0 || N == 0) return;
  EMBER_CHECK(out != nullptr, ValueError, "tensor_core_gemm: null output for [", batch, ", ", M, ", ", N, "]");
  const bool plain = !ops.a_transposed && !ops.b_transposed && ops.bias == nullptr;
  EMBER_CHECK(K > 0 || ops.bias == nullptr, ShapeError, "tensor_core_gemm: K = 0 with a bias (gemm() handles it)");
  if (K == 0) {  // empty sums: out = 0 (+0 is the all-zero bit pattern in f16 and bf16)
    EMBER_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(batch * M * N) * sizeof(uint16_t), stream));
    return;
  }
  EMBER_CHECK(ops.a != nullptr && ops.b != nullptr, ValueError, "tensor_core_gemm: null operand for [", batch, ", ", M,
              ", ", K, "] @ [", batch, ", ", K, ", ", N, "]");
  if (kernel != TcGemmKernel::MmaSync) {
    int device = 0;
    EMBER_CUDA_CHECK(cudaGetDevice(&device));
    if (wgmma_gemm_applies(M, N, K, ops, device)) {
      wgmma_gemm(dtype, batch, M, N, K, ops, out, stream);
      g_calls.fetch_add(1, std::memory_order_relaxed);
      g_wgmma_calls.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if (kernel == TcGemmKernel::Wgmma) {
      EMBER_CHECK(wgmma_gemm_supported(device), DeviceError,
                  "tensor_core_gemm: the wgmma kernel needs sm_90 and a build ", "with sm_90a code; ",
                  device_properties(device).summary(), " does not run it");
      EMBER_CHECK(false, ShapeError, "tensor_core_gemm: the wgmma kernel does not take [", batch, ", ", M, ", ", K,
                  "] @ [", batch, ", ", K, ", ", N, "]", ops.a_transposed ? " (a transposed)" : "",
                  ops.b_transposed ? " (b transposed)" : "",
                  " (N and the stored rows must be multiples of 8, a and b 16-byte aligned, not both transposed)");
    }
  }
  EMBER_CHECK(plain, ShapeError, "tensor_core_gemm: the mma.sync kernel takes row-major a @ b without a bias; got",
              ops.a_transposed ? " a transposed" : "", ops.b_transposed ? " b transposed" : "",
              ops.bias != nullptr ? " a bias" : "", " for [", M, ", ", K, "] @ [", K, ", ", N, "]");
  if (dtype == DType::f16) {
    launch_tc_gemm<Half>(batch, M, N, K, ops.a, ops.b, out, stream);
  } else {
    launch_tc_gemm<BFloat16>(batch, M, N, K, ops.a, ops.b, out, stream);
  }
  g_calls.fetch_add(1, std::memory_order_relaxed);
}

void tensor_core_gemm(DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K, const void* a, const void* b,
                      void* out, cudaStream_t stream, TcGemmKernel kernel) {
  TcGemmOperands ops;
  ops.a = a;
  ops.b = b;
  tensor_core_gemm(dtype, batch, M, N, K, ops, out, stream, kernel);
}

bool tensor_core_gemm_takes(DType dtype, int64_t M, int64_t N, int64_t K, const TcGemmOperands& ops, int device) {
  if (!is_reduced_float(dtype) || K <= 0) return false;
  if (!ops.a_transposed && !ops.b_transposed && ops.bias == nullptr) return true;  // mma.sync takes any such
  return wgmma_gemm_applies(M, N, K, ops, device);
}

}  // namespace ember::cuda
