// The Hopper GEMM's launcher (tc_gemm_sm90.h): a probe of whether the build holds sm_90a code, the TMA tensor maps of
// the operands (cuTensorMapEncodeTiled, fetched from the driver at run time so that nothing links libcuda), the choice
// of tile width and cluster, and the persistent launch (one block per SM, or as many clusters as fit at once).
// Invariant: a device is checked once (capability, shared memory, the sm_90a probe), and the kernel only ever runs
// after wgmma_gemm_applies accepted its operands.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>

#include "ember/base/cuda_check.h"
#include "ember/core/dtype.h"
#include "ember/kernels/cuda/blas.h"
#include "ember/kernels/cuda/device_info.h"
#include "ember/kernels/cuda/tc_gemm_sm90.h"
#include "ember/kernels/cuda/tc_gemm_sm90_kernel.cuh"

namespace ember::cuda {
namespace {

using sm90::kBlockK;
using sm90::kBlockM;
using sm90::kBoxN;
using sm90::kThreads;
using sm90::Tile;
using sm90::wgmma_gemm_kernel;
using sm90::WgmmaGemmParams;

// The most shared memory a tile width's kernel takes (each about 193 KiB: 192 KiB of stages).
constexpr size_t kSmemBytes = std::max({Tile<256>::kSmemBytes, Tile<128>::kSmemBytes, Tile<64>::kSmemBytes});

// Raises a kernel's shared-memory limit; false (with the reason in why_not) when its register count is not the 168
// that its setmaxnreg split assumes (Note [Hopper GEMM], "Registers": fewer would hang the consumers).
template <int BN, int kCluster, bool kAMajorM, bool kBMajorK>
bool prepare_kernel(std::string& why_not) {
  for (auto* kernel : {wgmma_gemm_kernel<Half, BN, kCluster, kAMajorM, kBMajorK>,
                       wgmma_gemm_kernel<BFloat16, BN, kCluster, kAMajorM, kBMajorK>}) {
    cudaFuncAttributes attributes{};
    EMBER_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    if (attributes.numRegs != 168) {
      why_not = "the kernel (tile width " + std::to_string(BN) + ", cluster " + std::to_string(kCluster) +
                ") was compiled to " + std::to_string(attributes.numRegs) +
                " registers a thread, not the 168 its setmaxnreg split needs";
      return false;
    }
    EMBER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(Tile<BN>::kSmemBytes)));
  }
  return true;
}

// Every tile width and cluster size of one operand layout.
template <bool kAMajorM, bool kBMajorK>
bool prepare_layout(std::string& why_not) {
  return prepare_kernel<256, 1, kAMajorM, kBMajorK>(why_not) && prepare_kernel<128, 1, kAMajorM, kBMajorK>(why_not) &&
         prepare_kernel<64, 1, kAMajorM, kBMajorK>(why_not) && prepare_kernel<256, 2, kAMajorM, kBMajorK>(why_not) &&
         prepare_kernel<128, 2, kAMajorM, kBMajorK>(why_not);
}

