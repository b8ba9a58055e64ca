// Meta kernels (Note [Meta kernels] in ember/kernels/stubs.h): an op on meta tensors inside a MetaAllocationScope
// must take what the same op takes on the CPU — its result and the CPU kernel's workspace (packed operands, GEMM
// panels, f32 staging, im2col columns, accumulators) — so a dry run predicts a real run's peak. The reference is the
// CPU allocator's measured high-water mark during the real op; inputs on both devices have the same geometry.
#include <functional>
#include <vector>

#include "ember/core/meta_scope.h"
#include "ember/core/parallel.h"
#include "ember/memory/cpu_allocator.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

using Make = std::function<std::vector<Tensor>(Device)>;
using Op = std::function<Tensor(const std::vector<Tensor>&)>;

// Random values on the CPU, shape only on meta.
Tensor input(const Shape& shape, DType dtype, Device d) {
  return d.is_meta() ? empty(shape, TensorOptions(dtype, d)) : rand_input(shape).to(dtype);
}

// The rise of the allocator's high-water mark over the bytes held before the op, while the op runs.
int64_t peak_rise(memory::Allocator& a, const std::vector<Tensor>& in, const Op& op) {
  a.reset_peak_stats();
  const int64_t before = a.stats().allocated_bytes;
  { const Tensor out = op(in); }
  return a.stats().peak_allocated_bytes - before;
}

void expect_same_peak(const char* what, const Make& make, const Op& op) {
  SCOPED_TRACE(what);
  int64_t cpu = 0, meta = 0;
  {
    const std::vector<Tensor> in = make(Device::cpu());
    cpu = peak_rise(memory::cpu_allocator(), in, op);
  }
  {
    MetaAllocationScope scope;
    const std::vector<Tensor> in = make(Device::meta());
    meta = peak_rise(scope.allocator(), in, op);
  }
  EXPECT_GT(cpu, 0);
  EXPECT_EQ(meta, cpu);
}

TEST(MetaWorkspace, BmmPanelsPackingAndStaging) {
  const Op bmm = [](const std::vector<Tensor>& in) { return ops::bmm(in[0], in[1]); };
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    expect_same_peak("blocked", [dt](Device d) {
      return std::vector<Tensor>{input({3, 40, 50}, dt, d), input({3, 50, 60}, dt, d)};
    }, bmm);
    expect_same_peak("below Eigen's blocking threshold", [dt](Device d) {
      return std::vector<Tensor>{input({2, 3, 4}, dt, d), input({2, 4, 5}, dt, d)};
    }, bmm);
    expect_same_peak("transposed right operand", [dt](Device d) {
      return std::vector<Tensor>{input({2, 64, 32}, dt, d), input({2, 48, 32}, dt, d).transpose(1, 2)};
    }, bmm);
    expect_same_peak("both operands packed (no unit stride)", [dt](Device d) {
      return std::vector<Tensor>{input({2, 60, 80}, dt, d).slice(1, 0, 60, 2).slice(2, 0, 80, 2),
                                 input({2, 80, 60}, dt, d).slice(1, 0, 80, 2).slice(2, 0, 60, 2)};
    }, bmm);
  }
  expect_same_peak("matmul of a batch by a broadcast weight", [](Device d) {
    return std::vector<Tensor>{input({4, 16, 128}, DType::f32, d), input({256, 128}, DType::f32, d)};
  }, [](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1].t()); });
}

// Products split over threads (Note [Parallel GEMM]) take workspace per chunk; the replay must count each chunk's.
TEST(MetaWorkspace, BmmSplitOverThreads) {
  const int prev = get_num_threads();
  const Op bmm = [](const std::vector<Tensor>& in) { return ops::bmm(in[0], in[1]); };
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    SCOPED_TRACE(threads);
    for (DType dt : {DType::f32, DType::f16}) {
      SCOPED_TRACE(dtype_name(dt));
      expect_same_peak("row blocks", [dt](Device d) {
        return std::vector<Tensor>{input({1, 300, 200}, dt, d), input({1, 200, 90}, dt, d)};
      }, bmm);
      expect_same_peak("column blocks of packed operands", [dt](Device d) {
        return std::vector<Tensor>{input({1, 100, 400}, dt, d).slice(2, 0, 400, 2),
                                   input({1, 400, 600}, dt, d).slice(1, 0, 400, 2).slice(2, 0, 600, 2).transpose(1, 2)
                                       .transpose(1, 2)};
      }, bmm);
      expect_same_peak("batches", [dt](Device d) {
        return std::vector<Tensor>{input({5, 64, 48}, dt, d), input({5, 48, 64}, dt, d)};
      }, bmm);
    }
  }
  set_num_threads(prev);
}

