// The GPT of nanoGPT (Karpathy's model.py): GPTConfig, CausalSelfAttention, MLP, Block and GPT with the same module
// and parameter names, init and weight tying, so state dicts map 1:1 onto nanoGPT checkpoints.
// Invariant: lm_head.weight and transformer.wte.weight are one tensor (Note [Tied lm_head]).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "ember/autograd/checkpoint_plan.h"
#include "ember/nn/layers.h"
#include "ember/nn/module.h"

namespace ember::nn {

// nanoGPT's GPTConfig names; the defaults are the character-level Shakespeare CPU config (vocab of 65 characters).
struct GPTConfig {
  int64_t vocab_size = 65;
  int64_t block_size = 64;  // the longest sequence the position embedding covers
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  double dropout = 0.0;
  bool bias = false;  // biases in Linear layers and LayerNorms
};

// Multi-head causal self-attention over x [B, T, C]: one c_attn projection to q, k, v, scaled dot-product attention
// with the causal mask (dropout on the weights while training), heads merged back and projected by c_proj.
class CausalSelfAttention : public Module {
 public:
  explicit CausalSelfAttention(const GPTConfig& config);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<Linear> c_attn;  // [3 C, C]: q, k, v stacked along the output dim
  std::shared_ptr<Linear> c_proj;
  std::shared_ptr<Dropout> attn_dropout, resid_dropout;
  int64_t n_head, n_embd;
  double dropout;
};

// c_fc (C -> 4 C), exact GELU, c_proj (4 C -> C), dropout.
class MLP : public Module {
 public:
  explicit MLP(const GPTConfig& config);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<Linear> c_fc;
  std::shared_ptr<GELU> gelu;
  std::shared_ptr<Linear> c_proj;
  std::shared_ptr<Dropout> dropout;
};

// Pre-norm residual block: x + attn(ln_1(x)), then x + mlp(ln_2(x)).
class Block : public Module {
 public:
  explicit Block(const GPTConfig& config);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<LayerNorm> ln_1;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<LayerNorm> ln_2;
  std::shared_ptr<MLP> mlp;
};

// Note [Tied lm_head]
// nanoGPT ties the output projection to the token embedding (`transformer.wte.weight = lm_head.weight`). Here the
// lm_head module registers the embedding's own tensor as its "weight": one TensorImpl under two names. As in
// PyTorch, named_parameters()/parameters() list it once (Module dedups by TensorImpl, so optimizers update it once
// and counts include it once), while state_dict() holds both "transformer.wte.weight" and "lm_head.weight" — exactly
// nanoGPT's state_dict keys, so its checkpoints load 1:1 (a safetensors file written from state_dict stores the
// embedding twice; loading writes both entries into the one tensor).
class TiedLinear : public Module {
 public:
  // y = x @ weight^T, no bias; weight [out, in] is registered as given (shared with its owner).
  explicit TiedLinear(const Tensor& weight);
  Tensor forward(const Tensor& x) override;

  Tensor weight;

 protected:
  std::string extra_repr() const override;
};

// The container nanoGPT calls `transformer` (an nn.ModuleDict): wte, wpe, drop, h (the blocks), ln_f.
class GPTTransformer : public Module {
 public:
  explicit GPTTransformer(const GPTConfig& config);

  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<ModuleList> h;
  std::shared_ptr<LayerNorm> ln_f;
};

struct GPTOutput {
  Tensor logits;  // [B, T, vocab_size]
  Tensor loss;    // 0-d mean cross-entropy over targets != -1 (nanoGPT's ignore_index); undefined without targets
};

class GPT : public Module {
 public:
  // Builds the model and initialises it as nanoGPT: N(0, 0.02) for Linear and Embedding weights, zero biases,
  // N(0, 0.02 / sqrt(2 n_layer)) for every c_proj.weight, LayerNorms weight 1 / bias 0. Draws from the default
  // generator: manual_seed(s) first makes the model reproducible.
  explicit GPT(const GPTConfig& config = {});

  // idx: i64 token ids [B, T] with T <= block_size (ValueError otherwise) → logits [B, T, vocab_size].
  Tensor forward(const Tensor& idx) override;
  // As forward, plus the loss against targets [B, T] (entries -1 ignored) when targets is defined.
  GPTOutput forward(const Tensor& idx, const Tensor& targets);

  // nanoGPT's get_num_params: parameter count, without the position embedding when non_embedding (the token
  // embedding counts: it is also the lm_head). Module::num_parameters() counts everything.
  int64_t get_num_params(bool non_embedding = true) const;

  // Samples max_new_tokens tokens after idx [B, T] autoregressively (nanoGPT's generate): the context is cropped to
  // the last block_size tokens, the last position's logits are divided by temperature, optionally restricted to
  // the top_k most likely tokens, and a token is drawn from their softmax. Runs without recording and in eval mode
  // (no dropout; every module's mode is given back after), and the draws come from a generator seeded with `seed`:
  // the same seed gives the same text, and the default generator does not move. idx needs T >= 1 (ShapeError).
  // Returns [B, T + max_new_tokens] on idx's device.
  Tensor generate(const Tensor& idx, int64_t max_new_tokens, double temperature = 1.0,
                  std::optional<int64_t> top_k = std::nullopt, uint64_t seed = 1337);

  // Activation checkpointing (autograd/checkpoint_plan.h): with a plan installed, forward runs the blocks
  // (transformer->h) as a chain under it — each recomputed segment one checkpointed region. set_checkpoint_plan raises
  // ValueError unless the plan covers exactly n_layer blocks; an empty plan (no segments) uninstalls.
  void set_checkpoint_plan(autograd::CheckpointPlan plan);
  const autograd::CheckpointPlan& checkpoint_plan() const { return checkpoint_plan_; }
  // Profiles the blocks once on the embeddings of idx (a recorded forward; the default generator's state is left as
  // it was), plans for `policy`, installs the plan and returns it.
  autograd::CheckpointPlan plan_checkpointing(const Tensor& idx, const autograd::CheckpointPolicy& policy);

  GPTConfig config;
  std::shared_ptr<GPTTransformer> transformer;
  std::shared_ptr<TiedLinear> lm_head;

 private:
  void init_weights();
  Tensor embed(const Tensor& idx);                 // drop(wte(idx) + wpe(positions)), checking idx
  std::vector<autograd::TensorFn> block_chain();  // the blocks as a chain of functions (holding the modules)
  autograd::CheckpointPlan checkpoint_plan_;      // no segments: none installed
};

}  // namespace ember::nn
