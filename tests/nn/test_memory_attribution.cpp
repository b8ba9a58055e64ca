// Memory attribution through the model stack: module memory paths (root type name + dotted child names, first parent
// wins, recomputed after the tree changes), and one training step (forward, backward, AdamW) of a tiny GPT and of
// MnistNet on CPU whose per-owner bytes sum exactly to the allocator's statistics, with forward / backward /
// workspace owners per module and "/optimizer" holding exactly the AdamW state; recomputation under checkpointing is
// owned by the backward phase; the report's text and JSON carry the same totals.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ember/ember.h"
#include "ember/memory/memory_report.h"

namespace ember::nn {
namespace {

namespace F = ember::nn::functional;
using memory::MemoryAttribution;
using memory::TagBytes;

int64_t round_block(int64_t n) { return (n + memory::kMinBlockSize - 1) / memory::kMinBlockSize * memory::kMinBlockSize; }

// The owner (module, phase) of `at`, or an all-zero one.
TagBytes owner(const MemoryAttribution& at, const std::string& module, const std::string& phase) {
  for (const TagBytes& o : at.owners)
    if (o.module == module && o.phase == phase) return o;
  TagBytes none;
  none.module = module;
  none.phase = phase;
  return none;
}

// Every owner's bytes sum to the allocator's statistics, now and at the peak.
void expect_exact_totals(const MemoryAttribution& at) {
  const memory::AllocatorStats s = memory::cpu_allocator().stats();
  EXPECT_EQ(at.current_bytes, s.allocated_bytes);
  EXPECT_EQ(at.peak_bytes, s.peak_allocated_bytes);
  int64_t current = 0, at_peak = 0;
  for (const TagBytes& o : at.owners) {
    current += o.current_bytes;
    at_peak += o.at_peak_bytes;
  }
  EXPECT_EQ(current, s.allocated_bytes);
  EXPECT_EQ(at_peak, s.peak_allocated_bytes);
  memory::cpu_allocator().check_invariants();
}

// What AdamW keeps per parameter after its first step: exp_avg and exp_avg_sq like the parameter (f32 here), and
// the 0-d f64 step count on the host — each its own block.
int64_t adamw_state_bytes(const Module& m) {
  int64_t n = 0;
  for (const Tensor& p : m.parameters()) n += 2 * round_block(p.nbytes()) + round_block(8);
  return n;
}

TEST(MemoryPath, RootTypeNameThenDottedChildNames) {
  MnistNet net;
  EXPECT_EQ(net.memory_path(), "MnistNet");
  EXPECT_EQ(net.conv1->memory_path(), "MnistNet.conv1");
  EXPECT_EQ(net.fc2->memory_path(), "MnistNet.fc2");

  GPTConfig c;
  c.vocab_size = 11, c.block_size = 8, c.n_layer = 2, c.n_head = 2, c.n_embd = 16;
  GPT gpt(c);
  auto block = gpt.transformer->h->at<Block>(1);
  EXPECT_EQ(block->attn->c_attn->memory_path(), "GPT.transformer.h.1.attn.c_attn");
  EXPECT_EQ(gpt.lm_head->memory_path(), "GPT.lm_head");
}

TEST(MemoryPath, FollowsTheTreeAsItIsBuiltFirstParentWins) {
  auto lin = std::make_shared<Linear>(2, 2);
  EXPECT_EQ(lin->memory_path(), "Linear");  // cached, then recomputed after registration
  auto inner = std::make_shared<Sequential>();
  inner->push_back("proj", lin);
  EXPECT_EQ(lin->memory_path(), "Sequential.proj");
  auto outer = std::make_shared<Sequential>();
  outer->push_back("body", inner);
  EXPECT_EQ(lin->memory_path(), "Sequential.body.proj");
  auto other = std::make_shared<Sequential>();
  other->push_back("again", lin);  // a second parent does not rename it
  EXPECT_EQ(lin->memory_path(), "Sequential.body.proj");
  EXPECT_EQ(memory::module_path(lin->memory_handle()), "Sequential.body.proj");
  outer.reset();  // the parent goes away: inner becomes a root
  EXPECT_EQ(lin->memory_path(), "Sequential.proj");
}

TEST(MemoryAttribution, GPTTrainingStepSumsExactly) {
  memory::cpu_allocator().reset_peak_stats();  // per-owner peaks from earlier tests in this process do not count
  GPTConfig c;
  c.vocab_size = 11, c.block_size = 8, c.n_layer = 2, c.n_head = 2, c.n_embd = 16;
  manual_seed(3);
  auto gpt = std::make_shared<GPT>(c);
  optim::AdamW opt(gpt->parameters(), {});
  const int64_t optimizer_before = owner(memory::memory_attribution(memory::cpu_allocator()), "", "optimizer")
                                       .current_bytes;
  const Tensor idx = from_vector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1}, {2, 6});
  const Tensor targets = from_vector<int64_t>({2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1, 2}, {2, 6});
  {
    GPTOutput out = gpt->forward(idx, targets);
    const MemoryAttribution mid = memory::memory_attribution(memory::cpu_allocator());
    expect_exact_totals(mid);
    EXPECT_GT(owner(mid, "GPT.transformer.h.0.attn", "forward").current_bytes, 0);  // saved activations
    EXPECT_GT(owner(mid, "GPT.transformer.h.0.attn.c_attn", "forward").current_bytes, 0);
    out.loss.backward();
  }
  opt.step();
  const MemoryAttribution at = memory::memory_attribution(memory::cpu_allocator());
  expect_exact_totals(at);
  EXPECT_GT(owner(at, "GPT.transformer.h.0.attn.c_attn", "forward").peak_bytes, 0);
  EXPECT_GT(owner(at, "GPT.transformer.h.0.attn", "backward").peak_bytes, 0);
  // c_attn's weight gradient (held until zero_grad) belongs to the module that used the weight.
  EXPECT_EQ(owner(at, "GPT.transformer.h.0.attn.c_attn", "backward").current_bytes,
            round_block(gpt->transformer->h->at<Block>(0)->attn->c_attn->weight.nbytes()));
  EXPECT_EQ(owner(at, "", "optimizer").current_bytes - optimizer_before, adamw_state_bytes(*gpt));
  opt.zero_grad();
  const MemoryAttribution after = memory::memory_attribution(memory::cpu_allocator());
  EXPECT_EQ(owner(after, "GPT.transformer.h.0.attn.c_attn", "backward").current_bytes, 0);
  expect_exact_totals(after);
}

