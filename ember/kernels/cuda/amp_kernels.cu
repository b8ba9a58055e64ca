// CUDA kernels of the mixed-precision ops, registered for the `amp_unscale` and `amp_update_scale` stubs. Three
// levels per op (DESIGN.md §3): __global__ kernel, launcher (grid math on the current stream), entry point (checks).
// Invariant: the element math is kernels/amp_math.h's, as on the CPU; found_inf is only ever set to 1 (plain stores
// of one value from any thread, so no atomics), and the scale is read and updated on the device, without a host sync.
#include <cstdint>
#include <vector>

#include "ember/base/cuda_check.h"
#include "ember/kernels/amp_math.h"
#include "ember/kernels/cuda/stream.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cuda {
namespace {

using ::ember::cuda::DeviceGuard;

// Note [Multi-tensor unscale]
// One launch unscales a whole list of tensors of one (grad dtype, out dtype) pair, as PyTorch's multi_tensor_apply:
// every tensor is cut into chunks of kChunk elements, each block handles one chunk, and the table saying which
// tensor and chunk a block takes travels by value as a kernel argument (about 2.7 KiB, within the 4 KiB kernel
// parameter limit), so no device memory is allocated or copied for it. A list needing more tensors or blocks than
// one table holds takes several launches; a tensor may span two of them (its remaining chunks go to the next table).
constexpr int kMaxTensors = 48;
constexpr int kMaxBlocks = 320;
constexpr int64_t kChunk = 65536;
constexpr int kUnscaleThreads = 512;

struct UnscaleTable {
  const void* in[kMaxTensors];
  void* out[kMaxTensors];
  int64_t numel[kMaxTensors];
  unsigned char block_tensor[kMaxBlocks];  // index into in/out/numel
  int32_t block_chunk[kMaxBlocks];         // chunk index within that tensor
};
static_assert(sizeof(UnscaleTable) <= 4096, "kernel parameters are limited to 4 KiB");

// ---- kernels ----------------------------------------------------------------------------------------------------

template <class G, class O>
__global__ void unscale_kernel(UnscaleTable table, float* found_inf, const float* inv_scale) {
  using M = op_math_t<G>;
  const int t = table.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(table.block_chunk[blockIdx.x]) * kChunk;
  const int64_t n = table.numel[t];
  const int64_t end = begin + kChunk < n ? begin + kChunk : n;
  const G* in = static_cast<const G*>(table.in[t]);
  O* out = static_cast<O*>(table.out[t]);
  const M inv = static_cast<M>(*inv_scale);
  bool nonfinite = false;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    out[i] = amp_unscale_element<G, O>(in[i], inv, nonfinite);
  if (nonfinite) *found_inf = 1.0f;
}

__global__ void update_scale_kernel(float* scale, int32_t* growth_tracker, const float* found_inf,
                                    double growth_factor, double backoff_factor, int64_t growth_interval) {
  amp_update_scale_element(*scale, *growth_tracker, *found_inf, growth_factor, backoff_factor, growth_interval);
}

// ---- launchers --------------------------------------------------------------------------------------------------

// Unscales the pairs (grads[k], outs[k]) for k in `members` (all of dtype pair G -> O) in as few launches as the
// table allows (Note [Multi-tensor unscale]).
template <class G, class O>
void launch_unscale(const std::vector<Tensor>& grads, const std::vector<Tensor>& outs,
                    const std::vector<size_t>& members, float* found_inf, const float* inv_scale,
                    cudaStream_t stream) {
  UnscaleTable table;
  int tensors = 0, blocks = 0;
  auto launch = [&] {
    unscale_kernel<G, O><<<blocks, kUnscaleThreads, 0, stream>>>(table, found_inf, inv_scale);
    EMBER_CUDA_LAUNCH_CHECK();
    blocks = 0;
  };
  for (size_t k : members) {
    const int64_t n = grads[k].numel();
    if (n == 0) continue;
    int slot = tensors++;
    table.in[slot] = grads[k].raw_data();
    table.out[slot] = outs[k].raw_data();
    table.numel[slot] = n;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      table.block_tensor[blocks] = static_cast<unsigned char>(slot);
      table.block_chunk[blocks] = static_cast<int32_t>(c);
      ++blocks;
      const bool last_chunk = c + 1 == chunks;
      if (blocks < kMaxBlocks && !(last_chunk && tensors == kMaxTensors)) continue;
      launch();
      if (last_chunk) {
        tensors = 0;
      } else {  // the tensor goes on in the next table, as its first entry
        table.in[0] = table.in[slot];
        table.out[0] = table.out[slot];
        table.numel[0] = n;
        slot = 0;
        tensors = 1;
      }
    }
  }
  if (blocks > 0) launch();
}