TEST(MetaWorkspace, Conv2dForwardAndBackward) {
  Conv2dParams p;
  p.padding[0] = p.padding[1] = 1;
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Make conv_in = [dt](Device d) {
      return std::vector<Tensor>{input({3, 8, 12, 10}, dt, d), input({6, 8, 3, 3}, dt, d), input({6}, dt, d)};
    };
    expect_same_peak("forward", conv_in, [p](const std::vector<Tensor>& in) {
      return ops::conv2d(in[0], in[1], in[2], p);
    });
    expect_same_peak("forward, permuted weight", [dt](Device d) {
      return std::vector<Tensor>{input({2, 4, 9, 9}, dt, d), input({3, 3, 4, 6}, dt, d).permute({3, 2, 0, 1})};
    }, [](const std::vector<Tensor>& in) { return ops::conv2d(in[0], in[1]); });
    const Make grad_in = [dt](Device d) {
      return std::vector<Tensor>{input({3, 6, 12, 10}, dt, d), input({3, 8, 12, 10}, dt, d),
                                 input({6, 8, 3, 3}, dt, d)};
    };
    expect_same_peak("backward input", grad_in, [p](const std::vector<Tensor>& in) {
      return ops::conv2d_backward_input(in[0], in[2], in[1].sizes(), p);
    });
    expect_same_peak("backward weight", grad_in, [p](const std::vector<Tensor>& in) {
      return ops::conv2d_backward_weight(in[0], in[1], in[2].sizes(), p);
    });
    // A channels-last gradient: its rows are strided (no view as an [O, H*W] matrix with unit columns).
    const Make channels_last = [dt](Device d) {
      return std::vector<Tensor>{input({3, 12, 10, 6}, dt, d).permute({0, 3, 1, 2}), input({3, 8, 12, 10}, dt, d),
                                 input({6, 8, 3, 3}, dt, d)};
    };
    expect_same_peak("backward input, channels-last gradient", channels_last, [p](const std::vector<Tensor>& in) {
      return ops::conv2d_backward_input(in[0], in[2], in[1].sizes(), p);
    });
    expect_same_peak("backward weight, channels-last gradient", channels_last, [p](const std::vector<Tensor>& in) {
      return ops::conv2d_backward_weight(in[0], in[1], in[2].sizes(), p);
    });
  }
}

// Convolutions take workspace per chunk of images (or of weight partial sums), or split one image's GEMM: the replay
// must count each chunk's at every thread count (Note [Convolution over images] in ember/kernels/cpu/conv_pool.cpp).
TEST(MetaWorkspace, Conv2dOverThreads) {
  Conv2dParams p;
  p.padding[0] = p.padding[1] = 1;
  for (int threads : {1, 2, 3}) {
    ScopedNumThreads tc(threads);
    SCOPED_TRACE(threads);
    for (int64_t n_img : {1, 5, 11}) {
      SCOPED_TRACE(n_img);
      for (DType dt : {DType::f32, DType::bf16}) {
        SCOPED_TRACE(dtype_name(dt));
        expect_same_peak("forward", [=](Device d) {
          return std::vector<Tensor>{input({n_img, 16, 20, 20}, dt, d), input({32, 16, 3, 3}, dt, d),
                                     input({32}, dt, d)};
        }, [p](const std::vector<Tensor>& in) { return ops::conv2d(in[0], in[1], in[2], p); });
        const Make grad_in = [=](Device d) {
          return std::vector<Tensor>{input({n_img, 32, 20, 20}, dt, d), input({n_img, 16, 20, 20}, dt, d),
                                     input({32, 16, 3, 3}, dt, d)};
        };
        expect_same_peak("backward input", grad_in, [p](const std::vector<Tensor>& in) {
          return ops::conv2d_backward_input(in[0], in[2], in[1].sizes(), p);
        });
        expect_same_peak("backward weight", grad_in, [p](const std::vector<Tensor>& in) {
          return ops::conv2d_backward_weight(in[0], in[1], in[2].sizes(), p);
        });
      }
    }
  }
}