TEST(MemoryAttribution, MnistNetTrainingStepSumsExactly) {
  memory::cpu_allocator().reset_peak_stats();
  manual_seed(5);
  auto net = std::make_shared<MnistNet>();
  optim::AdamW opt(net->parameters(), {});
  const int64_t optimizer_before = owner(memory::memory_attribution(memory::cpu_allocator()), "", "optimizer")
                                       .current_bytes;
  const Tensor x = randn({2, 1, 28, 28});
  const Tensor y = from_vector<int64_t>({3, 7}, {2});
  {
    Tensor loss = F::cross_entropy(net->forward(x), y);
    loss.backward();
  }
  opt.step();
  const MemoryAttribution at = memory::memory_attribution(memory::cpu_allocator());
  expect_exact_totals(at);
  EXPECT_GT(owner(at, "MnistNet.conv1", "forward").peak_bytes, 0);
  EXPECT_GT(owner(at, "MnistNet.conv1", "workspace").peak_bytes, 0);  // im2col columns
  EXPECT_GT(owner(at, "MnistNet.conv2", "backward").current_bytes, 0);
  EXPECT_EQ(owner(at, "MnistNet.fc1", "backward").current_bytes,
            round_block(net->fc1->weight.nbytes()) + round_block(net->fc1->bias.nbytes()));
  EXPECT_EQ(owner(at, "", "optimizer").current_bytes - optimizer_before, adamw_state_bytes(*net));
  // Parameters belong to their module once it has run (Note [Parameter ownership]).
  EXPECT_EQ(owner(at, "MnistNet.conv1", "parameters").current_bytes,
            round_block(net->conv1->weight.nbytes()) + round_block(net->conv1->bias.nbytes()));
  EXPECT_EQ(owner(at, "MnistNet.fc2", "parameters").current_bytes,
            round_block(net->fc2->weight.nbytes()) + round_block(net->fc2->bias.nbytes()));

  const std::string text = memory::memory_report(memory::cpu_allocator());
  for (const char* row : {"MnistNet", "conv1", "conv2", "fc1", "fc2", "TOTAL", "allocated now", "at peak"})
    EXPECT_NE(text.find(row), std::string::npos) << row << "\n" << text;
  const memory::AllocatorStats s = memory::cpu_allocator().stats();
  const std::string total_now = memory::format_bytes(s.allocated_bytes);
  const std::string total_peak = memory::format_bytes(s.peak_allocated_bytes);
  auto total_line_has = [&](size_t from, const std::string& v) {
    const size_t t = text.find("TOTAL", from);
    if (t == std::string::npos) return std::string::npos;
    const size_t eol = text.find('\n', t);
    const std::string line = text.substr(t, eol - t);
    return line.size() >= v.size() && line.compare(line.size() - v.size(), v.size(), v) == 0 ? eol
                                                                                            : std::string::npos;
  };
  const size_t first = total_line_has(0, total_now);  // the "allocated now" block's TOTAL ends with the stats
  ASSERT_NE(first, std::string::npos) << text;
  EXPECT_NE(total_line_has(first, total_peak), std::string::npos) << text;

  const nlohmann::json j = nlohmann::json::parse(at.to_json());
  EXPECT_EQ(j["allocator"], "cpu");
  EXPECT_EQ(j["current_bytes"].get<int64_t>(), at.current_bytes);
  EXPECT_EQ(j["peak_bytes"].get<int64_t>(), at.peak_bytes);
  int64_t current = 0, at_peak = 0;
  for (const auto& o : j["owners"]) {
    current += o["current_bytes"].get<int64_t>();
    at_peak += o["at_peak_bytes"].get<int64_t>();
    EXPECT_TRUE(o.contains("module") && o.contains("phase") && o.contains("peak_bytes") && o.contains("num_allocs"));
  }
  EXPECT_EQ(current, at.current_bytes);
  EXPECT_EQ(at_peak, at.peak_bytes);
  EXPECT_EQ(at.to_json().find('\n'), std::string::npos);
}

