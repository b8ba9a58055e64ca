// Dry runs that stand in for CUDA (Note [Dry-run targets] in ember/core/meta_scope.h): an op on meta tensors inside a
// MetaAllocationScope with a CUDA target takes its result and what the CUDA kernel takes — not the CPU kernel's
// workspace. On the CPU the references are hand-computed byte counts of the CUDA kernels' scratch (kernels/cuda/);
// on a GPU (the cuda/ instances) the reference is the CUDA allocator's measured high-water mark during the real op.
#include <algorithm>
#include <functional>
#include <vector>

#include "ember/core/meta_scope.h"
#include "ember/kernels/cuda/attention.h"
#include "ember/kernels/cuda/conv.h"
#include "ember/kernels/cuda/device_info.h"
#include "ember/kernels/ops_quant.h"
#include "ember/kernels/ops_sparse.h"
#include "ember/memory/alloc_config.h"
#include "ember/memory/cuda_device.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

using Make = std::function<std::vector<Tensor>(Device)>;
using Op = std::function<Tensor(const std::vector<Tensor>&)>;

constexpr int64_t kMiB = int64_t{1} << 20;

Tensor input(const Shape& shape, DType dtype, Device d) {
  if (d.is_meta()) return empty(shape, TensorOptions(dtype, d));
  return rand_input(shape).to(dtype).to(d);
}

Tensor index_input(const Shape& shape, int64_t bound, Device d) {
  if (d.is_meta()) return empty(shape, TensorOptions(DType::i64, d));
  return rand_input(shape, 0.0, static_cast<double>(bound) - 0.01).to(DType::i64).to(d);
}

int64_t peak_rise(memory::Allocator& a, const std::vector<Tensor>& in, const Op& op) {
  a.reset_peak_stats();
  const int64_t before = a.stats().allocated_bytes;
  { const Tensor out = op(in); }
  return a.stats().peak_allocated_bytes - before;
}

// The rise of a dry run's peak, standing in for `target`, under PyTorch's default size classes (512-byte rounding).
int64_t meta_rise(const MetaTarget& target, const Make& make, const Op& op) {
  MetaAllocationScope scope(memory::AllocatorConfig{}, target);
  const std::vector<Tensor> in = make(Device::meta());
  return peak_rise(scope.allocator(), in, op);
}

int64_t cuda_rise(const Make& make, const Op& op) { return meta_rise(MetaTarget::cuda(), make, op); }

int64_t r512(int64_t bytes) { return (bytes + 511) / 512 * 512; }

// ---- the target's plumbing ----------------------------------------------------------------------------------------

TEST(CudaReplay, ScopesNestAndRestoreTheirTargets) {
  EXPECT_FALSE(current_meta_target().is_cuda());
  {
    MetaTarget t = MetaTarget::cuda();
    t.sm_count = 7;
    MetaAllocationScope outer(memory::AllocatorConfig{}, t);
    EXPECT_TRUE(current_meta_target().is_cuda());
    EXPECT_EQ(current_meta_target().sm_count, 7);
    {
      MetaAllocationScope inner(memory::AllocatorConfig{});
      EXPECT_FALSE(current_meta_target().is_cuda());
    }
    EXPECT_EQ(current_meta_target().sm_count, 7);
  }
  EXPECT_FALSE(current_meta_target().is_cuda());
}

TEST(CudaReplay, RefusesTargetsThatAreNoDevice) {
  MetaTarget meta;
  meta.device = DeviceType::Meta;
  EXPECT_THROW(MetaAllocationScope(memory::AllocatorConfig{}, meta), ValueError);
  MetaTarget no_sms = MetaTarget::cuda();
  no_sms.sm_count = 0;
  EXPECT_THROW(MetaAllocationScope(memory::AllocatorConfig{}, no_sms), ValueError);
  MetaTarget negative = MetaTarget::cuda();
  negative.gemm_workspace_bytes = -1;
  EXPECT_THROW(MetaAllocationScope(memory::AllocatorConfig{}, negative), ValueError);
  EXPECT_FALSE(current_meta_target().is_cuda());  // nothing left behind
}

