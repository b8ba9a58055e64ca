// Linear, Embedding, Dropout, activations, Flatten and the containers (layers.h). Invariant: parameters are made
// with PyTorch's shapes and names and initialised through nn::init from the default Philox generator.
#include <cmath>
#include <sstream>

#include "ember/core/grad_mode.h"
#include "ember/nn/init.h"
#include "ember/nn/layers.h"

namespace ember::nn {

namespace {
const char* py_bool(bool b) { return b ? "True" : "False"; }
}  // namespace

std::string Size2::str() const {
  std::ostringstream os;
  os << "(" << h << ", " << w << ")";
  return os.str();
}

// ---- Linear ------------------------------------------------------------------------------------------------------

Linear::Linear(int64_t in_features_, int64_t out_features_, bool with_bias)
    : Module("Linear"), in_features(in_features_), out_features(out_features_) {
  EMBER_CHECK(in_features >= 0 && out_features >= 0, ValueError, "Linear: sizes must be non-negative, got in=",
              in_features, ", out=", out_features);
  weight = register_parameter("weight", empty({out_features, in_features}));
  bias = register_parameter("bias", with_bias ? empty({out_features}) : Tensor());
  reset_parameters();
}

void Linear::reset_parameters() {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const double bound = in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0.0;
    init::uniform_(bias, -bound, bound);
  }
}

void Linear::check_input(const Tensor& x) const {
  EMBER_CHECK(x.dim() >= 1 && x.size(-1) == in_features, ShapeError, "Linear(in_features=", in_features,
              ", out_features=", out_features, "): expects input of shape [..., ", in_features, "], got ",
              x.description());
}

Tensor Linear::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  check_input(x);
  if (packed_weight) {
    check_packed_inference("Linear", *packed_weight, x, bias);
    return packed_weight->linear(x, bias);
  }
  return linear(x, weight, bias);
}

Tensor Linear::forward_unbiased(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  check_input(x);
  if (packed_weight) {
    check_packed_inference("Linear", *packed_weight, x, Tensor());
    return packed_weight->linear(x, Tensor());
  }
  return linear(x, weight);
}

std::string Linear::extra_repr() const {
  std::ostringstream os;
  os << "in_features=" << in_features << ", out_features=" << out_features << ", bias=" << py_bool(bias.defined());
  return os.str();
}

// ---- Embedding ---------------------------------------------------------------------------------------------------

Embedding::Embedding(int64_t num_embeddings_, int64_t embedding_dim_)
    : Module("Embedding"), num_embeddings(num_embeddings_), embedding_dim(embedding_dim_) {
  EMBER_CHECK(num_embeddings >= 0 && embedding_dim >= 0, ValueError, "Embedding: sizes must be non-negative, got ",
              num_embeddings, ", ", embedding_dim);
  weight = register_parameter("weight", empty({num_embeddings, embedding_dim}));
  reset_parameters();
}

void Embedding::reset_parameters() { init::normal_(weight, 0.0, 1.0); }

Tensor Embedding::forward(const Tensor& indices) {
  EMBER_MODULE_SCOPE();
  EMBER_CHECK(indices.dtype() == DType::i64 || indices.dtype() == DType::i32, DTypeError, "Embedding(",
              num_embeddings, ", ", embedding_dim, "): expects integer (i64 or i32) indices, got ",
              indices.description());
  return embedding(weight, indices);
}

std::string Embedding::extra_repr() const {
  return std::to_string(num_embeddings) + ", " + std::to_string(embedding_dim);
}

// ---- Dropout, activations, Flatten ------------------------------------------------------------------------------

Dropout::Dropout(double p_) : Module("Dropout"), p(p_) {
  EMBER_CHECK(p >= 0.0 && p <= 1.0, ValueError, "Dropout: probability must be in [0, 1], got ", p);
}

Tensor Dropout::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  return dropout(x, p, is_training());
}

std::string Dropout::extra_repr() const {
  std::ostringstream os;
  os << "p=" << p;
  return os.str();
}