// A dry run on meta (the estimator's): parameters have addresses in the scope's allocator and are handed to their
// module like real ones.
TEST(MemoryAttribution, MetaParametersBelongToTheirModule) {
  MetaAllocationScope scope;
  auto lin = std::make_shared<Linear>(16, 8);
  lin->to(Device::meta());
  const Tensor y = lin->forward(empty({4, 16}, {DType::f32, Device::meta()}));
  const MemoryAttribution at = memory::memory_attribution(*current_meta_allocator());
  EXPECT_EQ(owner(at, "Linear", "parameters").current_bytes, round_block(16 * 8 * 4) + round_block(8 * 4));
  EXPECT_EQ(owner(at, "Linear", "forward").current_bytes, round_block(4 * 8 * 4));
}

TEST(MemoryAttribution, CheckpointRecomputationIsOwnedByBackward) {
  manual_seed(7);
  auto body = std::make_shared<Sequential>(std::make_shared<Linear>(8, 16), std::make_shared<ReLU>(),
                                           std::make_shared<Linear>(16, 8));
  auto wrapped = std::make_shared<CheckpointWrapper>(body);
  const Tensor x = randn({4, 8}).requires_grad_(true);
  Tensor loss = sum(wrapped->forward(x));
  const MemoryAttribution before = memory::memory_attribution(memory::cpu_allocator());
  const int64_t relu_forward = owner(before, "CheckpointWrapper.module.1", "forward").num_allocs;
  const int64_t relu_backward = owner(before, "CheckpointWrapper.module.1", "backward").num_allocs;
  EXPECT_GT(relu_forward, 0);
  loss.backward();
  const MemoryAttribution after = memory::memory_attribution(memory::cpu_allocator());
  EXPECT_EQ(owner(after, "CheckpointWrapper.module.1", "forward").num_allocs, relu_forward);  // none during backward
  EXPECT_GT(owner(after, "CheckpointWrapper.module.1", "backward").num_allocs, relu_backward);  // the recomputation
  expect_exact_totals(after);
}

}  // namespace
}  // namespace ember::nn