// A launch configuration of `grid` blocks of the kernel, in clusters of kCluster along x.
template <int BN, int kCluster>
struct ClusterLaunch {
  cudaLaunchAttribute attribute{};
  cudaLaunchConfig_t config{};
  ClusterLaunch(unsigned grid, cudaStream_t stream) {
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = kCluster;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.gridDim = dim3(grid);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = Tile<BN>::kSmemBytes;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
};

// How many clusters of 2 blocks of the BN-wide kernel fit on the device at once (GPCs pair SMs unevenly, so this can
// be below half the SM count).
template <int BN>
int max_active_clusters() {
  ClusterLaunch<BN, 2> launch(2, nullptr);
  int clusters = 0;
  EMBER_CUDA_CHECK(
      cudaOccupancyMaxActiveClusters(&clusters, wgmma_gemm_kernel<Half, BN, 2, false, false>, &launch.config));
  return clusters;
}

struct DeviceState {
  int8_t ok = -1;                          // -1 unknown, 0 no, 1 yes
  int clusters_128 = 0, clusters_256 = 0;  // max_active_clusters
  std::string why_not;                     // when ok == 0: what failed (wgmma_gemm_unsupported_reason)
};

std::atomic<int> g_tile_width{0}, g_cluster{0};  // set_wgmma_config

// Writes 1 when this image of the module was compiled for sm_90a (wgmma), else 0.
__global__ void wgmma_probe_kernel(int* flag) {
#if defined(EMBER_HAS_WGMMA)
  *flag = 1;
#else
  *flag = 0;
#endif
}

// Runs the probe once on `device` (a one-time synchronisation), prepares the kernels when the device qualifies, and
// caches the answer with the devices' cluster capacities. The states live in a deque, which never moves an element,
// so a reference stays valid while a later probe of another device appends.
const DeviceState& probe_device(int device) {
  static std::mutex mu;
  static std::deque<DeviceState> state;
  std::lock_guard<std::mutex> lock(mu);
  if (device < static_cast<int>(state.size()) && state[static_cast<size_t>(device)].ok >= 0)
    return state[static_cast<size_t>(device)];
  DeviceState st;
  st.ok = 0;
  const DeviceProperties& props = device_properties(device);
  if (props.major != 9) {
    st.why_not = "compute capability " + std::to_string(props.major) + "." + std::to_string(props.minor) + ", not 9.x";
  } else if (props.shared_memory_per_block_optin < static_cast<int64_t>(kSmemBytes)) {
    st.why_not = "the device gives a block " + std::to_string(props.shared_memory_per_block_optin) +
                 " bytes of shared memory; the kernel needs " + std::to_string(kSmemBytes);
  } else {
    int previous = 0;
    EMBER_CUDA_CHECK(cudaGetDevice(&previous));
    EMBER_CUDA_CHECK(cudaSetDevice(device));
    int* flag = nullptr;
    EMBER_CUDA_CHECK(cudaMallocHost(&flag, sizeof(int)));
    *flag = 0;
    wgmma_probe_kernel<<<1, 1>>>(flag);
    // A build without code for this device fails the launch (no kernel image): that is a "no", not an error. Any
    // other failure is named in why_not, so that a test that skips says what went wrong.
    const cudaError_t launch = cudaGetLastError();
    const cudaError_t sync = launch == cudaSuccess ? cudaDeviceSynchronize() : launch;
    (void)cudaGetLastError();
    bool ok = sync == cudaSuccess && *flag == 1;
    if (sync == cudaErrorNoKernelImageForDevice || (sync == cudaSuccess && *flag != 1))
      st.why_not = "this build has no sm_90a code (CMAKE_CUDA_ARCHITECTURES 90a; a plain 90 build lacks wgmma)";
    else if (sync != cudaSuccess)
      st.why_not = std::string("the probe kernel failed: ") + cudaGetErrorName(sync) + " (" +
                   cudaGetErrorString(sync) + ")";
    EMBER_CUDA_CHECK(cudaFreeHost(flag));
    ok = ok && prepare_layout<false, false>(st.why_not) && prepare_layout<false, true>(st.why_not) &&
         prepare_layout<true, false>(st.why_not);
    if (ok) {
      st.clusters_128 = max_active_clusters<128>();
      st.clusters_256 = max_active_clusters<256>();
    }
    st.ok = ok ? 1 : 0;
    EMBER_CUDA_CHECK(cudaSetDevice(previous));
  }
  while (device >= static_cast<int>(state.size())) state.emplace_back();
  state[static_cast<size_t>(device)] = st;
  return state[static_cast<size_t>(device)];
}

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status{};
    EMBER_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &status));
    EMBER_CHECK(status == cudaDriverEntryPointSuccess && p != nullptr, BackendError,
                "wgmma_gemm: the CUDA driver has no cuTensorMapEncodeTiled (status ", static_cast<int>(status), ")");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A rank-3 map of a contiguous [batch, rows, cols] tensor of 16-bit elements, boxes of box_cols x box_rows x 1 with