TEST(CudaReplay, HostStateStaysOnTheHostForACudaTarget) {
  EXPECT_TRUE(host_state_device(Device::meta()).is_meta());  // outside a scope: the CPU target
  MetaAllocationScope scope(memory::AllocatorConfig{}, MetaTarget::cuda());
  EXPECT_TRUE(host_state_device(Device::meta()).is_cpu());
  EXPECT_TRUE(host_state_device(Device::cpu()).is_cpu());
}

// ---- GEMM ---------------------------------------------------------------------------------------------------------

TEST(CudaReplay, Bf16ProductsTakeNoF32StagingOnCuda) {
  const Make make = [](Device d) {
    return std::vector<Tensor>{input({2, 64, 32}, DType::bf16, d), input({2, 32, 48}, DType::bf16, d)};
  };
  const Op bmm = [](const std::vector<Tensor>& in) { return ops::bmm(in[0], in[1]); };
  const int64_t out = 2 * 64 * 48 * 2;
  EXPECT_EQ(cuda_rise(make, bmm), out);                     // cuBLASLt reads bf16 as it is
  EXPECT_GT(meta_rise(MetaTarget::cpu(), make, bmm), out);  // the CPU kernel stages f32 copies
  MetaTarget with_ws = MetaTarget::cuda();
  with_ws.gemm_workspace_bytes = kMiB;
  EXPECT_EQ(meta_rise(with_ws, make, bmm), out + kMiB);
}

TEST(CudaReplay, OperandsWithoutAUnitStrideArePacked) {
  const Make make = [](Device d) {
    return std::vector<Tensor>{input({2, 60, 80}, DType::f32, d).slice(1, 0, 60, 2).slice(2, 0, 80, 2),
                               input({2, 40, 50}, DType::f32, d)};
  };
  const Op bmm = [](const std::vector<Tensor>& in) { return ops::bmm(in[0], in[1]); };
  // out [2, 30, 50] f32, then the packed copy of a [2, 30, 40]; b is read in place.
  EXPECT_EQ(cuda_rise(make, bmm), r512(2 * 30 * 50 * 4) + r512(2 * 30 * 40 * 4));
  // A transposed operand is read in place (column-major).
  const Make transposed = [](Device d) {
    return std::vector<Tensor>{input({2, 40, 30}, DType::f32, d).transpose(1, 2), input({2, 40, 50}, DType::f32, d)};
  };
  EXPECT_EQ(cuda_rise(transposed, bmm), r512(2 * 30 * 50 * 4));
}

TEST(CudaReplay, LinearWithBiasTakesOnlyItsOutputAndTheWorkspace) {
  const Make make = [](Device d) {
    return std::vector<Tensor>{input({128, 64}, DType::f16, d), input({96, 64}, DType::f16, d),
                               input({96}, DType::f16, d)};
  };
  const Op linear = [](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1], in[2]); };
  MetaTarget t = MetaTarget::cuda();
  t.gemm_workspace_bytes = 4 * kMiB;
  EXPECT_EQ(meta_rise(t, make, linear), 128 * 96 * 2 + 4 * kMiB);
}

// ---- attention ----------------------------------------------------------------------------------------------------

