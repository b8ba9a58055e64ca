// The standard layers (torch.nn): Linear, Conv2d, BatchNorm2d, LayerNorm, Embedding, Dropout, pooling, activations,
// Flatten, and the Sequential / ModuleList containers — PyTorch's constructor arguments, defaults, init schemes and
// parameter names. Invariant: state_dict keys equal PyTorch's ("0.weight", "bn.running_mean", ...), so safetensors
// checkpoints move between the two; a layer's tensor members are its registered handles (module.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ember/autograd/checkpoint_plan.h"
#include "ember/autograd/functions.h"
#include "ember/base/error.h"
#include "ember/nn/module.h"
#include "ember/nn/packed_weight.h"

namespace ember::nn {

// A (height, width) pair given as one int (both) or two: `3` or `{3, 5}` (PyTorch's int-or-tuple arguments).
struct Size2 {
  int64_t h = 0, w = 0;
  Size2(int64_t v) : h(v), w(v) {}  // NOLINT: implicit on purpose
  Size2(int64_t h_, int64_t w_) : h(h_), w(w_) {}
  bool operator==(const Size2& o) const { return h == o.h && w == o.w; }
  std::string str() const;  // "(3, 5)"
};

// ---- linear, embedding ---------------------------------------------------------------------------------------------

// y = x W^T + b over the last dim. weight [out_features, in_features], bias [out_features].
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  // x @ weight^T without the bias, for a caller that adds the bias itself in a fused op (GELU::forward_biased).
  Tensor forward_unbiased(const Tensor& x);
  // weight: kaiming_uniform_(a = sqrt(5)), i.e. U(+-1/sqrt(in)); bias: U(+-1/sqrt(in)) (PyTorch).
  void reset_parameters();

  int64_t in_features, out_features;
  Tensor weight, bias;  // bias undefined when bias = false; weight undefined while packed
  // Set by to_sparse / quantize_int8 (packed_weight.h): forward then runs on the packed form, for inference only.
  std::shared_ptr<PackedWeight> packed_weight;

 protected:
  std::string extra_repr() const override;

 private:
  void check_input(const Tensor& x) const;
};

// Rows of weight [num_embeddings, embedding_dim] (init N(0, 1)) picked by an integer index tensor of any shape.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  Tensor forward(const Tensor& indices) override;
  void reset_parameters();

  int64_t num_embeddings, embedding_dim;
  Tensor weight;

 protected:
  std::string extra_repr() const override;
};

// ---- convolution and pooling ---------------------------------------------------------------------------------------

// libtorch's torch::nn::Conv2dOptions: Conv2d(Conv2dOptions(3, 16, 3).stride(2).padding(1).bias(false)).
class Conv2dOptions {
 public:
  Conv2dOptions(int64_t in_channels, int64_t out_channels, Size2 kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}
  Conv2dOptions& stride(Size2 v) { stride_ = v; return *this; }
  Conv2dOptions& padding(Size2 v) { padding_ = v; return *this; }
  Conv2dOptions& dilation(Size2 v) { dilation_ = v; return *this; }
  Conv2dOptions& groups(int64_t v) { groups_ = v; return *this; }
  Conv2dOptions& bias(bool v) { bias_ = v; return *this; }
  int64_t in_channels() const { return in_channels_; }
  int64_t out_channels() const { return out_channels_; }
  // Set by structured pruning when it shrinks the layer (with its weight and bias).
  Conv2dOptions& in_channels(int64_t v) { in_channels_ = v; return *this; }
  Conv2dOptions& out_channels(int64_t v) { out_channels_ = v; return *this; }
  Size2 kernel_size() const { return kernel_size_; }
  Size2 stride() const { return stride_; }
  Size2 padding() const { return padding_; }
  Size2 dilation() const { return dilation_; }
  int64_t groups() const { return groups_; }
  bool bias() const { return bias_; }
  // The kernel parameters (stride, padding, dilation, groups) these options describe.
  Conv2dParams params() const {
    Conv2dParams p;
    p.stride[0] = stride_.h;
    p.stride[1] = stride_.w;
    p.padding[0] = padding_.h;
    p.padding[1] = padding_.w;
    p.dilation[0] = dilation_.h;
    p.dilation[1] = dilation_.w;
    p.groups = groups_;
    return p;
  }