// the 128-byte swizzle (box_cols * 2 == 128), out-of-range elements read as zeros.
CUtensorMap tensor_map(DType dtype, const void* base, int64_t batch, int64_t rows, int64_t cols, uint32_t box_cols,
                       uint32_t box_rows) {
  CUtensorMap map{};
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(cols * 2), static_cast<cuuint64_t>(rows * cols * 2)};
  const cuuint32_t box[3] = {box_cols, box_rows, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r =
      encode_tiled()(&map, dtype == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3,
                     const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                     CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  EMBER_CHECK(r == CUDA_SUCCESS, BackendError, "wgmma_gemm: cuTensorMapEncodeTiled failed (CUresult ",
              static_cast<int>(r), ") for [", batch, ", ", rows, ", ", cols, "]");
  return map;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool wgmma_gemm_supported(int device) { return probe_device(device).ok == 1; }

std::string wgmma_gemm_unsupported_reason(int device) { return probe_device(device).why_not; }

int wgmma_max_clusters(int device) {
  const DeviceState& st = probe_device(device);
  return st.ok == 1 ? std::min(st.clusters_128, st.clusters_256) : 0;
}

void set_wgmma_config(const WgmmaConfig& config) {
  EMBER_CHECK(config.tile_width == 0 || config.tile_width == 64 || config.tile_width == 128 || config.tile_width == 256,
              ValueError, "set_wgmma_config: tile width ", config.tile_width, " is not 0 (by shape), 64, 128 or 256");
  EMBER_CHECK(config.cluster >= 0 && config.cluster <= 2, ValueError, "set_wgmma_config: cluster ", config.cluster,
              " is not 0 (by shape), 1 or 2");
  EMBER_CHECK(!(config.cluster == 2 && config.tile_width == 64), ValueError,
              "set_wgmma_config: a cluster of 2 splits the B boxes of a tile; width 64 has one");
  g_tile_width.store(config.tile_width);
  g_cluster.store(config.cluster);
}

bool wgmma_gemm_applies(int64_t M, int64_t N, int64_t K, const TcGemmOperands& ops, int device) {
  const int64_t a_row = ops.a_transposed ? M : K, b_row = ops.b_transposed ? K : N;  // elements per stored row
  return !(ops.a_transposed && ops.b_transposed) && N % 8 == 0 && a_row % 8 == 0 && b_row % 8 == 0 &&
         aligned16(ops.a) && aligned16(ops.b) && reinterpret_cast<uintptr_t>(ops.bias) % 2 == 0 && M < INT32_MAX &&
         N < INT32_MAX && K < INT32_MAX && wgmma_gemm_supported(device);
}

namespace {

template <int BN, int kCluster, bool kAMajorM, bool kBMajorK>
void launch(DType dtype, int64_t batch, int max_clusters, const CUtensorMap& map_a, const CUtensorMap& map_b,
            WgmmaGemmParams p, cudaStream_t stream) {
  p.m_tiles = (p.M + int64_t{kBlockM} * kCluster - 1) / (int64_t{kBlockM} * kCluster);
  p.n_tiles = (p.N + BN - 1) / BN;
  p.tiles = batch * p.m_tiles * p.n_tiles;
  // Persistent clusters: as many as run at once, or one per tile.
  const unsigned grid = static_cast<unsigned>((p.tiles < max_clusters ? p.tiles : max_clusters) * kCluster);
  if constexpr (kCluster == 1) {
    if (dtype == DType::f16) {
      wgmma_gemm_kernel<Half, BN, 1, kAMajorM, kBMajorK>
          <<<grid, kThreads, Tile<BN>::kSmemBytes, stream>>>(map_a, map_b, p);
    } else {
      wgmma_gemm_kernel<BFloat16, BN, 1, kAMajorM, kBMajorK>
          <<<grid, kThreads, Tile<BN>::kSmemBytes, stream>>>(map_a, map_b, p);
    }
    EMBER_CUDA_LAUNCH_CHECK();
  } else {
    ClusterLaunch<BN, kCluster> launch(grid, stream);
    if (dtype == DType::f16) {
      EMBER_CUDA_CHECK(cudaLaunchKernelEx(&launch.config, wgmma_gemm_kernel<Half, BN, kCluster, kAMajorM, kBMajorK>,
                                          map_a, map_b, p));
    } else {
      EMBER_CUDA_CHECK(cudaLaunchKernelEx(&launch.config, wgmma_gemm_kernel<BFloat16, BN, kCluster, kAMajorM, kBMajorK>,
                                          map_a, map_b, p));
    }
  }
}

}  // namespace

WgmmaConfig wgmma_config_for(int64_t batch, int64_t M, int64_t N, int sm_count, int max_clusters) {
  const WgmmaConfig fixed{g_tile_width.load(), g_cluster.load()};
  const int64_t m_tiles = (M + kBlockM - 1) / kBlockM;
  WgmmaConfig best{256, 1};
  int64_t best_cost = INT64_MAX, best_unit = 0;
  for (int cluster : {2, 1}) {
    if (fixed.cluster != 0 && cluster != fixed.cluster) continue;
    const int64_t capacity = cluster == 1 ? sm_count : max_clusters;
    if (capacity <= 0) continue;
    for (int width : {256, 128, 64}) {
      if ((fixed.tile_width != 0 && width != fixed.tile_width) || (cluster == 2 && width == 64)) continue;
      // Units (blocks, or clusters of 2 blocks along M) and waves of them; a unit's time per k step taken as the
      // bytes each of its blocks loads: A's 128 rows and its share of B's columns.
      const int64_t units = batch * ((m_tiles + cluster - 1) / cluster) * ((N + width - 1) / width);
      const int64_t cost = (units + capacity - 1) / capacity * (kBlockM + width / cluster);
      const int64_t unit = int64_t{width} * cluster;  // a tie goes to the smaller unit: more SMs at work
      if (cost < best_cost || (cost == best_cost && unit < best_unit)) {
        best_cost = cost;
        best_unit = unit;
        best = {width, cluster};
      }
    }
  }
  return best;
}

namespace {

// The launch for one operand layout, at the configuration c.
template <bool kAMajorM, bool kBMajorK>
void launch_layout(const WgmmaConfig& c, const DeviceState& st, int sm_count, DType dtype, int64_t batch,
                   const CUtensorMap& map_a, const CUtensorMap& map_b, const WgmmaGemmParams& p, cudaStream_t stream) {
  if (c.cluster == 2) {
    if (c.tile_width == 256) {
      launch<256, 2, kAMajorM, kBMajorK>(dtype, batch, st.clusters_256, map_a, map_b, p, stream);
    } else {
      launch<128, 2, kAMajorM, kBMajorK>(dtype, batch, st.clusters_128, map_a, map_b, p, stream);
    }
  } else if (c.tile_width == 256) {
    launch<256, 1, kAMajorM, kBMajorK>(dtype, batch, sm_count, map_a, map_b, p, stream);
  } else if (c.tile_width == 128) {
    launch<128, 1, kAMajorM, kBMajorK>(dtype, batch, sm_count, map_a, map_b, p, stream);
  } else {
    launch<64, 1, kAMajorM, kBMajorK>(dtype, batch, sm_count, map_a, map_b, p, stream);
  }
}

}  // namespace

void wgmma_gemm(DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K, const TcGemmOperands& ops, void* out,
                cudaStream_t stream) {
  int device = 0;
  EMBER_CUDA_CHECK(cudaGetDevice(&device));
  const DeviceState& st = probe_device(device);
  const int sm_count = device_properties(device).sm_count;
  const WgmmaConfig c = wgmma_config_for(batch, M, N, sm_count, wgmma_max_clusters(device));
  // Boxes of 64 x 64 for the transposed layouts (Note [Hopper GEMM], "Layouts"), else A's 64 K x 128 M and B's
  // 64 N x 64 K.
  const CUtensorMap map_a = ops.a_transposed ? tensor_map(dtype, ops.a, batch, K, M, 64, 64)
                                             : tensor_map(dtype, ops.a, batch, M, K, kBlockK, kBlockM);
  const CUtensorMap map_b = ops.b_transposed ? tensor_map(dtype, ops.b, batch, N, K, kBlockK, kBoxN)
                                             : tensor_map(dtype, ops.b, batch, K, N, kBoxN, kBlockK);
  WgmmaGemmParams p{};
  p.out = static_cast<uint16_t*>(out);
  p.bias = static_cast<const uint16_t*>(ops.bias);
  p.M = M;
  p.N = N;
  p.K = K;
  p.out_vec2 = reinterpret_cast<uintptr_t>(out) % 4 == 0;  // N is even (a multiple of 8)
  if (ops.a_transposed) {
    launch_layout<true, false>(c, st, sm_count, dtype, batch, map_a, map_b, p, stream);
  } else if (ops.b_transposed) {
    launch_layout<false, true>(c, st, sm_count, dtype, batch, map_a, map_b, p, stream);
  } else {
    launch_layout<false, false>(c, st, sm_count, dtype, batch, map_a, map_b, p, stream);
  }
}

}  // namespace ember::cuda