TEST(CudaReplay, AttentionTilesAndFlashStaging) {
  // qkv [2, 8, 192] bf16: C = 64, one head of 64.
  const Make make = [](Device d) { return std::vector<Tensor>{input({2, 8, 192}, DType::bf16, d)}; };
  const Op forward = [](const std::vector<Tensor>& in) { return ops::attention_qkv(in[0], 1, true).out; };
  const int64_t out = r512(2 * 8 * 64 * 2), lse = r512(2 * 1 * 8 * 4);
  // Tiled: one buffer of nb x T x T scores (nb = B = 2 here) in qkv's dtype.
  MetaTarget tiled = MetaTarget::cuda();
  tiled.flash_attention = false;
  EXPECT_EQ(meta_rise(tiled, make, forward), out + lse + r512(2 * 8 * 8 * 2));
  const MetaTarget flash = MetaTarget::cuda();  // the default path, as in a CUDA run
  EXPECT_TRUE(flash.flash_attention);
  EXPECT_EQ(meta_rise(flash, make, forward), out + lse);  // scores never stored

  const Make back_in = [](Device d) {
    return std::vector<Tensor>{input({2, 8, 192}, DType::bf16, d), input({2, 8, 64}, DType::bf16, d),
                               input({2, 1, 8}, DType::f32, d)};
  };
  const Op backward = [](const std::vector<Tensor>& in) {
    return ops::attention_qkv_backward(in[1], in[0], in[2], 1, true);
  };
  const int64_t grad_qkv = 2 * 8 * 192 * 2;
  EXPECT_EQ(meta_rise(tiled, back_in, backward), grad_qkv + 2 * r512(2 * 8 * 8 * 2));  // weights and their gradient
  EXPECT_EQ(meta_rise(flash, back_in, backward), grad_qkv + r512(2 * 1 * 8 * 4));    // delta: B x H x T f32
  // Head size 48 is not a flash size: the tiled path under either setting.
  const Make odd = [](Device d) { return std::vector<Tensor>{input({1, 4, 144}, DType::bf16, d)}; };
  EXPECT_EQ(meta_rise(flash, odd, forward), meta_rise(tiled, odd, forward));
  EXPECT_EQ(meta_rise(flash, odd, forward), r512(4 * 48 * 2) + r512(4 * 4) + r512(4 * 4 * 2));
}

TEST(CudaReplay, LongSequencesTileByQueryRows) {
  // T = 8192 f32: one T x T matrix (256 MiB) exceeds the 128 MiB budget, so tiles of 4096 query rows of one element.
  const Make make = [](Device d) { return std::vector<Tensor>{input({2, 8192, 48}, DType::f32, d)}; };
  const Op forward = [](const std::vector<Tensor>& in) { return ops::attention_qkv(in[0], 1, true).out; };
  EXPECT_EQ(cuda_rise(make, forward), r512(2 * 8192 * 16 * 4) + r512(2 * 8192 * 4) + 4096 * 8192 * 4);
}

// ---- reductions and the backward kernels' partial sums ------------------------------------------------------------

TEST(CudaReplay, BiasGradientSumsSplitOrPackByTheSmCount) {
  const Op sum0 = [](const std::vector<Tensor>& in) { return ops::sum(in[0], {0}); };
  // [4096, 768] bf16 on 132 SMs: 3 column blocks x 4096 / 64 groups < 264, so the split kernel: 24 blocks of 32
  // outputs want 1056 / 24 = 44 splits, capped at 4096 / (8 x 16) = 32, of {float, float, int64} states per output.
  const Make narrow = [](Device d) { return std::vector<Tensor>{input({4096, 768}, DType::bf16, d)}; };
  EXPECT_EQ(cuda_rise(narrow, sum0), r512(768 * 2) + r512(768 * 32 * 16));
  // [8192, 768]: 128 groups of 64 rows would do; 264 / 3 = 88 groups give two blocks a SM, past the usual 64.
  const Make tall = [](Device d) { return std::vector<Tensor>{input({8192, 768}, DType::bf16, d)}; };
  EXPECT_EQ(cuda_rise(tall, sum0), r512(768 * 2) + r512(88 * 768 * 4));
  // [8192, 2304]: 9 x 64 blocks >= 264, the packed column sum with 64 groups of float partials.
  const Make wide = [](Device d) { return std::vector<Tensor>{input({8192, 2304}, DType::bf16, d)}; };
  EXPECT_EQ(cuda_rise(wide, sum0), r512(2304 * 2) + r512(64 * 2304 * 4));
  // On 4 SMs the narrow sum packs too (3 x 64 >= 8).
  MetaTarget small = MetaTarget::cuda();
  small.sm_count = 4;
  EXPECT_EQ(meta_rise(small, narrow, sum0), r512(768 * 2) + r512(64 * 768 * 4));
  // The CPU target replays no reduction workspace.
  EXPECT_EQ(meta_rise(MetaTarget::cpu(), narrow, sum0), r512(768 * 2));
}