 private:
  int64_t in_channels_, out_channels_;
  Size2 kernel_size_;
  Size2 stride_ = 1, padding_ = 0, dilation_ = 1;
  int64_t groups_ = 1;
  bool bias_ = true;
};

// 2-d convolution of x [N, C_in, H, W]. weight [out, in / groups, kh, kw], bias [out]; Linear's default init.
class Conv2d : public Module {
 public:
  explicit Conv2d(const Conv2dOptions& options);
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride = 1, Size2 padding = 0,
         Size2 dilation = 1, int64_t groups = 1, bool bias = true);
  Tensor forward(const Tensor& x) override;
  void reset_parameters();

  Conv2dOptions options;
  Tensor weight, bias;  // weight undefined while packed
  std::shared_ptr<PackedWeight> packed_weight;  // as Linear's

 protected:
  std::string extra_repr() const override;
};

// Max / average pooling over [N, C, H, W]; stride defaults to the kernel size (PyTorch's stride=None).
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Size2 kernel_size);
  MaxPool2d(Size2 kernel_size, Size2 stride, Size2 padding = 0);
  Tensor forward(const Tensor& x) override;

  Size2 kernel_size, stride, padding;

 protected:
  std::string extra_repr() const override;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Size2 kernel_size);
  AvgPool2d(Size2 kernel_size, Size2 stride, Size2 padding = 0, bool count_include_pad = true);
  Tensor forward(const Tensor& x) override;

  Size2 kernel_size, stride, padding;
  bool count_include_pad;

 protected:
  std::string extra_repr() const override;
};

// Average over PyTorch's adaptive windows: output row i covers input rows [floor(i*H/OH), ceil((i+1)*H/OH)), and
// likewise for columns — exact for every input and output size (Note [Adaptive pooling as two matmuls]).
class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Size2 output_size);
  Tensor forward(const Tensor& x) override;

  Size2 output_size;

 protected:
  std::string extra_repr() const override;
};

// ---- normalisation, dropout -----------------------------------------------------------------------------------------

// Batch normalisation over (N, H, W) per channel of x [N, C, H, W] (Note [BatchNorm statistics]). momentum
// nullopt = cumulative moving average (PyTorch's momentum=None).
class BatchNorm2d : public Module {
 public:
  BatchNorm2d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1, bool affine = true,
              bool track_running_stats = true);
  Tensor forward(const Tensor& x) override;
  void reset_running_stats();
  void reset_parameters();  // running stats reset, weight = 1, bias = 0

  int64_t num_features;
  double eps;
  std::optional<double> momentum;
  bool affine, track_running_stats;
  Tensor weight, bias;                                          // [C]; undefined unless affine
  Tensor running_mean, running_var, num_batches_tracked;        // [C], [C], i64 0-d; undefined unless tracking

 protected:
  std::string extra_repr() const override;
};

// Layer normalisation over the trailing normalized_shape dims (ember::layer_norm); weight 1, bias 0.
class LayerNorm : public Module {
 public:
  LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true, bool bias = true);
  LayerNorm(int64_t normalized_size, double eps = 1e-5, bool elementwise_affine = true, bool bias = true);
  Tensor forward(const Tensor& x) override;
  // {x + residual, forward(x + residual)} in one kernel (ember::add_layer_norm): a pre-norm block's residual add
  // and the next sub-layer's normalisation.
  AddLayerNormOutputs forward_add(const Tensor& x, const Tensor& residual);
  void reset_parameters();

  Shape normalized_shape;
  double eps;
  bool elementwise_affine;
  Tensor weight, bias;  // normalized_shape; undefined when not affine (bias also when bias = false)

 protected:
  std::string extra_repr() const override;

 private:
  void check_input(const Tensor& x) const;
};

// Zeroes elements with probability p while training (scaling the rest by 1/(1-p)); identity in eval mode.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;

  double p;

 protected:
  std::string extra_repr() const override;
};

// ---- activations and reshaping --------------------------------------------------------------------------------------

