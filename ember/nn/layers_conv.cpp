// Conv2d, MaxPool2d, AvgPool2d and AdaptiveAvgPool2d (layers.h). Invariant: every forward accepts [N, C, H, W] or
// an unbatched [C, H, W] input (returned unbatched, like PyTorch) and raises ShapeError naming the layer otherwise.
#include <cmath>
#include <sstream>

#include "ember/nn/init.h"
#include "ember/nn/layers.h"

namespace ember::nn {

namespace {

// Runs f on x as a batch: a 3-d input gets a batch dim of 1 that the result drops again.
template <class Fn>
Tensor batched(const Tensor& x, Fn f) {
  if (x.dim() == 3) return f(x.unsqueeze(0)).squeeze(0);
  return f(x);
}

void check_image_input(const Module& m, const std::string& repr, const Tensor& x) {
  EMBER_CHECK(x.dim() == 3 || x.dim() == 4, ShapeError, m.type_name(), "(", repr,
              "): expects input of shape [N, C, H, W] or [C, H, W], got ", x.description());
}

// "2" for a square pair, "(2, 3)" otherwise (how PyTorch prints an int-or-tuple argument given as an int).
std::string pair_repr(const Size2& s) { return s.h == s.w ? std::to_string(s.h) : s.str(); }

Pool2dParams pool_params(Size2 kernel, Size2 stride, Size2 padding, bool count_include_pad) {
  Pool2dParams p;
  p.kernel[0] = kernel.h;
  p.kernel[1] = kernel.w;
  p.stride[0] = stride.h;
  p.stride[1] = stride.w;
  p.padding[0] = padding.h;
  p.padding[1] = padding.w;
  p.count_include_pad = count_include_pad;
  return p;
}

}  // namespace

// ---- Conv2d ------------------------------------------------------------------------------------------------------

Conv2d::Conv2d(const Conv2dOptions& options_) : Module("Conv2d"), options(options_) {
  const Conv2dOptions& o = options;
  EMBER_CHECK(o.in_channels() > 0 && o.out_channels() > 0, ValueError, "Conv2d: channel counts must be positive, got ",
              o.in_channels(), " and ", o.out_channels());
  EMBER_CHECK(o.groups() > 0, ValueError, "Conv2d: groups must be positive, got ", o.groups());
  EMBER_CHECK(o.in_channels() % o.groups() == 0, ValueError, "Conv2d: in_channels ", o.in_channels(),
              " must be divisible by groups ", o.groups());
  EMBER_CHECK(o.out_channels() % o.groups() == 0, ValueError, "Conv2d: out_channels ", o.out_channels(),
              " must be divisible by groups ", o.groups());
  EMBER_CHECK(o.kernel_size().h > 0 && o.kernel_size().w > 0, ValueError, "Conv2d: kernel_size must be positive, got ",
              o.kernel_size().str());
  EMBER_CHECK(o.stride().h > 0 && o.stride().w > 0, ValueError, "Conv2d: stride must be positive, got ",
              o.stride().str());
  EMBER_CHECK(o.dilation().h > 0 && o.dilation().w > 0, ValueError, "Conv2d: dilation must be positive, got ",
              o.dilation().str());
  EMBER_CHECK(o.padding().h >= 0 && o.padding().w >= 0, ValueError, "Conv2d: padding must be non-negative, got ",
              o.padding().str());
  weight = register_parameter(
      "weight", empty({o.out_channels(), o.in_channels() / o.groups(), o.kernel_size().h, o.kernel_size().w}));
  bias = register_parameter("bias", o.bias() ? empty({o.out_channels()}) : Tensor());
  reset_parameters();
}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride, Size2 padding,
               Size2 dilation, int64_t groups, bool bias)
    : Conv2d(Conv2dOptions(in_channels, out_channels, kernel_size)
                 .stride(stride)
                 .padding(padding)
                 .dilation(dilation)
                 .groups(groups)
                 .bias(bias)) {}

void Conv2d::reset_parameters() {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const int64_t fan_in = init::calculate_fan_in_and_fan_out(weight).first;
    const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Conv2d::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  check_image_input(*this, extra_repr(), x);
  const int64_t c = x.size(-3);
  EMBER_CHECK(c == options.in_channels(), ShapeError, "Conv2d(", extra_repr(), "): expects ", options.in_channels(),
              " input channels, got input ", x.description());
  if (packed_weight) {
    check_packed_inference("Conv2d", *packed_weight, x, bias);
    return packed_weight->conv2d(x, bias, options);
  }
  const Conv2dParams p = options.params();
  return batched(x, [&](const Tensor& xb) { return conv2d(xb, weight, bias, p); });
}

std::string Conv2d::extra_repr() const {
  const Conv2dOptions& o = options;
  std::ostringstream os;
  os << o.in_channels() << ", " << o.out_channels() << ", kernel_size=" << o.kernel_size().str()
     << ", stride=" << o.stride().str();
  if (!(o.padding() == Size2(0))) os << ", padding=" << o.padding().str();
  if (!(o.dilation() == Size2(1))) os << ", dilation=" << o.dilation().str();
  if (o.groups() != 1) os << ", groups=" << o.groups();
  if (!o.bias()) os << ", bias=False";
  return os.str();
}