TEST(CudaReplay, WholeTensorSumsTakeCubStorage) {
  const Make make = [](Device d) { return std::vector<Tensor>{input({1 << 16}, DType::f32, d)}; };
  const Op sum = [](const std::vector<Tensor>& in) { return ops::sum(in[0]); };
  // 256 bytes for the accumulator, then 132 x 8 x 5 double partials in 256-byte units, plus 255.
  EXPECT_EQ(cuda_rise(make, sum), 512 + r512(256 + 42240 + 255));
}

TEST(CudaReplay, LayerNormBackwardPartials) {
  const Make make = [](Device d) {
    return std::vector<Tensor>{input({1024, 256}, DType::f32, d), input({1024, 256}, DType::f32, d),
                               input({256}, DType::f32, d), input({1024}, DType::f32, d), input({1024}, DType::f32, d)};
  };
  const Op backward = [](const std::vector<Tensor>& in) {
    const auto r = ops::layer_norm_backward(in[0], in[1], in[2], in[3], in[4], 1, true, true, true);
    return r.x;
  };
  // grad_x, grad_weight, grad_bias, then 1024 / 64 = 16 packed row groups of f32 partials for each affine gradient.
  const int64_t outputs = 1024 * 256 * 4 + 2 * r512(256 * 4);
  EXPECT_EQ(cuda_rise(make, backward), outputs + 2 * 16 * 256 * 4);
  // Rows one element off a 16-byte boundary are not packed: 1024 / 256 = 4 groups.
  const Make offset = [](Device d) {
    return std::vector<Tensor>{input({1024 * 256 + 1}, DType::f32, d).slice(0, 1, 1024 * 256 + 1).view({1024, 256}),
                               input({1024, 256}, DType::f32, d), input({256}, DType::f32, d),
                               input({1024}, DType::f32, d), input({1024}, DType::f32, d)};
  };
  EXPECT_EQ(cuda_rise(offset, backward), outputs + 2 * 4 * 256 * 4);
}

TEST(CudaReplay, BiasGeluBackwardPartials) {
  const Make make = [](Device d) {
    return std::vector<Tensor>{input({8192, 64}, DType::bf16, d), input({8192, 64}, DType::bf16, d),
                               input({64}, DType::bf16, d)};
  };
  const Op backward = [](const std::vector<Tensor>& in) {
    return ops::bias_gelu_backward(in[0], in[1], in[2], GeluApprox::Tanh, true, true).x;
  };
  // grad_x, grad_bias, then min(64, 8192 / 64) = 64 groups of f32 partial sums.
  EXPECT_EQ(cuda_rise(make, backward), 8192 * 64 * 2 + r512(64 * 2) + r512(64 * 64 * 4));
}

// ---- pooling and embeddings ---------------------------------------------------------------------------------------

TEST(CudaReplay, HalfMaxPoolGradientsAccumulateInF32) {
  const Make make = [](Device d) {
    const Tensor x = input({4, 8, 16, 16}, DType::f16, d);
    const MaxPoolResult r = ops::max_pool2d_with_indices(x, Pool2dParams{});
    return std::vector<Tensor>{r.out, r.indices};
  };
  const Op backward = [](const std::vector<Tensor>& in) {
    return ops::max_pool2d_backward(in[0], in[1], Shape{4, 8, 16, 16});
  };
  const int64_t grad_in = 4 * 8 * 16 * 16 * 2;
  // The index check's 8-byte flag is freed before the accumulator is taken, so it adds nothing to the peak.
  EXPECT_EQ(cuda_rise(make, backward), grad_in + 4 * 8 * 16 * 16 * 4);
}

