// Invariant tests of CPU kernel workspace accounting (Note [Kernel workspace] in ember/kernels/cpu/conv_pool.cpp):
// the host allocator's peak during an op must cover its output plus the workspace the algorithm needs (sizes worked
// out by hand here), and every workspace byte must be returned when the op ends. Not timed.
#include <cstdint>
#include <set>
#include <vector>

#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

// CPU-allocator bytes seen by one op call: construct right before the call, read right after it. Counts requested
// bytes (before the allocator's 512 B rounding), so the expectations are the algorithm's own sizes.
class AllocationProbe {
 public:
  AllocationProbe() {
    allocator_for(Device::cpu()).reset_peak_stats();
    before_ = allocator_for(Device::cpu()).stats().requested_bytes;
  }
  // How far the high-water mark rose above the requested bytes at construction.
  int64_t peak_rise() const { return allocator_for(Device::cpu()).stats().peak_requested_bytes - before_; }
  // Requested bytes now minus requested bytes at construction.
  int64_t allocated_delta() const { return allocator_for(Device::cpu()).stats().requested_bytes - before_; }

 private:
  int64_t before_ = 0;
};

// Output spatial size of a convolution along one dim.
int64_t conv_out(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dil) {
  return (in + 2 * pad - dil * (k - 1) - 1) / stride + 1;
}

TEST(WorkspaceAccounting, Conv2dF32Im2colComesFromAllocator) {
  const int64_t N = 2, C = 8, H = 10, W = 12, O = 6, KH = 3, KW = 3;
  Conv2dParams p;
  p.padding[0] = p.padding[1] = 1;
  const Tensor x = rand_input({N, C, H, W}).to(DType::f32);
  const Tensor w = rand_input({O, C, KH, KW}).to(DType::f32);  // contiguous: used in place, no packed copy
  const Tensor b = rand_input({O}).to(DType::f32);
  const int64_t OH = conv_out(H, KH, 1, 1, 1), OW = conv_out(W, KW, 1, 1, 1);
  const int64_t out_bytes = N * O * OH * OW * 4;
  const int64_t im2col_bytes = C * KH * KW * OH * OW * 4;  // one image's column matrix, f32
  AllocationProbe probe;
  {
    Tensor y = conv2d(x, w, b, p);
    ASSERT_EQ(y.nbytes(), out_bytes);
    EXPECT_GE(probe.peak_rise(), out_bytes + im2col_bytes);
    EXPECT_EQ(probe.allocated_delta(), out_bytes) << "workspace still live after conv2d returned";
  }
  EXPECT_EQ(probe.allocated_delta(), 0);
}

TEST(WorkspaceAccounting, Conv2dF32GroupedStridedWeightPacksFromAllocator) {
  // groups = 2 and a non-contiguous weight: the weight is packed into an [O, C/g*KH*KW] f32 matrix as well.
  const int64_t N = 1, C = 6, H = 9, W = 7, O = 4, G = 2, CG = C / G, KH = 3, KW = 2;
  Conv2dParams p;
  p.groups = G;
  p.stride[0] = 2;
  p.dilation[1] = 2;
  const Tensor x = rand_input({N, C, H, W}).to(DType::f32);
  const Tensor w = rand_input({O, CG, KW, KH}).to(DType::f32).transpose(2, 3);  // [O, CG, KH, KW], strided
  ASSERT_FALSE(w.is_contiguous());
  const int64_t OH = conv_out(H, KH, 2, 0, 1), OW = conv_out(W, KW, 1, 0, 2);
  const int64_t out_bytes = N * O * OH * OW * 4;
  const int64_t im2col_bytes = CG * KH * KW * OH * OW * 4;  // one (image, group) column matrix
  const int64_t weight_bytes = O * CG * KH * KW * 4;
  AllocationProbe probe;
  {
    Tensor y = conv2d(x, w, Tensor(), p);
    ASSERT_EQ(y.nbytes(), out_bytes);
    EXPECT_GE(probe.peak_rise(), out_bytes + im2col_bytes + weight_bytes);
    EXPECT_EQ(probe.allocated_delta(), out_bytes);
  }
  EXPECT_EQ(probe.allocated_delta(), 0);
}

TEST(WorkspaceAccounting, Conv2dBf16StagingComesFromAllocator) {
  const int64_t N = 2, C = 5, H = 8, W = 8, O = 4, KH = 3, KW = 3;
  const Tensor x = rand_input({N, C, H, W}).to(DType::bf16);
  const Tensor w = rand_input({O, C, KH, KW}).to(DType::bf16);
  const Tensor b = rand_input({O}).to(DType::bf16);
  const int64_t OH = conv_out(H, KH, 1, 0, 1), OW = conv_out(W, KW, 1, 0, 1);
  const int64_t out_bytes = N * O * OH * OW * 2;
  const int64_t im2col_bytes = C * KH * KW * OH * OW * 4;  // widened to f32
  const int64_t weight_bytes = O * C * KH * KW * 4;        // widened to f32
  const int64_t result_bytes = O * OH * OW * 4;            // f32 GEMM result before rounding
  AllocationProbe probe;
  {
    Tensor y = conv2d(x, w, b, {});
    ASSERT_EQ(y.nbytes(), out_bytes);
    EXPECT_GE(probe.peak_rise(), out_bytes + im2col_bytes + weight_bytes + result_bytes);
    EXPECT_EQ(probe.allocated_delta(), out_bytes);
  }
  EXPECT_EQ(probe.allocated_delta(), 0);
}