TEST(MetaWorkspace, FusedAttentionOverThreads) {
  for (int threads : {1, 2, 3}) {
    ScopedNumThreads tc(threads);
    SCOPED_TRACE(threads);
    for (int64_t T : {9, 70}) {  // one causal row block, three (Note [Causal attention by row blocks])
      for (bool causal : {true, false}) {
        for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " T " << T << " causal " << causal);
          const DType lse_dt = is_reduced_float(dt) ? DType::f32 : dt;
          expect_same_peak("forward", [=](Device d) { return std::vector<Tensor>{input({3, T, 3 * 16}, dt, d)}; },
                           [=](const std::vector<Tensor>& in) { return ops::attention_qkv(in[0], 4, causal).out; });
          expect_same_peak("backward", [=](Device d) {
            return std::vector<Tensor>{input({3, T, 16}, dt, d), input({3, T, 3 * 16}, dt, d),
                                       input({3, 4, T}, lse_dt, d)};  // lse
          }, [=](const std::vector<Tensor>& in) {
            return ops::attention_qkv_backward(in[0], in[1], in[2], 4, causal);
          });
        }
      }
    }
  }
}

TEST(MetaWorkspace, PoolingBackward) {
  Pool2dParams p;
  p.kernel[0] = p.kernel[1] = 2;
  p.stride[0] = p.stride[1] = 2;
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    expect_same_peak("max", [dt, p](Device d) {
      const Tensor x = input({2, 3, 8, 6}, dt, d);
      const Tensor idx = d.is_meta() ? empty({2, 3, 4, 3}, TensorOptions(DType::i64, d))
                                     : ops::max_pool2d_with_indices(x, p).indices;
      return std::vector<Tensor>{input({2, 3, 4, 3}, dt, d), idx};
    }, [](const std::vector<Tensor>& in) { return ops::max_pool2d_backward(in[0], in[1], {2, 3, 8, 6}); });
    expect_same_peak("avg", [dt](Device d) { return std::vector<Tensor>{input({2, 3, 4, 3}, dt, d)}; },
                     [p](const std::vector<Tensor>& in) { return ops::avg_pool2d_backward(in[0], {2, 3, 8, 6}, p); });
  }
}

TEST(MetaWorkspace, EmbeddingBackwardWhenTheIndicesCoverMinNV) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    // 40 indices over 13 rows touch all 13 (the meta replay takes min(n, V) accumulator rows).
    expect_same_peak("more indices than rows", [dt](Device d) {
      const Tensor idx = d.is_meta() ? empty({40}, TensorOptions(DType::i64, d))
                                     : ops::sub(arange(40), ops::mul(ops::div(arange(40), 13).to(DType::i64), 13));
      return std::vector<Tensor>{input({40, 16}, dt, d), idx};
    }, [](const std::vector<Tensor>& in) { return ops::embedding_backward(in[0], in[1], 13); });
    expect_same_peak("distinct indices", [dt](Device d) {
      const Tensor idx = d.is_meta() ? empty({8}, TensorOptions(DType::i64, d)) : arange(8);
      return std::vector<Tensor>{input({8, 16}, dt, d), idx};
    }, [](const std::vector<Tensor>& in) { return ops::embedding_backward(in[0], in[1], 100); });
  }
}

TEST(MetaWorkspace, CastsOfMixedOperandsAreAllocated) {
  // f16 + f32 casts the f16 operand to f32 before the kernel (Note [Meta kernels]); a scalar operand becomes a tensor.
  expect_same_peak("mixed add", [](Device d) {
    return std::vector<Tensor>{input({64, 64}, DType::f16, d), input({64, 64}, DType::f32, d)};
  }, [](const std::vector<Tensor>& in) { return ops::add(in[0], in[1]); });
  expect_same_peak("integer tensor times a float scalar", [](Device d) {
    return std::vector<Tensor>{d.is_meta() ? empty({1000}, TensorOptions(DType::i64, d)) : arange(1000)};
  }, [](const std::vector<Tensor>& in) { return ops::mul(in[0], 0.5); });
  expect_same_peak("where with a cast", [](Device d) {
    const Tensor c = d.is_meta() ? empty({300}, TensorOptions(DType::b8, d)) : ops::gt(rand_input({300}), zeros({300}));
    return std::vector<Tensor>{c, input({300}, DType::bf16, d), input({300}, DType::f32, d)};
  }, [](const std::vector<Tensor>& in) { return ops::where(in[0], in[1], in[2]); });
}

}  // namespace
}  // namespace ember::testing