Tensor ReLU::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  return inplace && can_write_in_place(x) ? relu_(x) : relu(x);
}
std::string ReLU::extra_repr() const { return inplace ? "inplace=True" : ""; }
Tensor SiLU::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  return silu(x);
}
Tensor Tanh::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  return tanh(x);
}
Tensor Sigmoid::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  return sigmoid(x);
}

GELU::GELU(const std::string& approximate_) : Module("GELU"), approximate(approximate_) {
  EMBER_CHECK(approximate == "none" || approximate == "tanh", ValueError,
              "GELU: approximate must be 'none' or 'tanh', got '", approximate, "'");
}

Tensor GELU::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  return gelu(x, approximate == "tanh" ? GeluApprox::Tanh : GeluApprox::None);
}

Tensor GELU::forward_biased(const Tensor& x, const Tensor& bias) {
  EMBER_MODULE_SCOPE();
  return bias_gelu(x, bias, approximate == "tanh" ? GeluApprox::Tanh : GeluApprox::None);
}

std::string GELU::extra_repr() const { return "approximate='" + approximate + "'"; }

Flatten::Flatten(int64_t start_dim_, int64_t end_dim_) : Module("Flatten"), start_dim(start_dim_), end_dim(end_dim_) {}

Tensor Flatten::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  const int64_t n = x.dim();
  const int64_t s = start_dim < 0 ? start_dim + n : start_dim;
  const int64_t e = end_dim < 0 ? end_dim + n : end_dim;
  // A 0-d input flattens to [1] (PyTorch), whatever the dims.
  if (n == 0) return x.reshape({1});
  EMBER_CHECK(s >= 0 && s < n && e >= 0 && e < n && s <= e, ShapeError, "Flatten(", extra_repr(), "): input ",
              x.description(), " has ", n, " dims, which do not contain the range");
  return x.flatten(s, e);
}

std::string Flatten::extra_repr() const {
  return "start_dim=" + std::to_string(start_dim) + ", end_dim=" + std::to_string(end_dim);
}

// ---- containers --------------------------------------------------------------------------------------------------

Tensor Sequential::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  if (!checkpoint_plan_.segments.empty()) return autograd::run_chain(chain(), x, checkpoint_plan_);
  Tensor out = x;
  for (const auto& m : modules_) out = m->forward(out);
  return out;
}

std::vector<autograd::TensorFn> Sequential::chain() const {
  std::vector<autograd::TensorFn> fns;
  for (const std::shared_ptr<Module>& m : modules_) fns.push_back([m](const Tensor& in) { return m->forward(in); });
  return fns;
}

void Sequential::set_checkpoint_plan(autograd::CheckpointPlan plan) {
  if (!plan.segments.empty())
    plan.check_covers(static_cast<int64_t>(modules_.size()), "Sequential::set_checkpoint_plan (blocks = modules)");
  checkpoint_plan_ = std::move(plan);
}

autograd::CheckpointPlan Sequential::plan_checkpointing(const Tensor& x, const autograd::CheckpointPolicy& policy) {
  // The profiling forward must not count as a training batch: buffers (BatchNorm's running statistics) are put back.
  std::vector<std::pair<Tensor, Tensor>> buffers;
  {
    NoGradGuard no_grad;
    for (const auto& [name, b] : named_buffers())
      if (b.defined()) buffers.emplace_back(b, b.clone());
  }
  std::vector<autograd::BlockProfile> profile = autograd::profile_chain(chain(), x);
  {
    NoGradGuard no_grad;
    for (auto& [live, saved] : buffers) Tensor(live).copy_(saved);
  }
  autograd::CheckpointPlan plan = autograd::plan_checkpoints(profile, policy);
  set_checkpoint_plan(plan);
  return plan;
}

const std::shared_ptr<Module>& Sequential::operator[](size_t i) const {
  EMBER_CHECK(i < modules_.size(), IndexError, "Sequential: index ", i, " out of range for ", modules_.size(),
              " modules");
  return modules_[i];
}

const std::shared_ptr<Module>& ModuleList::operator[](size_t i) const {
  EMBER_CHECK(i < modules_.size(), IndexError, "ModuleList: index ", i, " out of range for ", modules_.size(),
              " modules");
  return modules_[i];
}

}  // namespace ember::nn