TEST(CudaReplay, EmbeddingGradientSortsItsIndices) {
  const Make make = [](Device d) {
    return std::vector<Tensor>{input({8192, 8}, DType::f32, d), index_input({8192}, 50304, d)};
  };
  const Op backward = [](const std::vector<Tensor>& in) { return ops::embedding_backward(in[0], in[1], 50304); };
  // grad_weight, then keys and positions [4 n] i64 and CUB's onesweep storage for 16 key bits (2 passes):
  // 4096 + 2048 + 2 x 65536 + 256 + 255 bytes, + 1.
  EXPECT_EQ(cuda_rise(make, backward), 50304 * 8 * 4 + 4 * 8192 * 8 + r512(4096 + 2048 + 2 * 65536 + 256 + 255 + 1));
  // One tile (n <= 2304): CUB needs 1 byte.
  const Make few = [](Device d) {
    return std::vector<Tensor>{input({1024, 8}, DType::f32, d), index_input({1024}, 1024, d)};
  };
  const Op few_backward = [](const std::vector<Tensor>& in) { return ops::embedding_backward(in[0], in[1], 1024); };
  EXPECT_EQ(cuda_rise(few, few_backward), r512(1024 * 8 * 4) + r512(4 * 1024 * 8) + 512);
}

TEST(CudaReplay, Im2colConvolutionsTakeColumnBatches) {
  // x [4, 3, 10, 10] f16, weight [8, 3, 3, 3], no padding: out [4, 8, 8, 8]; rows = 27, plane = 64.
  const Make make = [](Device d) {
    return std::vector<Tensor>{input({4, 3, 10, 10}, DType::f16, d), input({8, 3, 3, 3}, DType::f16, d)};
  };
  MetaTarget im2col = MetaTarget::cuda();
  im2col.conv_im2col = true;
  im2col.im2col_chunk_bytes = 2 * 27 * 64 * 2;  // two images' f16 columns a batch
  const Op forward = [](const std::vector<Tensor>& in) { return ops::conv2d(in[0], in[1]); };
  const int64_t out = 4 * 8 * 64 * 2;
  EXPECT_EQ(meta_rise(im2col, make, forward), out + r512(2 * 27 * 64 * 2));
  EXPECT_EQ(cuda_rise(make, forward), out);  // cuDNN with its workspace assumed 0, operands as they are
  // Input gradient of a 16-bit conv: the weight widened to f32 [8, 27], then per image batch f32 column gradients and
  // grad_out widened to f32: (27 + 8) x 64 x 4 bytes an image, more than the budget, so one image a batch.
  const Make grads = [](Device d) {
    return std::vector<Tensor>{input({4, 8, 8, 8}, DType::f16, d), input({8, 3, 3, 3}, DType::f16, d),
                               input({4, 3, 10, 10}, DType::f16, d)};
  };
  const Op input_grad = [](const std::vector<Tensor>& in) {
    return ops::conv2d_backward_input(in[0], in[1], Shape{4, 3, 10, 10});
  };
  const int64_t per_image = (27 + 8) * 64 * 4, nb = std::max<int64_t>(1, im2col.im2col_chunk_bytes / per_image);
  EXPECT_EQ(meta_rise(im2col, grads, input_grad),
            r512(4 * 3 * 10 * 10 * 2) + r512(8 * 27 * 4) + r512(nb * 27 * 64 * 4) + r512(nb * 8 * 64 * 4));
  // Weight gradient: per batch the f16 columns and grad_out packed as [O, images, plane].
  const Op weight_grad = [](const std::vector<Tensor>& in) {
    return ops::conv2d_backward_weight(in[0], in[2], Shape{8, 3, 3, 3});
  };
  const int64_t wb = std::max<int64_t>(1, im2col.im2col_chunk_bytes / ((27 + 8) * 64 * 2));
  EXPECT_EQ(meta_rise(im2col, grads, weight_grad), r512(8 * 27 * 2) + r512(27 * wb * 64 * 2) + r512(8 * wb * 64 * 2));
}

// ---- layer norm, int8 and CSR -------------------------------------------------------------------------------------

