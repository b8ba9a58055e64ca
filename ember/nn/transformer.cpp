// nanoGPT's GPT: attention, MLP, block and model forward passes, nanoGPT's initialisation and sampling.
// Invariant: module registration order and names follow nanoGPT's model.py, so state_dict() lists the same keys in
// the same order (transformer.wte.weight, ..., transformer.ln_f.weight, lm_head.weight).
#include "ember/nn/transformer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>

#include "ember/base/error.h"
#include "ember/core/generator.h"
#include "ember/core/grad_mode.h"
#include "ember/nn/functional.h"
#include "ember/nn/init.h"

namespace ember::nn {

namespace F = functional;

namespace {

void check_config(const GPTConfig& c) {
  EMBER_CHECK(c.vocab_size > 0 && c.block_size > 0 && c.n_layer >= 0 && c.n_head > 0 && c.n_embd > 0, ValueError,
              "GPTConfig: vocab_size, block_size, n_head and n_embd must be positive and n_layer >= 0, got vocab_size=",
              c.vocab_size, " block_size=", c.block_size, " n_layer=", c.n_layer, " n_head=", c.n_head,
              " n_embd=", c.n_embd);
  EMBER_CHECK(c.n_embd % c.n_head == 0, ValueError, "GPTConfig: n_embd (", c.n_embd,
              ") must be divisible by n_head (", c.n_head, ")");
  EMBER_CHECK(c.dropout >= 0.0 && c.dropout <= 1.0, ValueError, "GPTConfig: dropout must be in [0, 1], got ",
              c.dropout);
}

}  // namespace

// ---- attention, MLP, block -----------------------------------------------------------------------------------------

CausalSelfAttention::CausalSelfAttention(const GPTConfig& config)
    : Module("CausalSelfAttention"), n_head(config.n_head), n_embd(config.n_embd), dropout(config.dropout) {
  check_config(config);
  c_attn = register_module("c_attn", std::make_shared<Linear>(n_embd, 3 * n_embd, config.bias));
  c_proj = register_module("c_proj", std::make_shared<Linear>(n_embd, n_embd, config.bias));
  attn_dropout = register_module("attn_dropout", std::make_shared<Dropout>(dropout));
  resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(dropout));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  EMBER_CHECK(x.dim() == 3 && x.size(2) == n_embd, ShapeError, "CausalSelfAttention: expects [B, T, ", n_embd,
              "], got ", shape_str(x.sizes()));
  const int64_t B = x.size(0), T = x.size(1), C = n_embd, hd = C / n_head;
  const Tensor qkv = c_attn->forward(x);  // [B, T, 3 C]
  const double p = is_training() ? attn_dropout->p : 0.0;
  // One fused node where the device has the kernel for qkv's dtype (Note [Fused attention] in
  // kernels/cpu/attention.cpp); the composed ops otherwise, and for attention-weight dropout.
  if (p == 0.0 && has_attention_kernel(qkv.device(), qkv.dtype()))
    return resid_dropout->forward(c_proj->forward(attention_qkv(qkv, n_head, /*causal=*/true)));
  // q, k, v are slice views of qkv; [B, T, C] -> [B, T, H, hd] -> [B, H, T, hd] without copies.
  auto heads = [&](int64_t i) { return qkv.slice(2, i * C, (i + 1) * C).view({B, T, n_head, hd}).transpose(1, 2); };
  const Tensor q = heads(0), k = heads(1), v = heads(2);
  // The attention-weight dropout is attn_dropout's job in nanoGPT's slow path; the fused call takes its p directly.
  Tensor y = F::scaled_dot_product_attention(q, k, v, Tensor(), p, /*is_causal=*/true);  // [B, H, T, hd]
  y = y.transpose(1, 2).reshape({B, T, C});                                              // heads side by side
  return resid_dropout->forward(c_proj->forward(y));
}

MLP::MLP(const GPTConfig& config) : Module("MLP") {
  check_config(config);
  c_fc = register_module("c_fc", std::make_shared<Linear>(config.n_embd, 4 * config.n_embd, config.bias));
  gelu = register_module("gelu", std::make_shared<GELU>("none"));
  c_proj = register_module("c_proj", std::make_shared<Linear>(4 * config.n_embd, config.n_embd, config.bias));
  dropout = register_module("dropout", std::make_shared<Dropout>(config.dropout));
}

Tensor MLP::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  // The bias of c_fc is added inside the GELU (Note [Bias and GELU] in kernels/ops_bias_gelu.cpp).
  const Tensor h = c_fc->bias.defined() ? gelu->forward_biased(c_fc->forward_unbiased(x), c_fc->bias)
                                        : gelu->forward(c_fc->forward(x));
  return dropout->forward(c_proj->forward(h));
}

Block::Block(const GPTConfig& config) : Module("Block") {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(config.n_embd, 1e-5, true, config.bias));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(config));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(config.n_embd, 1e-5, true, config.bias));
  mlp = register_module("mlp", std::make_shared<MLP>(config));
}