// ---- MaxPool2d, AvgPool2d -----------------------------------------------------------------------------------------

MaxPool2d::MaxPool2d(Size2 kernel_size_) : MaxPool2d(kernel_size_, kernel_size_) {}

MaxPool2d::MaxPool2d(Size2 kernel_size_, Size2 stride_, Size2 padding_)
    : Module("MaxPool2d"), kernel_size(kernel_size_), stride(stride_), padding(padding_) {}

Tensor MaxPool2d::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  check_image_input(*this, extra_repr(), x);
  const Pool2dParams p = pool_params(kernel_size, stride, padding, true);
  return batched(x, [&](const Tensor& xb) { return max_pool2d(xb, p); });
}

std::string MaxPool2d::extra_repr() const {
  return "kernel_size=" + pair_repr(kernel_size) + ", stride=" + pair_repr(stride) + ", padding=" + pair_repr(padding);
}

AvgPool2d::AvgPool2d(Size2 kernel_size_) : AvgPool2d(kernel_size_, kernel_size_) {}

AvgPool2d::AvgPool2d(Size2 kernel_size_, Size2 stride_, Size2 padding_, bool count_include_pad_)
    : Module("AvgPool2d"),
      kernel_size(kernel_size_),
      stride(stride_),
      padding(padding_),
      count_include_pad(count_include_pad_) {}

Tensor AvgPool2d::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  check_image_input(*this, extra_repr(), x);
  const Pool2dParams p = pool_params(kernel_size, stride, padding, count_include_pad);
  return batched(x, [&](const Tensor& xb) { return avg_pool2d(xb, p); });
}

std::string AvgPool2d::extra_repr() const {
  return "kernel_size=" + pair_repr(kernel_size) + ", stride=" + pair_repr(stride) + ", padding=" + pair_repr(padding) +
         (count_include_pad ? "" : ", count_include_pad=False");
}

// ---- AdaptiveAvgPool2d --------------------------------------------------------------------------------------------

// Note [Adaptive pooling as two matmuls]
// PyTorch's adaptive window for output row i is [floor(i*H/OH), ceil((i+1)*H/OH)) and likewise for columns; the
// output is the mean over the product of a row window and a column window, so it factors:
//   out[n, c] = Ph @ x[n, c] @ Pw^T,  Ph[i, h] = 1 / |row window i| for h in it (0 elsewhere), Pw likewise.
// That is exact for every size (windows may overlap or, when OH > H, repeat rows) and differentiable through
// matmul. When H % OH == 0 and W % OW == 0 the windows tile the input and avg_pool2d does the same in one pass.
namespace {
Tensor adaptive_matrix(int64_t in, int64_t out, const Tensor& like) {
  std::vector<double> m(static_cast<size_t>(out * in), 0.0);
  for (int64_t i = 0; i < out; ++i) {
    const int64_t start = (i * in) / out;                  // floor
    const int64_t end = ((i + 1) * in + out - 1) / out;    // ceil
    for (int64_t k = start; k < end; ++k) m[static_cast<size_t>(i * in + k)] = 1.0 / static_cast<double>(end - start);
  }
  return from_vector(m, {out, in}, TensorOptions(like.dtype(), like.device()));
}
}  // namespace

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Size2 output_size_) : Module("AdaptiveAvgPool2d"), output_size(output_size_) {
  EMBER_CHECK(output_size.h > 0 && output_size.w > 0, ValueError,
              "AdaptiveAvgPool2d: output_size must be positive, got ", output_size.str());
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  check_image_input(*this, extra_repr(), x);
  const int64_t h = x.size(-2), w = x.size(-1), oh = output_size.h, ow = output_size.w;
  EMBER_CHECK(h > 0 && w > 0, ShapeError, "AdaptiveAvgPool2d(", extra_repr(), "): input ", x.description(),
              " has an empty spatial dim");
  check_floating("AdaptiveAvgPool2d", x);
  if (h % oh == 0 && w % ow == 0) {
    const Pool2dParams p = pool_params(Size2(h / oh, w / ow), Size2(h / oh, w / ow), 0, true);
    return batched(x, [&](const Tensor& xb) { return avg_pool2d(xb, p); });
  }
  const Tensor pw_t = adaptive_matrix(w, ow, x).t();  // [W, OW]
  const Tensor ph_t = adaptive_matrix(h, oh, x).t();  // [H, OH]
  const Tensor cols = matmul(x, pw_t);                                  // [..., H, OW]
  const Tensor rows = matmul(cols.transpose(-1, -2), ph_t);             // [..., OW, OH]
  return rows.transpose(-1, -2).contiguous();                           // [..., OH, OW]
}

std::string AdaptiveAvgPool2d::extra_repr() const { return "output_size=" + pair_repr(output_size); }

}  // namespace ember::nn