TEST(CudaReplay, LayerNormCopiesAStridedWeight) {
  const Op norm = [](const std::vector<Tensor>& in) {
    return ops::layer_norm_with_stats(in[0], Shape{8}, in[1], in[2]).out;
  };
  const Make contiguous = [](Device d) {
    return std::vector<Tensor>{input({4, 8}, DType::f32, d), input({8}, DType::f32, d), input({8}, DType::f32, d)};
  };
  const Make strided = [](Device d) {
    return std::vector<Tensor>{input({4, 8}, DType::f32, d), input({16}, DType::f32, d).slice(0, 0, 16, 2),
                               input({8}, DType::f32, d)};
  };
  const int64_t outputs = 3 * 512;  // out [4, 8], mean and rstd [4]
  EXPECT_EQ(cuda_rise(contiguous, norm), outputs);
  EXPECT_EQ(cuda_rise(strided, norm), outputs + 512);  // the weight's contiguous [8] copy
}

TEST(CudaReplay, Int8LinearsTakeTilesAndQuantizedActivations) {
  // x [64, 300] f16 @ (q [200, 300] i8 * scale)^T: one tile of min(300, 131072) columns x min(131072 / 300, 200)
  // rows of f16 = 200 x 300 x 2 bytes.
  const Make weight_in = [](Device d) {
    return std::vector<Tensor>{input({64, 300}, DType::f16, d), empty({200, 300}, TensorOptions(DType::i8, d)),
                               input({200}, DType::f32, d)};
  };
  const Op weight_linear = [](const std::vector<Tensor>& in) { return ops::int8_weight_linear(in[0], in[1], in[2]); };
  const int64_t scale_cast = 0;  // the f32 scale is used as it is for an f16 x
  EXPECT_EQ(cuda_rise(weight_in, weight_linear), scale_cast + r512(64 * 200 * 2) + r512(200 * 300 * 2));
  // Dynamic int8 x int8: the error record, the activation scale, then the whole x [64, 300] in int8.
  const Make dynamic_in = [](Device d) {
    return std::vector<Tensor>{input({64, 300}, DType::f32, d), empty({200, 300}, TensorOptions(DType::i8, d)),
                               input({200}, DType::f32, d)};
  };
  const Op dynamic = [](const std::vector<Tensor>& in) { return ops::int8_dynamic_linear(in[0], in[1], in[2]); };
  EXPECT_EQ(cuda_rise(dynamic_in, dynamic), r512(64 * 200 * 4) + 512 + 512 + r512(64 * 300));
}

TEST(CudaReplay, CsrProductsConvertNarrowIndicesForCusparse) {
  const auto csr = [](Device d, DType col_dtype) {
    CsrMatrix w;
    w.rows = 64;
    w.cols = 32;
    w.values = empty({500}, TensorOptions(DType::f32, d));
    w.col_indices = empty({500}, TensorOptions(col_dtype, d));
    w.row_ptr = empty({65}, TensorOptions(DType::i32, d));
    return w;
  };
  for (DType col : {DType::i16, DType::i32}) {
    SCOPED_TRACE(dtype_name(col));
    MetaAllocationScope scope(memory::AllocatorConfig{}, MetaTarget::cuda());
    const CsrMatrix w = csr(Device::meta(), col);
    const Tensor x = empty({16, 32}, TensorOptions(DType::f32, Device::meta()));
    memory::Allocator& a = scope.allocator();
    a.reset_peak_stats();
    const int64_t before = a.stats().allocated_bytes;
    { const Tensor out = ops::csr_linear(x, w); }
    // out [16, 64] f32, and for i16 column indices their i32 copy (cuSPARSE takes i32 or i64 indices).
    EXPECT_EQ(a.stats().peak_allocated_bytes - before, 16 * 64 * 4 + (col == DType::i16 ? r512(500 * 4) : 0));
  }
}

// ---- the same ops measured on a GPU -------------------------------------------------------------------------------

class CudaReplayOnDevice : public ::testing::TestWithParam<Device> {};