Tensor Block::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  // The residual add and ln_2 in one kernel (Note [Residual add and layer norm] in kernels/ops_norm.cpp).
  const AddLayerNormOutputs h = ln_2->forward_add(x, attn->forward(ln_1->forward(x)));
  return add(h.sum, mlp->forward(h.out));
}

// ---- GPT -----------------------------------------------------------------------------------------------------------

TiedLinear::TiedLinear(const Tensor& w) : Module("TiedLinear") {
  EMBER_CHECK(w.defined() && w.dim() == 2, ShapeError, "TiedLinear: weight must be [out, in]");
  weight = register_parameter("weight", w);  // Note [Tied lm_head]: the owner's tensor itself, not a copy
}

Tensor TiedLinear::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  return linear(x, weight);
}

std::string TiedLinear::extra_repr() const {
  std::ostringstream os;
  os << "in_features=" << weight.size(1) << ", out_features=" << weight.size(0) << ", bias=false, tied";
  return os.str();
}

GPTTransformer::GPTTransformer(const GPTConfig& config) : Module("GPTTransformer") {
  wte = register_module("wte", std::make_shared<Embedding>(config.vocab_size, config.n_embd));
  wpe = register_module("wpe", std::make_shared<Embedding>(config.block_size, config.n_embd));
  drop = register_module("drop", std::make_shared<Dropout>(config.dropout));
  h = register_module("h", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < config.n_layer; ++i) h->push_back(std::make_shared<Block>(config));
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(config.n_embd, 1e-5, true, config.bias));
}

GPT::GPT(const GPTConfig& cfg) : Module("GPT"), config(cfg) {
  check_config(config);
  transformer = register_module("transformer", std::make_shared<GPTTransformer>(config));
  lm_head = register_module("lm_head", std::make_shared<TiedLinear>(transformer->wte->weight));
  init_weights();
}

// nanoGPT: self.apply(self._init_weights), then the scaled init of the residual projections (GPT-2 paper).
void GPT::init_weights() {
  for (const auto& [name, m] : named_modules()) {
    if (auto* lin = dynamic_cast<Linear*>(m.get())) {
      init::normal_(lin->weight, 0.0, 0.02);
      if (lin->bias.defined()) init::zeros_(lin->bias);
    } else if (auto* emb = dynamic_cast<Embedding*>(m.get())) {
      init::normal_(emb->weight, 0.0, 0.02);
    }
  }
  const double proj_std = 0.02 / std::sqrt(2.0 * double(config.n_layer));
  for (const auto& [name, p] : named_parameters()) {
    const std::string suffix = "c_proj.weight";
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      init::normal_(p, 0.0, proj_std);
  }
}

Tensor GPT::embed(const Tensor& idx) {
  EMBER_CHECK(idx.defined() && idx.dtype() == DType::i64, DTypeError, "GPT: idx must be an i64 tensor of token ids",
              idx.defined() ? std::string(", got ") + dtype_name(idx.dtype()) : std::string());
  EMBER_CHECK(idx.dim() == 2, ShapeError, "GPT: idx must be [B, T], got ", shape_str(idx.sizes()));
  const int64_t T = idx.size(1);
  EMBER_CHECK(T <= config.block_size, ValueError, "GPT: cannot forward a sequence of length ", T,
              ", block size is only ", config.block_size);
  const Tensor pos = arange(T, TensorOptions(DType::i64, idx.device()));
  const Tensor tok_emb = transformer->wte->forward(idx);  // [B, T, C]
  const Tensor pos_emb = transformer->wpe->forward(pos);  // [T, C]
  return transformer->drop->forward(add(tok_emb, pos_emb));
}

std::vector<autograd::TensorFn> GPT::block_chain() {
  std::vector<autograd::TensorFn> fns;
  for (const std::shared_ptr<Module>& block : *transformer->h)
    fns.push_back([block](const Tensor& x) { return block->forward(x); });
  return fns;
}

Tensor GPT::forward(const Tensor& idx) {
  EMBER_MODULE_SCOPE();
  Tensor x = embed(idx);
  if (!checkpoint_plan_.segments.empty()) {
    x = autograd::run_chain(block_chain(), x, checkpoint_plan_);
  } else {
    for (const auto& block : *transformer->h) x = block->forward(x);
  }
  x = transformer->ln_f->forward(x);
  return lm_head->forward(x);  // [B, T, vocab_size]
}

void GPT::set_checkpoint_plan(autograd::CheckpointPlan plan) {
  if (!plan.segments.empty()) plan.check_covers(config.n_layer, "GPT::set_checkpoint_plan (blocks = n_layer)");
  checkpoint_plan_ = std::move(plan);
}

autograd::CheckpointPlan GPT::plan_checkpointing(const Tensor& idx, const autograd::CheckpointPolicy& policy) {
  std::vector<autograd::BlockProfile> profile;
  {
    const PhiloxState rng = default_generator().state();  // the embedding dropout draws too
    try {
      AutoGradMode grad_on(true);
      profile = autograd::profile_chain(block_chain(), embed(idx));
    } catch (...) {
      default_generator().set_state(rng);
      throw;
    }
    default_generator().set_state(rng);
  }
  autograd::CheckpointPlan plan = autograd::plan_checkpoints(profile, policy);
  set_checkpoint_plan(plan);
  return plan;
}

