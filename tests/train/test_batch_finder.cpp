// Batch-size finder and training snapshots on simulated devices (the CPU allocator rebuilt with a capacity; this file
// runs in test_train_device, a process of its own): on a 512 MiB device the found batch's step fits and one more row
// does not, and model, optimizer and generator state afterwards equal the state before bit for bit; the search without
// an estimator (doubling, then bisection); estimates too low and too high gallop to the same answer; a budget below
// the device's capacity; snapshots of a mixed-precision optimizer and of a GradScaler restore every byte.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "ember/ember.h"
#include "ember/memory/cpu_allocator.h"
#include "ember/nn/functional.h"
#include "ember/nn/layers.h"
#include "ember/nn/models.h"
#include "ember/optim/adam.h"
#include "ember/train/batch_finder.h"
#include "tests/harness/op_harness.h"
#include "tests/train/simulated_device.h"

namespace ember::testing {
namespace {

namespace F = nn::functional;
using memory::kMiB;
using train::AmpMode;
using train::AmpTrainer;

class BatchFinder : public ::testing::Test {
 protected:
  void TearDown() override { use_device(memory::kNoLimit); }
};

optim::OptimizerFactory adamw() {
  return [](std::vector<optim::ParamGroup> g) {
    return std::make_unique<optim::AdamW>(std::move(g), optim::AdamWOptions{.lr = 1e-2});
  };
}

std::vector<unsigned char> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<unsigned char> out(static_cast<size_t>(c.nbytes()));
  if (!out.empty()) std::memcpy(out.data(), c.raw_data(), out.size());
  return out;
}

// Every byte of a list of named tensors, keyed by name.
std::vector<std::pair<std::string, std::vector<unsigned char>>> bytes_of(
    const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::pair<std::string, std::vector<unsigned char>>> out;
  for (const auto& [name, t] : named) out.emplace_back(name, bytes_of(t));
  return out;
}

// A model whose step needs about 0.75 MiB per row while computing little: the rows (65536 features, 256 KiB in f32)
// times a learned scalar, summed in 4 groups, then a 4x4 linear head.
constexpr int64_t kFeatures = 65536, kClasses = 4;
class Wide : public nn::Module {
 public:
  Wide() : Module("Wide") {
    scale = register_parameter("scale", uniform({1}, 0.5, 1.5));
    head = register_parameter("head", uniform({kClasses, kClasses}, -0.5, 0.5));
  }
  Tensor forward(const Tensor& x) override {
    return linear(sum((x * scale).view({x.size(0), kClasses, kFeatures / kClasses}), {2}), head);
  }
  Tensor scale, head;
};

// One real AdamW step at batch b. It draws from ember's generator (as dropout would), so the snapshot must restore it.
void wide_step(Wide& model, AmpTrainer& trainer, int64_t b) {
  const Tensor x = ones({b, kFeatures});
  const Tensor y = (rand({b}) * 3.999).to(DType::i64);
  Tensor loss = F::cross_entropy(model.forward(x), y);
  trainer.backward(loss);
  trainer.step();
  trainer.zero_grad();
}

TEST_F(BatchFinder, FindsTheLargestBatchOnA512MiBDeviceAndRestoresTheState) {
  use_device(512 * kMiB);
  memory::CachingAllocator& alloc = memory::cpu_allocator();
  manual_seed(3);
  Wide model;
  AmpTrainer trainer(model, {optim::ParamGroup{model.parameters()}}, adamw(), AmpMode::none);
  wide_step(model, trainer, 4);  // the optimizer has state: the finder must put it back as it was

  const auto model_before = bytes_of(model.state_dict());
  const auto optimizer_before = bytes_of(trainer.optimizer().state_dict());
  const PhiloxState generator_before = default_generator().state();
  train::TrainingSnapshot snapshot(model, trainer);
  EXPECT_GT(snapshot.host_bytes(), 3 * model.parameter_bytes()) << "weights and two Adam moments";
  auto trial = [&](int64_t b) { wide_step(model, trainer, b); };
  auto restore = [&] { snapshot.restore(); };

  // An estimator calibrated on two small real steps (a straight line through their peaks): close, not exact.
  auto measured_peak = [&](int64_t b) {
    alloc.empty_cache();
    alloc.reset_peak_stats();
    trial(b);
    restore();
    return alloc.stats().peak_reserved_bytes;
  };
  const int64_t p16 = measured_peak(16), p64 = measured_peak(64);
  const double per_row = static_cast<double>(p64 - p16) / 48.0;
  train::BatchFinderOptions o;
  o.estimate = [&](int64_t b) { return p16 + static_cast<int64_t>(per_row * static_cast<double>(b - 16)); };
  o.restore = restore;
  o.effective_batch = 1000;
  const train::BatchFinderResult r = train::find_batch_size(trial, o);
  std::cout << r.to_string() << "\n";

  EXPECT_EQ(r.budget, 512 * kMiB) << "no budget given: the device's capacity";
  ASSERT_GT(r.batch, 64);
  EXPECT_GT(r.estimated_batch, 0);
  EXPECT_LE(r.trials.size(), 12u) << "the estimate puts the first trial near the answer";
  EXPECT_EQ(r.accumulation, (1000 + r.batch - 1) / r.batch);
  EXPECT_LE(r.micro_batch, r.batch);
  EXPECT_GE(r.micro_batch * r.accumulation, 1000);
  EXPECT_LT((r.micro_batch - 1) * r.accumulation, 1000) << "balanced micro-batches";
  bool saw_ok = false, saw_oom = false;
  for (const train::BatchTrial& t : r.trials) {
    saw_ok = saw_ok || (t.ok && t.batch == r.batch);
    saw_oom = saw_oom || (!t.ok && t.batch == r.batch + 1);
    if (t.ok) EXPECT_LE(t.peak_reserved, 512 * kMiB);
  }
  EXPECT_TRUE(saw_ok && saw_oom) << "the search ends on a bracket [B fits, B + 1 does not]";

  // State afterwards: bit for bit what it was.
  EXPECT_EQ(bytes_of(model.state_dict()), model_before);
  EXPECT_EQ(bytes_of(trainer.optimizer().state_dict()), optimizer_before);
  EXPECT_EQ(default_generator().state().offset, generator_before.offset);
  for (const Tensor& p : model.parameters()) EXPECT_FALSE(p.grad().defined());

  // And checked directly: a step at B fits, a step at B + 1 does not.
  alloc.empty_cache();
  EXPECT_NO_THROW(trial(r.batch));
  restore();
  alloc.empty_cache();
  EXPECT_THROW(trial(r.batch + 1), OutOfMemoryError);
  restore();
  EXPECT_NO_THROW(alloc.check_invariants());
}

// A 64-256-10 MLP step with AdamW: cheap, so the estimator-free search (more trials) stays fast.
struct MlpSetup {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<AmpTrainer> trainer;
  std::unique_ptr<train::TrainingSnapshot> snapshot;
  MlpSetup() {
    manual_seed(4);
    model = nn::make_mlp({64, 256, 10});
    trainer = std::make_unique<AmpTrainer>(*model, std::vector<optim::ParamGroup>{{model->parameters()}}, adamw(),
                                           AmpMode::none);
    snapshot = std::make_unique<train::TrainingSnapshot>(*model, *trainer);
  }
  void step(int64_t b) {
    const Tensor x = randn({b, 64});
    const Tensor y = zeros({b}, TensorOptions(DType::i64));
    trainer->backward(F::cross_entropy(model->forward(x), y));
    trainer->step();
    trainer->zero_grad();
  }
};

TEST_F(BatchFinder, WithoutAnEstimatorDoublesThenBisects) {
  use_device(8 * kMiB);
  MlpSetup s;
  train::BatchFinderOptions o;
  o.restore = [&] { s.snapshot->restore(); };
  const train::BatchFinderResult r = train::find_batch_size([&](int64_t b) { s.step(b); }, o);
  std::cout << r.to_string() << "\n";
  ASSERT_GT(r.batch, 8);
  EXPECT_EQ(r.estimated_batch, 0);
  // 1, 2, 4, ... until the first OOM, then bisection inside [last success, first OOM].
  size_t i = 0;
  for (int64_t b = 1; i < r.trials.size() && r.trials[i].ok; b *= 2, ++i) EXPECT_EQ(r.trials[i].batch, b);
  ASSERT_LT(i, r.trials.size());
  const int64_t first_oom = r.trials[i].batch;
  EXPECT_EQ(first_oom, 2 * r.trials[i - 1].batch);
  for (++i; i < r.trials.size(); ++i) {
    EXPECT_GT(r.trials[i].batch, first_oom / 2);
    EXPECT_LT(r.trials[i].batch, first_oom);
  }
  EXPECT_EQ(r.accumulation, 1);
  EXPECT_EQ(r.micro_batch, r.batch);
  memory::cpu_allocator().empty_cache();
  EXPECT_NO_THROW(s.step(r.batch));
  s.snapshot->restore();
  memory::cpu_allocator().empty_cache();
  EXPECT_THROW(s.step(r.batch + 1), OutOfMemoryError);
  s.snapshot->restore();
}

// The trials after the first gallop away from it in steps of 1, 2, 4, ... until the outcome flips; the rest bisect the
// bracket that gallop found.
void expect_gallop_then_bisect(const train::BatchFinderResult& r) {
  ASSERT_GE(r.trials.size(), 2u);
  const bool first_ok = r.trials[0].ok;
  size_t i = 1;
  for (int64_t step = 1; i < r.trials.size(); ++i, step *= 2) {
    EXPECT_EQ(r.trials[i].batch, r.trials[i - 1].batch + (first_ok ? step : -step)) << "trial " << i;
    if (r.trials[i].ok != first_ok) break;
  }
  ASSERT_LT(i, r.trials.size()) << "the gallop found a bracket";
  const int64_t a = std::min(r.trials[i - 1].batch, r.trials[i].batch);
  const int64_t b = std::max(r.trials[i - 1].batch, r.trials[i].batch);
  for (++i; i < r.trials.size(); ++i) {
    EXPECT_GT(r.trials[i].batch, a);
    EXPECT_LT(r.trials[i].batch, b);
  }
}

TEST_F(BatchFinder, AnEstimateThatIsOffGallopsToTheSameAnswer) {
  use_device(8 * kMiB);
  MlpSetup s;
  train::BatchFinderOptions o;
  o.restore = [&] { s.snapshot->restore(); };
  auto trial = [&](int64_t b) { s.step(b); };
  const int64_t answer = train::find_batch_size(trial, o).batch;
  ASSERT_GT(answer, 300);
  for (int64_t pick : {answer - 100, answer + 150}) {
    SCOPED_TRACE(pick < answer ? "estimate too low" : "estimate too high");
    // Predicts the budget to be exactly full at `pick` rows.
    o.estimate = [pick](int64_t b) { return 8 * kMiB * b / pick; };
    const train::BatchFinderResult r = train::find_batch_size(trial, o);
    EXPECT_EQ(r.estimated_batch, pick);
    EXPECT_EQ(r.trials[0].batch, pick);
    EXPECT_EQ(r.trials[0].estimated, 8 * kMiB);
    expect_gallop_then_bisect(r);
    EXPECT_EQ(r.batch, answer) << "the trials, not the estimate, decide";
  }
}

TEST_F(BatchFinder, ABudgetBelowTheDeviceCapsTheTrials) {
  use_device(64 * kMiB);
  memory::CachingAllocator& alloc = memory::cpu_allocator();
  MlpSetup s;
  train::BatchFinderOptions o;
  o.restore = [&] { s.snapshot->restore(); };
  o.budget = 6 * kMiB;
  o.start_batch = 512;
  o.max_batch = 1 << 14;
  const train::BatchFinderResult capped = train::find_batch_size([&](int64_t b) { s.step(b); }, o);
  EXPECT_EQ(capped.budget, 6 * kMiB);
  EXPECT_EQ(alloc.allowed_memory(), 64 * kMiB) << "the device's capacity is back";
  ASSERT_GT(capped.batch, 0);
  for (const train::BatchTrial& t : capped.trials)
    if (t.ok) EXPECT_LE(t.peak_reserved, 6 * kMiB);
  o.budget = 0;
  const train::BatchFinderResult full = train::find_batch_size([&](int64_t b) { s.step(b); }, o);
  EXPECT_GT(full.batch, 2 * capped.batch);

  // No batch fits a budget below the weights and optimizer state.
  o.budget = 64 * 1024;
  o.start_batch = 0;
  const train::BatchFinderResult none = train::find_batch_size([&](int64_t b) { s.step(b); }, o);
  EXPECT_EQ(none.batch, 0);
  ASSERT_EQ(none.trials.size(), 1u);
  EXPECT_FALSE(none.trials[0].ok);
  o.restore = nullptr;
  EXPECT_THROW(train::find_batch_size([&](int64_t b) { s.step(b); }, o), ValueError);
}

// Note [Batch headroom]: with a headroom the trials run under budget x (1 - headroom), and the batch found is the one
// a budget of that size finds; the budget reported stays the whole one and the device's capacity comes back.
TEST_F(BatchFinder, AHeadroomLeavesThatShareOfTheBudgetUnused) {
  use_device(64 * kMiB);
  MlpSetup s;
  train::BatchFinderOptions o;
  o.restore = [&] { s.snapshot->restore(); };
  o.budget = 8 * kMiB;
  o.headroom = 0.25;
  const train::BatchFinderResult r = train::find_batch_size([&](int64_t b) {
    EXPECT_EQ(memory::cpu_allocator().allowed_memory(), 6 * kMiB) << "the trials run under the trial budget";
    s.step(b);
  }, o);
  EXPECT_EQ(r.budget, 8 * kMiB);
  EXPECT_EQ(r.trial_budget, 6 * kMiB);
  EXPECT_NE(r.to_string().find("trials within 6.00 MiB"), std::string::npos) << r.to_string();
  EXPECT_EQ(memory::cpu_allocator().allowed_memory(), 64 * kMiB);
  for (const train::BatchTrial& t : r.trials)
    if (t.ok) EXPECT_LE(t.peak_reserved, 6 * kMiB);
  o.budget = 6 * kMiB;
  o.headroom = 0.0;
  const train::BatchFinderResult same = train::find_batch_size([&](int64_t b) { s.step(b); }, o);
  EXPECT_EQ(same.trial_budget, same.budget);
  EXPECT_EQ(r.batch, same.batch);
  for (double bad : {-0.1, 0.6, std::nan("")}) {
    o.headroom = bad;
    EXPECT_THROW(train::find_batch_size([&](int64_t b) { s.step(b); }, o), ValueError) << bad;
  }
}

TEST_F(BatchFinder, SnapshotsRestoreMixedPrecisionAndScalerStateExactly) {
  use_device(64 * kMiB);
  const Tensor x = rand_input_seeded({16, 8}, 9).to(DType::f32);
  const Tensor y = rand_indices({16}, 3);
  {  // f16 weights, fp32 masters, a dynamic loss scale
    manual_seed(6);
    nn::Linear model(8, 3);
    model.to(DType::f16);
    optim::MixedPrecisionOptions mo;
    mo.scaler.growth_interval = 1;
    optim::MixedPrecisionOptimizer opt(model.parameters(), adamw(), mo);
    auto step = [&] {
      AutocastGuard region(DeviceType::CPU, DType::f16);
      Tensor loss = F::cross_entropy(model.forward(x), y);
      opt.backward(loss);
      opt.step();
      opt.zero_grad();
    };
    step();
    const auto before = bytes_of(opt.state_dict());
    const auto weights = bytes_of(model.state_dict());
    train::TrainingSnapshot snapshot(model, opt);
    step();
    step();
    ASSERT_NE(bytes_of(opt.state_dict()), before);
    snapshot.restore();
    EXPECT_EQ(bytes_of(opt.state_dict()), before) << "masters, moments, step counts, scale and growth tracker";
    EXPECT_EQ(bytes_of(model.state_dict()), weights);
  }
  {  // fp32 weights under a GradScaler; snapshot taken before the first step
    manual_seed(6);
    nn::Linear model(8, 3);
    optim::AdamW opt(model.parameters(), optim::AdamWOptions{.lr = 1e-2});
    optim::GradScaler scaler(optim::GradScalerOptions{.growth_interval = 1});
    const auto weights = bytes_of(model.state_dict());
    train::TrainingSnapshot snapshot(model, &opt, &scaler);
    scaler.scale(F::cross_entropy(model.forward(x), y)).backward();
    scaler.step(opt);
    scaler.update();
    scaler.scale(F::cross_entropy(model.forward(x), y)).backward();  // a gradient left behind
    snapshot.restore();
    EXPECT_EQ(bytes_of(model.state_dict()), weights);
    for (const Tensor& p : model.parameters()) {
      EXPECT_TRUE(opt.state(p).empty()) << "state made after the snapshot is gone";
      EXPECT_FALSE(p.grad().defined());
    }
    EXPECT_EQ(scaler.get_scale(), optim::GradScalerOptions{}.init_scale);
    EXPECT_EQ(scaler.growth_tracker(), 0);
  }
}

// An AmpTrainer's loss scaler is part of its snapshot: steps after the capture move the growth tracker (and, with a
// planted overflow, halve the scale); restore puts scale, tracker, weights and optimizer state back bitwise.
TEST(TrainingSnapshot, RestoresAnAmpTrainersLossScaler) {
  for (AmpMode mode : {AmpMode::fp16, AmpMode::autocast_fp16}) {
    SCOPED_TRACE(train::amp_mode_name(mode));
    manual_seed(9);
    auto model = nn::make_mlp({8, 16, 4});
    AmpTrainer trainer(*model, {optim::ParamGroup{model->parameters()}}, adamw(), mode);
    auto step = [&](bool overflow) {
      Tensor loss;
      {
        AutocastGuard region = trainer.autocast();
        loss = F::cross_entropy(model->forward(randn({6, 8})), zeros({6}, TensorOptions(DType::i64)));
      }
      trainer.backward(overflow ? loss * std::numeric_limits<double>::infinity() : loss);
      trainer.step();
      trainer.zero_grad();
    };
    step(false);
    optim::StateDict before = trainer.scaler_state_dict();
    for (auto& entry : before) entry.second = entry.second.clone();  // not aliases of the live scale
    ASSERT_FALSE(before.empty());
    const std::vector<double> weight = model->parameters()[0].to(DType::f64).to_vector<double>();
    const double scale = trainer.loss_scale();
    train::TrainingSnapshot snapshot(*model, trainer);
    step(false);
    step(true);  // skipped, scale halved
    ASSERT_EQ(trainer.loss_scale(), scale / 2);
    snapshot.restore();
    EXPECT_EQ(trainer.loss_scale(), scale);
    const optim::StateDict after = trainer.scaler_state_dict();
    ASSERT_EQ(after.size(), before.size());
    for (size_t k = 0; k < after.size(); ++k)
      EXPECT_EQ(after[k].second.to(DType::f64).to_vector<double>(), before[k].second.to(DType::f64).to_vector<double>())
          << after[k].first;
    EXPECT_EQ(model->parameters()[0].to(DType::f64).to_vector<double>(), weight);
  }
}

}  // namespace
}  // namespace ember::testing