// Real CUDA run against the replay, on the CUDA allocator's own policy; `library_slack` bounds what a library's
// run-time choice adds (cuBLASLt's workspace, which a dry run assumes 0).
void expect_replay_matches(const char* what, const Make& make, const Op& op, int64_t library_slack = 0,
                           bool flash = false, bool conv_im2col = false) {
  SCOPED_TRACE(what);
  int64_t real = 0, replay = 0;
#if defined(EMBER_WITH_CUDA)
  const ::ember::cuda::AttentionStrategy before = ::ember::cuda::attention_strategy();
  ::ember::cuda::set_attention_strategy(flash ? ::ember::cuda::AttentionStrategy::Flash
                                              : ::ember::cuda::AttentionStrategy::Tiled);
  {
    const std::vector<Tensor> in = make(Device::cuda(0));
    real = peak_rise(memory::cuda::allocator(0), in, op);
  }
  ::ember::cuda::set_attention_strategy(before);
#endif
  MetaTarget t = MetaTarget::cuda();
  t.sm_count = ::ember::cuda::device_properties(0).sm_count;
  t.flash_attention = flash;
  t.conv_im2col = conv_im2col;
#if defined(EMBER_WITH_CUDA)
  t.im2col_chunk_bytes = ::ember::cuda::im2col_chunk_bytes();
#endif
  {
    MetaAllocationScope scope(memory::alloc_config_from_env(), t);
    const std::vector<Tensor> in = make(Device::meta());
    replay = peak_rise(scope.allocator(), in, op);
  }
  EXPECT_GE(real, replay);
  EXPECT_LE(real, replay + library_slack);
}