// ---- entry points -----------------------------------------------------------------------------------------------

void check_on_device(const char* op, const Tensor& t, Device device) {
  EMBER_CHECK(t.device() == device, DeviceError, op, ": the CUDA kernel got ", t.description(), " (expected ",
              device.str(), ")");
}

int dtype_slot(DType dt) {
  switch (dt) {
    case DType::f32: return 0;
    case DType::f64: return 1;
    case DType::f16: return 2;
    case DType::bf16: return 3;
    default: throw_unsupported_dtype("amp_unscale_", dt);
  }
}

void amp_unscale_cuda(const std::vector<Tensor>& grads, const std::vector<Tensor>& outs, const Tensor& found_inf,
                      const Tensor& inv_scale) {
  const char* op = "amp_unscale_";
  const Device device = found_inf.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, op, ": the CUDA kernel got ", found_inf.description());
  EMBER_CHECK(outs.size() == grads.size(), ValueError, op, ": the CUDA kernel got ", grads.size(), " grads and ",
              outs.size(), " outs");
  EMBER_CHECK(found_inf.dtype() == DType::f32 && inv_scale.dtype() == DType::f32, DTypeError, op,
              ": found_inf and inv_scale must be f32, got ", found_inf.description(), " and ",
              inv_scale.description());
  check_on_device(op, inv_scale, device);
  // Group the pairs by (grad dtype, out dtype): one kernel instantiation and one launch sequence per group.
  std::vector<size_t> groups[4][4];
  for (size_t k = 0; k < grads.size(); ++k) {
    check_on_device(op, grads[k], device);
    check_on_device(op, outs[k], device);
    EMBER_CHECK(grads[k].numel() == outs[k].numel(), ShapeError, op, ": grad ", grads[k].description(),
                " and out ", outs[k].description(), " differ in size");
    EMBER_CHECK(grads[k].is_contiguous() && outs[k].is_contiguous(), ValueError, op,
                ": the CUDA kernel needs contiguous tensors, got ", grads[k].description(), " and ",
                outs[k].description());
    groups[dtype_slot(grads[k].dtype())][dtype_slot(outs[k].dtype())].push_back(k);
  }
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  float* found = static_cast<float*>(found_inf.raw_data());
  const float* inv = static_cast<const float*>(inv_scale.raw_data());
  for (const auto& row : groups)
    for (const std::vector<size_t>& members : row) {
      if (members.empty()) continue;
      const size_t k0 = members.front();
      EMBER_DISPATCH_FLOAT(grads[k0].dtype(), op, [&] {
        using grad_t = scalar_t;
        EMBER_DISPATCH_FLOAT(outs[k0].dtype(), op, [&] {
          launch_unscale<grad_t, scalar_t>(grads, outs, members, found, inv, stream);
        });
      });
    }
}

void amp_update_scale_cuda(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                           double growth_factor, double backoff_factor, int64_t growth_interval) {
  const char* op = "amp_update_scale_";
  const Device device = scale.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, op, ": the CUDA kernel got ", scale.description());
  check_on_device(op, growth_tracker, device);
  check_on_device(op, found_inf, device);
  EMBER_CHECK(scale.dtype() == DType::f32 && growth_tracker.dtype() == DType::i32 && found_inf.dtype() == DType::f32,
              DTypeError, op, ": expects an f32 scale, an i32 growth tracker and an f32 found_inf, got ",
              scale.description(), ", ", growth_tracker.description(), " and ", found_inf.description());
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  update_scale_kernel<<<1, 1, 0, stream>>>(static_cast<float*>(scale.raw_data()),
                                           static_cast<int32_t*>(growth_tracker.raw_data()),
                                           static_cast<const float*>(found_inf.raw_data()), growth_factor,
                                           backoff_factor, growth_interval);
  EMBER_CUDA_LAUNCH_CHECK();
}

}  // namespace

EMBER_REGISTER_KERNEL(amp_unscale, DeviceType::CUDA, amp_unscale_cuda);
EMBER_REGISTER_KERNEL(amp_update_scale, DeviceType::CUDA, amp_update_scale_cuda);

}  // namespace ember::kernels::cuda
