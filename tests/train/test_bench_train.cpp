// The standard training configurations and the step timer: model sizes by hand, shapes, a loss that falls, and the
// JSON line the `ember bench train` command prints.
#include <nlohmann/json.hpp>

#include "ember/train/bench_train.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

TEST(StandardTasks, ParameterCountsByHand) {
  // mlp 784-1024-1024-10: weights and biases of three Linear layers.
  EXPECT_EQ(train::make_standard_task("mlp", Device::cpu()).model->num_parameters(),
            784 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10);
  // cnn: conv1 32*1*9+32, conv2 64*32*9+64, fc1 9216*128+128, fc2 128*10+10.
  EXPECT_EQ(train::make_standard_task("cnn", Device::cpu()).model->num_parameters(),
            (32 * 9 + 32) + (64 * 32 * 9 + 64) + (9216 * 128 + 128) + (128 * 10 + 10));
  // gpt (bias-free): wte 65*128 (tied lm_head), wpe 64*128, per block ln 2*128 + attn 128*384 + 128*128
  // + mlp 128*512 + 512*128, final ln 128.
  const int64_t per_block = 2 * 128 + 128 * 384 + 128 * 128 + 128 * 512 + 512 * 128;
  EXPECT_EQ(train::make_standard_task("gpt", Device::cpu()).model->num_parameters(),
            65 * 128 + 64 * 128 + 4 * per_block + 128);
}

TEST(StandardTasks, BatchesAndLoss) {
  for (const char* name : {"mlp", "cnn", "gpt"}) {
    SCOPED_TRACE(name);
    train::StandardTask t = train::make_standard_task(name, Device::cpu(), 3);
    EXPECT_EQ(t.inputs.size(0), t.batch);
    EXPECT_EQ(t.targets.dtype(), DType::i64);
    const Tensor loss = t.loss();
    EXPECT_EQ(loss.numel(), 1);
    EXPECT_TRUE(loss.requires_grad());
    // Random labels: the initial cross-entropy is near log(classes).
    const double classes = std::string(name) == "gpt" ? 65.0 : 10.0;
    EXPECT_NEAR(loss.item_double(), std::log(classes), 0.5);
  }
}

TEST(StandardTasks, UnknownNameIsAValueError) {
  EXPECT_THROW(train::make_standard_task("resnet", Device::cpu()), ValueError);
}

TEST(BenchTrain, TrainsAndReportsJson) {
  train::BenchTrainOptions o;
  o.model = "mlp";
  o.steps = 4;
  o.warmup = 1;
  const train::BenchTrainResult r = train::bench_train(o);
  EXPECT_LT(r.last_loss, r.first_loss) << "AdamW steps on one fixed batch must lower its loss";
  EXPECT_GT(r.ms_per_step_median, 0.0);
  EXPECT_LE(r.ms_per_step_min, r.ms_per_step_median);
  EXPECT_LE(r.ms_per_step_median, r.ms_per_step_max);
  // Parameters, AdamW's two moments and the gradients are live at the peak: at least 4x the parameter bytes.
  EXPECT_GE(r.peak_allocated_bytes, 4 * 4 * r.parameters);
  EXPECT_GT(r.peak_rss_mib, 0.0);
  const nlohmann::json j = nlohmann::json::parse(r.to_json());
  for (const char* key : {"model", "device", "ms_per_step_median", "peak_rss_mib", "peak_allocated_bytes"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["model"], "mlp");
  EXPECT_EQ(j["steps"], 4);
}

TEST(BenchTrain, RejectsBadOptions) {
  train::BenchTrainOptions o;
  o.steps = 0;
  EXPECT_THROW(train::bench_train(o), ValueError);
}

}  // namespace
}  // namespace ember::testing