TEST(WorkspaceAccounting, SmallMatmulWithUnitStrideOperandsNeedsNoWorkspace) {
  // K + M + N below Eigen's coefficient-based threshold (20) and operands mapped in place (b transposed): the output
  // is the only allocation.
  const int64_t M = 5, K = 6, N = 4;
  const Tensor a = rand_input({M, K}).to(DType::f32);
  const Tensor bt = rand_input({N, K}).to(DType::f32).t();  // [K, N], column-major
  AllocationProbe probe;
  {
    Tensor y = matmul(a, bt);
    EXPECT_EQ(probe.peak_rise(), M * N * 4);
  }
  EXPECT_EQ(probe.allocated_delta(), 0);
}

TEST(WorkspaceAccounting, MatmulGemmPanelsComeFromAllocator) {
  // A blocked GEMM packs cache-sized panels of both operands (Note [GEMM panels from the allocator]): they must show
  // in the peak, never exceed a copy of both operands, and be returned.
  const int64_t M = 64, K = 96, N = 80;
  const Tensor a = rand_input({M, K}).to(DType::f32);
  const Tensor b = rand_input({N, K}).to(DType::f32).t();
  const int64_t out_bytes = M * N * 4;
  AllocationProbe probe;
  {
    Tensor y = matmul(a, b);
    EXPECT_GT(probe.peak_rise(), out_bytes);
    EXPECT_LE(probe.peak_rise(), out_bytes + (M * K + K * N) * 4);
    EXPECT_EQ(probe.allocated_delta(), out_bytes);
  }
  EXPECT_EQ(probe.allocated_delta(), 0);
}

TEST(WorkspaceAccounting, MatmulStridedOperandPackingComesFromAllocator) {
  const int64_t M = 6, K = 11, N = 8;
  const Tensor a = rand_input({M, K}).to(DType::f32);
  // Every second row and column of a [2K, 2N] buffer: neither stride is 1, so b is packed.
  const Tensor b = rand_input({2 * K, 2 * N}).to(DType::f32).slice(0, 0, 2 * K, 2).slice(1, 0, 2 * N, 2);
  ASSERT_EQ(b.stride(0), 4 * N);
  ASSERT_EQ(b.stride(1), 2);
  const int64_t out_bytes = M * N * 4, pack_bytes = K * N * 4;
  AllocationProbe probe;
  {
    Tensor y = matmul(a, b);
    EXPECT_GE(probe.peak_rise(), out_bytes + pack_bytes);
    EXPECT_EQ(probe.allocated_delta(), out_bytes);
    // The packed path still computes the product: compare with a naive float64 sum.
    const std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>(), vy = y.to_vector<double>();
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0.0;
        for (int64_t k = 0; k < K; ++k) s += va[i * K + k] * vb[k * N + j];
        EXPECT_NEAR(vy[i * N + j], s, 1e-5) << "at (" << i << ", " << j << ")";
      }
  }
  EXPECT_EQ(probe.allocated_delta(), 0);
}

TEST(WorkspaceAccounting, MatmulBf16StagingComesFromAllocator) {
  const int64_t B = 3, M = 5, K = 12, N = 7;
  const Tensor a = rand_input({B, M, K}).to(DType::bf16);
  const Tensor b = rand_input({B, K, N}).to(DType::bf16);
  const int64_t out_bytes = B * M * N * 2;
  const int64_t staging_bytes = (M * K + K * N + M * N) * 4;  // one batch's widened operands and f32 product
  AllocationProbe probe;
  {
    Tensor y = bmm(a, b);
    ASSERT_EQ(y.nbytes(), out_bytes);
    EXPECT_GE(probe.peak_rise(), out_bytes + staging_bytes);
    EXPECT_EQ(probe.allocated_delta(), out_bytes);
  }
  EXPECT_EQ(probe.allocated_delta(), 0);
}

TEST(WorkspaceAccounting, EmbeddingForwardNeedsNoWorkspace) {
  const int64_t V = 20, D = 6;
  const Tensor w = rand_input({V, D}).to(DType::f32);
  const Tensor idx = from_vector<int64_t>({3, 0, 19, 3, 7}, {5});
  AllocationProbe probe;
  {
    Tensor y = embedding(w, idx);
    EXPECT_EQ(probe.peak_rise(), 5 * D * 4);
  }
  EXPECT_EQ(probe.allocated_delta(), 0);
}

TEST(WorkspaceAccounting, EmbeddingBackwardBf16AccumulatorComesFromAllocator) {
  const int64_t V = 40, D = 16;
  const std::vector<int64_t> ids = {5, 9, 5, 0, 39, 9, 9, 12, 5, 31, 0, 17};
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t touched = static_cast<int64_t>(std::set<int64_t>(ids.begin(), ids.end()).size());
  ASSERT_EQ(touched, 7);
  const Tensor idx = from_vector<int64_t>(ids, {n});
  const Tensor grad_out = rand_input({n, D}).to(DType::bf16);
  const int64_t out_bytes = V * D * 2;
  const int64_t acc_bytes = touched * D * 4;  // f32 accumulator for the touched rows
  AllocationProbe probe;
  {
    Tensor gw = embedding_backward(grad_out, idx, V);
    ASSERT_EQ(gw.nbytes(), out_bytes);
    EXPECT_GE(probe.peak_rise(), out_bytes + acc_bytes);
    EXPECT_EQ(probe.allocated_delta(), out_bytes);
  }
  EXPECT_EQ(probe.allocated_delta(), 0);
}

}  // namespace
}  // namespace ember::testing
