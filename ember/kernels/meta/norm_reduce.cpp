// Replays of the CUDA reduction, layer-norm and bias + GELU backward kernels' workspace (replay.h): partial sums,
// CUB's temporary storage and copies of strided layer-norm parameters. Invariant: the reduction decides its path
// through cuda/reduce_plan.h and the backward kernels size their row groups through cuda/scratch_sizes.h, the same
// code the kernels use.
#include <algorithm>
#include <array>

#include "ember/kernels/cuda/reduce_plan.h"
#include "ember/kernels/cuda/scratch_sizes.h"
#include "ember/kernels/meta/replay.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::meta {

namespace {

namespace rc = ::ember::kernels::cuda;

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Bytes of reduce.cu's accumulator acc_t<T> (Note [Reduction accumulator]): double for f32/f64, float for f16/bf16,
// int64 for integers and bool.
int64_t accumulator_bytes(DType dtype) { return is_reduced_float(dtype) ? 4 : 8; }

// CUB's temporary storage for DeviceReduce over R elements (its two-pass path, R >= kCubMinR): one accumulator per
// block of its grid, at most sm_count x 8 resident 256-thread blocks x CUB's subscription factor 5, in 256-byte
// units, plus 255 bytes of alignment slack. The blocks an SM holds are CUB's occupancy query on the device; 8 is
// the hardware's limit for 256-thread blocks and what CUB's reduction kernel reaches on sm_90.
int64_t cub_reduce_temp_bytes(int64_t acc_bytes, int sm_count) {
  const int64_t max_blocks = int64_t{8} * sm_count * 5;
  return round_up(max_blocks * acc_bytes, 256) + 255;
}

void reduce_replay(ReduceOp op, const Tensor& in, const Tensor& out, const std::vector<int64_t>& dims,
                   int64_t /*correction*/) {
  const int64_t n_out = out.numel();
  if (n_out == 0) return;
  const int sm_count = current_meta_target().sm_count;
  int64_t R = 1;
  Shape kept_sizes = in.sizes(), red_sizes(in.sizes().size(), 1);
  for (int64_t d : dims) {
    kept_sizes[static_cast<size_t>(d)] = 1;
    red_sizes[static_cast<size_t>(d)] = in.size(d);
    R *= in.size(d);
  }
  const int64_t acc = accumulator_bytes(in.dtype());
  const bool sum = op == ReduceOp::Sum || op == ReduceOp::Mean;
  MetaWorkspace ws;
  if (is_floating(in.dtype()) && sum) {
    if (n_out == 1 && R >= rc::kCubMinR && in.is_contiguous()) {  // Note [Whole-tensor sums through CUB]
      ws.take(rc::kCubScratchAlign + cub_reduce_temp_bytes(acc, sm_count), DType::u8);
      return;
    }
    if (n_out >= 2 && R >= 2 && in.is_contiguous() && aligned(in, 16)) {  // Note [Packed sums]
      const int V = static_cast<int>(16 / in.itemsize());
      if (n_out % V == 0 && rc::reduced_dims_are(in, dims, /*leading=*/true)) {
        const int64_t groups = rc::packed_column_groups(n_out, R, V, sm_count);
        if (groups > 1) ws.take(groups * n_out * acc, DType::u8);
        if (groups > 0) return;
      } else if (rc::packed_row_sum_takes(n_out, R, V, sm_count) && rc::reduced_dims_are(in, dims, /*leading=*/false)) {
        return;
      }
    }
  }
  const auto kept =
      ::ember::cuda::make_offset_calculator<1>(kept_sizes, std::array<const Shape*, 1>{&in.strides()}, "reduce");
  const auto red =
      ::ember::cuda::make_offset_calculator<1>(red_sizes, std::array<const Shape*, 1>{&in.strides()}, "reduce");
  const rc::Plan plan = rc::plan_reduction(n_out, R, kept, red, sm_count, /*allow_split=*/true);
  // Split: one state {acc, acc, int64} per output and split.
  if (plan.splits > 1) ws.take(n_out * plan.splits * (2 * acc + 8), DType::u8);
}

// softmax_layernorm.cu: a strided weight or bias is copied to a contiguous [cols] for the call (then nothing else).
void add_layer_norm_replay(const Tensor& x, const Tensor& /*residual*/, const Tensor& weight, const Tensor& bias,
                           double /*eps*/, const Tensor& /*sum*/, const Tensor& /*out*/, const Tensor& /*mean*/,
                           const Tensor& /*rstd*/) {
  if (x.size(0) == 0) return;
  MetaWorkspace ws;
  if (weight.defined() && !weight.is_contiguous()) ws.take(weight.numel(), weight.dtype());
  if (bias.defined() && !bias.is_contiguous()) ws.take(bias.numel(), bias.dtype());
}

void layer_norm_replay(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& out,
                       const Tensor& mean, const Tensor& rstd) {
  add_layer_norm_replay(x, Tensor(), weight, bias, eps, Tensor(), out, mean, rstd);
}

// layer_norm_backward.cu: the weight copied when strided, then [groups, cols] partial sums of each affine gradient.
void layer_norm_backward_replay(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& /*mean*/,
                                const Tensor& /*rstd*/, const Tensor& /*grad_add*/, const Tensor& grad_x,
                                const Tensor& grad_weight, const Tensor& grad_bias) {
  const int64_t rows = g.size(0), cols = g.size(1);
  if (cols == 0) return;
  MetaWorkspace ws;
  if (weight.defined() && !weight.is_contiguous()) ws.take(weight.numel(), weight.dtype());
  if (!grad_weight.defined() && !grad_bias.defined()) return;
  const bool need_xhat = grad_x.defined() || grad_weight.defined();
  const DType xt = need_xhat ? x.dtype() : g.dtype();
  // packed_operands: one dtype for x and g, not f64, whole packs per row, contiguous aligned rows.
  const int64_t V = 16 / itemsize(xt);
  const bool packed = xt == g.dtype() && xt != DType::f64 && cols % V == 0 && g.stride(0) == cols && g.stride(1) == 1 &&
                      aligned(g, 16) && (!need_xhat || (x.stride(0) == cols && x.stride(1) == 1 && aligned(x, 16)));
  const int64_t groups = rc::layer_norm_backward_groups(rows, packed);
  if (groups == 1) return;
  const DType acc = xt == DType::f64 ? DType::f64 : DType::f32;
  if (grad_weight.defined()) ws.take(groups * cols, acc);
  if (grad_bias.defined()) ws.take(groups * cols, acc);
}

// bias_gelu.cu's launch_backward: [groups, cols] partial sums of the bias gradient.
void bias_gelu_backward_replay(const Tensor& /*g*/, const Tensor& x, const Tensor& /*bias*/, bool /*tanh_approx*/,
                               const Tensor& grad_x, const Tensor& grad_bias) {
  const int64_t rows = x.size(0), cols = x.size(1);
  if (cols == 0 || (!grad_x.defined() && !grad_bias.defined())) return;
  const int64_t groups = rc::bias_gelu_backward_groups(rows);
  if (!grad_bias.defined() || groups == 1) return;
  MetaWorkspace ws;
  ws.take(groups * cols, x.dtype() == DType::f64 ? DType::f64 : DType::f32);
}

}  // namespace

EMBER_REGISTER_CUDA_REPLAY(reduce, reduce_replay);
EMBER_REGISTER_CUDA_REPLAY(layer_norm, layer_norm_replay);
EMBER_REGISTER_CUDA_REPLAY(add_layer_norm, add_layer_norm_replay);
EMBER_REGISTER_CUDA_REPLAY(layer_norm_backward, layer_norm_backward_replay);
EMBER_REGISTER_CUDA_REPLAY(bias_gelu_backward, bias_gelu_backward_replay);

}  // namespace ember::kernels::meta