GPTOutput GPT::forward(const Tensor& idx, const Tensor& targets) {
  EMBER_MODULE_SCOPE();
  GPTOutput out;
  out.logits = forward(idx);
  if (targets.defined()) {
    EMBER_CHECK(targets.sizes() == idx.sizes(), ShapeError, "GPT: targets ", shape_str(targets.sizes()),
                " must have idx's shape ", shape_str(idx.sizes()));
    out.loss = F::cross_entropy(out.logits.reshape({-1, config.vocab_size}), targets.reshape({-1}),
                                /*ignore_index=*/-1);
  }
  return out;
}

int64_t GPT::get_num_params(bool non_embedding) const {
  int64_t n = num_parameters();
  if (non_embedding) n -= transformer->wpe->weight.numel();
  return n;
}

namespace {

// Puts a module tree in eval mode for a scope, then gives every module its own mode back (parents are listed before
// their children, so setting each in order undoes the recursive train() of the parents).
class EvalScope {
 public:
  explicit EvalScope(Module& root) : modules_(root.named_modules()) {
    for (const auto& [name, m] : modules_) modes_.push_back(m->is_training());
    root.eval();
  }
  ~EvalScope() {
    for (size_t i = 0; i < modules_.size(); ++i) modules_[i].second->train(modes_[i]);
  }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> modules_;
  std::vector<bool> modes_;
};

}  // namespace

Tensor GPT::generate(const Tensor& idx, int64_t max_new_tokens, double temperature, std::optional<int64_t> top_k,
                     uint64_t seed) {
  EMBER_CHECK(idx.defined(), ValueError, "GPT::generate: idx is undefined");
  EMBER_CHECK(idx.dtype() == DType::i64, DTypeError, "GPT::generate: idx must be i64 token ids, got ",
              idx.description());
  EMBER_CHECK(idx.dim() == 2, ShapeError, "GPT::generate: idx must be [B, T], got ", idx.description());
  EMBER_CHECK(idx.size(1) > 0, ShapeError, "GPT::generate: idx ", idx.description(),
              " holds no context; give at least one token per row");
  EMBER_CHECK(temperature > 0.0, ValueError, "GPT::generate: temperature must be positive, got ", temperature);
  EMBER_CHECK(!top_k || *top_k > 0, ValueError, "GPT::generate: top_k must be positive, got ", top_k.value_or(0));
  EMBER_CHECK(max_new_tokens >= 0, ValueError, "GPT::generate: max_new_tokens must be >= 0, got ", max_new_tokens);
  const int64_t B = idx.size(0), V = config.vocab_size;
  const Device device = idx.device();
  if (B == 0) return empty({0, idx.size(1) + max_new_tokens}, TensorOptions(DType::i64, device));
  NoGradGuard no_grad;
  const EvalScope eval_mode(*this);  // no dropout: the text depends on the seed alone, the default generator stays
  std::vector<std::vector<int64_t>> rows(B);
  const std::vector<int64_t> given = idx.to_vector<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    rows[b].assign(given.begin() + b * idx.size(1), given.begin() + (b + 1) * idx.size(1));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    const int64_t T = static_cast<int64_t>(rows[0].size());
    const int64_t Tc = std::min(T, config.block_size);  // crop the context to the last block_size tokens
    std::vector<int64_t> context;
    context.reserve(B * Tc);
    for (const auto& r : rows) context.insert(context.end(), r.end() - Tc, r.end());
    const Tensor logits = forward(from_vector<int64_t>(context, {B, Tc}, TensorOptions(DType::i64, device)));
    const std::vector<double> last = logits.select(1, Tc - 1).to_vector<double>();  // [B, V]
    for (int64_t b = 0; b < B; ++b) {
      std::vector<double> l(last.begin() + b * V, last.begin() + (b + 1) * V);
      for (double& x : l) x /= temperature;
      if (top_k && *top_k < V) {  // keep the top_k largest logits (ties with the k-th kept, as nanoGPT)
        std::vector<double> sorted = l;
        std::nth_element(sorted.begin(), sorted.begin() + (*top_k - 1), sorted.end(), std::greater<double>());
        const double kth = sorted[*top_k - 1];
        for (double& x : l)
          if (x < kth) x = -std::numeric_limits<double>::infinity();
      }
      const double mx = *std::max_element(l.begin(), l.end());
      double z = 0.0;
      for (double& x : l) z += (x = std::exp(x - mx));
      const double u = uniform(rng) * z;
      double acc = 0.0;
      int64_t pick = V - 1;
      for (int64_t c = 0; c < V; ++c) {
        acc += l[c];
        if (u < acc) {
          pick = c;
          break;
        }
      }
      while (pick > 0 && l[pick] == 0.0) --pick;  // rounding at the top end never selects a zero-probability token
      rows[b].push_back(pick);
    }
  }
  std::vector<int64_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return from_vector<int64_t>(flat, {B, static_cast<int64_t>(rows[0].size())}, TensorOptions(DType::i64, device));
}

}  // namespace ember::nn