// inplace: writes into its input where nothing else sees it (relu_ when can_write_in_place, else relu; Note
// [In-place ReLU]): one activation fewer alive in the forward.
class ReLU : public Module {
 public:
  explicit ReLU(bool inplace = false) : Module("ReLU"), inplace(inplace) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  bool inplace;
};

// approximate: "none" (erf) or "tanh".
class GELU : public Module {
 public:
  explicit GELU(const std::string& approximate = "none");
  Tensor forward(const Tensor& x) override;
  // forward(x + bias) in one pass (ember::bias_gelu), bias [N] over x [..., N]: the GELU after a Linear that left its
  // bias out (Linear::forward_unbiased).
  Tensor forward_biased(const Tensor& x, const Tensor& bias);

  std::string approximate;

 protected:
  std::string extra_repr() const override;
};

class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& x) override;
};

class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& x) override;
};

class Sigmoid : public Module {
 public:
  Sigmoid() : Module("Sigmoid") {}
  Tensor forward(const Tensor& x) override;
};

class Identity : public Module {
 public:
  Identity() : Module("Identity") {}
  Tensor forward(const Tensor& x) override {
    EMBER_MODULE_SCOPE();
    return x;
  }
};

// Flattens dims start_dim..end_dim (negative dims count from the end) into one; a view when strides allow.
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1);
  Tensor forward(const Tensor& x) override;

  int64_t start_dim, end_dim;

 protected:
  std::string extra_repr() const override;
};

// ---- containers ------------------------------------------------------------------------------------------------------

// Children named "0", "1", ... in order (or by the name given to push_back); forward feeds each child's output to
// the next.
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  template <class... Ms>
  explicit Sequential(std::shared_ptr<Ms>... modules) : Sequential() {
    (push_back(std::move(modules)), ...);
  }

  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    return push_back(std::to_string(modules_.size()), std::move(module));
  }
  template <class M>
  std::shared_ptr<M> push_back(const std::string& name, std::shared_ptr<M> module) {
    register_module(name, module);
    modules_.push_back(module);
    return module;
  }

  Tensor forward(const Tensor& x) override;
  size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  const std::shared_ptr<Module>& operator[](size_t i) const;  // IndexError when out of range
  // The i-th module as M (ValueError when it is not an M).
  template <class M>
  std::shared_ptr<M> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[i]);
    EMBER_CHECK(m != nullptr, ValueError, "Sequential::at(", i, "): module is a ", (*this)[i]->type_name());
    return m;
  }
  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

  // Activation checkpointing (autograd/checkpoint_plan.h), each child one block: with a plan installed, forward runs
  // the children as a chain under it. set_checkpoint_plan raises ValueError unless the plan covers exactly size()
  // blocks; an empty plan (no segments) uninstalls. plan_checkpointing profiles the children once on x (a recorded
  // forward; the default generator's state and the buffers — BatchNorm statistics — are left as they were), plans for
  // `policy`, installs the plan and returns it.
  void set_checkpoint_plan(autograd::CheckpointPlan plan);
  const autograd::CheckpointPlan& checkpoint_plan() const { return checkpoint_plan_; }
  autograd::CheckpointPlan plan_checkpointing(const Tensor& x, const autograd::CheckpointPolicy& policy);

 private:
  std::vector<autograd::TensorFn> chain() const;  // the children as functions (holding the modules)

  std::vector<std::shared_ptr<Module>> modules_;
  autograd::CheckpointPlan checkpoint_plan_;  // no segments: none installed
};

// A list of modules named "0", "1", ...; registers them (parameters, to(), state_dict) but has no forward.
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  template <class... Ms>
  explicit ModuleList(std::shared_ptr<Ms>... modules) : ModuleList() {
    (push_back(std::move(modules)), ...);
  }

  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    register_module(std::to_string(modules_.size()), module);
    modules_.push_back(module);
    return module;
  }

  size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  const std::shared_ptr<Module>& operator[](size_t i) const;  // IndexError when out of range
  template <class M>
  std::shared_ptr<M> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[i]);
    EMBER_CHECK(m != nullptr, ValueError, "ModuleList::at(", i, "): module is a ", (*this)[i]->type_name());
    return m;
  }
  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace ember::nn