TEST_P(CudaReplayOnDevice, ReplaysMatchTheCudaAllocatorsPeak) {
  EMBER_SKIP_WITHOUT_CUDA();
  const int64_t lt = 32 * kMiB;  // kWorkspaceLimit in blas.cu
  expect_replay_matches(
      "bf16 bmm",
      [](Device d) {
        return std::vector<Tensor>{input({2, 64, 32}, DType::bf16, d), input({2, 32, 48}, DType::bf16, d)};
      },
      [](const std::vector<Tensor>& in) { return ops::bmm(in[0], in[1]); }, lt);
  expect_replay_matches(
      "packed operand",
      [](Device d) {
        return std::vector<Tensor>{input({2, 60, 80}, DType::f32, d).slice(1, 0, 60, 2).slice(2, 0, 80, 2),
                                   input({2, 40, 50}, DType::f32, d)};
      },
      [](const std::vector<Tensor>& in) { return ops::bmm(in[0], in[1]); }, lt);
  for (int64_t cols : {768, 2304})
    expect_replay_matches(
        "bias-gradient sum",
        [cols](Device d) {
          return std::vector<Tensor>{input({8192, cols}, DType::bf16, d)};
        },
        [](const std::vector<Tensor>& in) { return ops::sum(in[0], {0}); });
  expect_replay_matches(
      "conv bias-gradient sum",
      [](Device d) {
        return std::vector<Tensor>{input({64, 32, 26, 26}, DType::f32, d)};
      },
      [](const std::vector<Tensor>& in) {
        return ops::sum(in[0], {0, 2, 3});
      });
  expect_replay_matches(
      "layer norm backward",
      [](Device d) {
        return std::vector<Tensor>{input({1024, 256}, DType::f32, d), input({1024, 256}, DType::f32, d),
                                   input({256}, DType::f32, d), input({1024}, DType::f32, d),
                                   input({1024}, DType::f32, d)};
      },
      [](const std::vector<Tensor>& in) {
        return ops::layer_norm_backward(in[0], in[1], in[2], in[3], in[4], 1, true, true, true).x;
      });
  expect_replay_matches(
      "bias gelu backward",
      [](Device d) {
        return std::vector<Tensor>{input({8192, 64}, DType::bf16, d), input({8192, 64}, DType::bf16, d),
                                   input({64}, DType::bf16, d)};
      },
      [](const std::vector<Tensor>& in) {
        return ops::bias_gelu_backward(in[0], in[1], in[2], GeluApprox::Tanh, true, true).x;
      });
  expect_replay_matches(
      "half max pool backward",
      [](Device d) {
        const MaxPoolResult r = ops::max_pool2d_with_indices(input({4, 8, 16, 16}, DType::f16, d), Pool2dParams{});
        return std::vector<Tensor>{r.out, r.indices};
      },
      [](const std::vector<Tensor>& in) {
        return ops::max_pool2d_backward(in[0], in[1], Shape{4, 8, 16, 16});
      });
  for (int64_t n : {1024, 8192})
    expect_replay_matches(
        "embedding backward",
        [n](Device d) {
          return std::vector<Tensor>{input({n, 8}, DType::f32, d), index_input({n}, 50304, d)};
        },
        [](const std::vector<Tensor>& in) { return ops::embedding_backward(in[0], in[1], 50304); });
  expect_replay_matches(
      "whole-tensor sum (CUB)", [](Device d) { return std::vector<Tensor>{input({1 << 18}, DType::f32, d)}; },
      [](const std::vector<Tensor>& in) { return ops::sum(in[0]); });
  expect_replay_matches(
      "layer norm, strided weight",
      [](Device d) {
        return std::vector<Tensor>{input({64, 128}, DType::f32, d), input({256}, DType::f32, d).slice(0, 0, 256, 2),
                                   input({128}, DType::f32, d)};
      },
      [](const std::vector<Tensor>& in) { return ops::layer_norm_with_stats(in[0], Shape{128}, in[1], in[2]).out; });
  expect_replay_matches(
      "embedding",
      [](Device d) {
        return std::vector<Tensor>{input({1000, 16}, DType::f32, d), index_input({300}, 1000, d)};
      },
      [](const std::vector<Tensor>& in) { return ops::embedding(in[0], in[1]); });
  expect_replay_matches(
      "int8 weight linear",
      [](Device d) {
        return std::vector<Tensor>{input({64, 300}, DType::f16, d), input({200, 300}, DType::f32, d)};
      },
      [](const std::vector<Tensor>& in) {
        const QuantizedPerChannel w = ops::quantize_per_channel_symmetric(in[1]);
        return ops::int8_weight_linear(in[0], w.q, w.scale);
      },
      lt);
  const Make conv_in = [](Device d) {
    return std::vector<Tensor>{input({8, 16, 20, 20}, DType::f16, d), input({32, 16, 3, 3}, DType::f16, d)};
  };
  const Op conv_step = [](const std::vector<Tensor>& in) {
    const Tensor y = ops::conv2d(in[0], in[1]);
    const Tensor gx = ops::conv2d_backward_input(y, in[1], in[0].sizes());
    return ops::conv2d_backward_weight(y, in[0], in[1].sizes());
  };
  // Each pass's cuDNN workspace is at most kWorkspaceLimit (conv_cudnn.cpp).
  expect_replay_matches("conv2d forward and backward (cuDNN)", conv_in, conv_step, 3 * 256 * kMiB);
#if defined(EMBER_WITH_CUDA)
  {
    const ::ember::cuda::ConvStrategy before = ::ember::cuda::conv_strategy();
    ::ember::cuda::set_conv_strategy(::ember::cuda::ConvStrategy::Im2col);
    expect_replay_matches("conv2d forward and backward (im2col)", conv_in, conv_step, lt, false, true);
    ::ember::cuda::set_conv_strategy(before);
  }
#endif
  for (bool flash : {false, true}) {
    expect_replay_matches(
        flash ? "flash attention forward" : "tiled attention forward",
        [](Device d) {
          return std::vector<Tensor>{input({2, 64, 192}, DType::bf16, d)};
        },
        [](const std::vector<Tensor>& in) { return ops::attention_qkv(in[0], 1, true).out; }, lt, flash);
    expect_replay_matches(
        flash ? "flash attention backward" : "tiled attention backward",
        [](Device d) {
          return std::vector<Tensor>{input({2, 64, 192}, DType::bf16, d), input({2, 64, 64}, DType::bf16, d),
                                     input({2, 1, 64}, DType::f32, d)};
        },
        [](const std::vector<Tensor>& in) { return ops::attention_qkv_backward(in[1], in[0], in[2], 1, true); }, lt,
        flash);
  }
}

INSTANTIATE_TEST_SUITE_P(cuda, CudaReplayOnDevice, ::testing::Values(Device::cuda(0)), device_param_name);

}  // namespace
}  // namespace ember::testing
