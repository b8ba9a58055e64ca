// TrainRunner (train/runner.h): options refused before anything is allocated, the report against the allocator's own
// statistics, progress records by hand, accumulation against one big step, and checkpoints — the file's contents by
// name, a resumed run continuing the step counter from bitwise the saved weights and optimizer state.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ember/memory/cpu_allocator.h"
#include "ember/nn/safetensors.h"
#include "ember/train/progress.h"
#include "ember/train/runner.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test (removed at the end).
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("ember_runner_" + std::to_string(getpid()) + "_" + std::string(info ? info->name() : "x"));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// The bytes of every tensor of a named list, by name (bitwise comparison; f32 values compared as their bits).
std::map<std::string, std::vector<unsigned char>> bytes_of(const nn::NamedTensors& named) {
  std::map<std::string, std::vector<unsigned char>> out;
  for (const auto& [name, t] : named) {
    const Tensor c = t.to(Device::cpu()).contiguous();
    std::vector<unsigned char> b(static_cast<size_t>(c.nbytes()));
    if (!b.empty()) std::memcpy(b.data(), c.raw_data(), b.size());
    out[name] = std::move(b);
  }
  return out;
}

train::RunnerOptions tiny_gpt() {
  train::RunnerOptions o;
  o.model = "char-gpt";
  o.synthetic = true;
  o.n_layer = 1;
  o.n_head = 2;
  o.n_embd = 32;
  o.block_size = 16;
  o.batch_size = 4;
  o.eval_iters = 1;
  return o;
}

TEST(TrainRunner, RefusesBadOptionsBeforeAllocatingAnything) {
  const int64_t allocs_before = memory::cpu_allocator().stats().num_allocs;
  auto refuse = [](auto edit, const char* what) {
    train::RunnerOptions o;
    o.model = "mlp";
    edit(o);
    SCOPED_TRACE(what);
    try {
      train::TrainRunner runner(o);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
    }
  };
  refuse([](auto& o) { o.model = "resnet"; }, "unknown model");
  refuse([](auto& o) { o.amp = "fp8"; }, "unknown amp");
  refuse([](auto& o) { o.checkpoint = "half"; }, "bad policy");
  refuse([](auto& o) { o.model = "mnist-cnn"; o.checkpoint = "sqrt"; }, "no block chain");
  refuse([](auto& o) { o.epochs = 2; }, "epochs on a step-counted model");
  refuse([](auto& o) { o.batch_size = 10; o.grad_accum = 3; }, "indivisible accumulation");
  refuse([](auto& o) { o.grad_accum = 0; }, "no micro-batch");
  refuse([](auto& o) { o.resume_path = "/no/such/checkpoint.safetensors"; }, "missing resume file");
  refuse([](auto& o) { o.data = "/no/such/data"; }, "missing data");
  refuse([](auto& o) { o.save_path = "/no/such/dir/x.safetensors"; }, "unwritable save path");
  refuse([](auto& o) { o.n_layer = 2; }, "a char-gpt flag on mlp");
  refuse([](auto& o) { o.auto_batch = true; }, "auto without a memory limit on cpu");
  train::RunnerOptions fp8;
  fp8.amp = "fp8";
  EXPECT_THROW(train::TrainRunner{fp8}, ConfigError);
  EXPECT_EQ(memory::cpu_allocator().stats().num_allocs, allocs_before) << "validation allocates nothing";
}

TEST(TrainRunner, ReportMatchesTheRunAndTheAllocator) {
  train::RunnerOptions o;
  o.model = "mlp";
  o.steps = 3;
  o.batch_size = 16;
  std::vector<train::Progress> records;
  o.log_interval = 2;
  o.on_progress = [&](const train::Progress& p) { records.push_back(p); };
  train::TrainRunner runner(o);
  const train::RunResult r = runner.run();
  const memory::AllocatorStats s = memory::cpu_allocator().stats();

  // Records at steps 2 and 3 (the interval, then the last step).
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].step, 2);
  EXPECT_EQ(records[1].step, 3);
  EXPECT_EQ(records[1].total_steps, 3);
  EXPECT_EQ(records[1].epoch, 0) << "the standard tasks have no epochs";
  EXPECT_TRUE(std::isfinite(records[0].loss));

  const nlohmann::json j = nlohmann::json::parse(r.to_json());
  EXPECT_EQ(j["model"], "mlp");
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["amp"], "none");
  EXPECT_EQ(j["steps"], 3);
  EXPECT_EQ(j["start_step"], 0);
  EXPECT_EQ(j["batch_size"], 16);
  EXPECT_EQ(j["grad_accum"], 1);
  EXPECT_TRUE(j["test_accuracy"].is_null());
  EXPECT_TRUE(j["val_loss"].is_null());
  EXPECT_DOUBLE_EQ(j["final_loss"].get<double>(), r.final_loss);
  EXPECT_GT(j["samples_per_s"].get<double>(), 0.0);
  // The peaks are the allocator's (nothing allocated since), and hold at least the weights, their gradients and
  // AdamW's two moments: 4 x 4 bytes per parameter of the 784-1024-1024-10 MLP.
  EXPECT_EQ(j["peak_allocated_bytes"].get<int64_t>(), s.peak_allocated_bytes);
  EXPECT_EQ(j["peak_reserved_bytes"].get<int64_t>(), s.peak_reserved_bytes);
  const int64_t params = 784 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10;
  EXPECT_EQ(j["parameters"], params);
  EXPECT_GE(r.peak_allocated_bytes, 4 * 4 * params);
  EXPECT_EQ(runner.step(), 3);
  const std::string report = runner.memory_report();
  EXPECT_NE(report.find("peak allocated " + memory::format_bytes(s.peak_allocated_bytes)), std::string::npos)
      << report;
}

TEST(TrainRunner, LossFallsOnTheFixedBatch) {
  train::RunnerOptions o;
  o.model = "mlp";
  o.steps = 8;
  o.batch_size = 32;
  double first = 0;
  o.log_interval = 1;
  o.on_progress = [&](const train::Progress& p) {
    if (p.step == 1) first = p.loss;
  };
  const train::RunResult r = train::TrainRunner(o).run();
  EXPECT_LT(r.final_loss, first) << "AdamW steps on one fixed batch lower its loss";
}

// Two micro-batches of 16 rows give the step one batch of 32 gives (a sample-mean loss; the MLP has no BatchNorm).
TEST(TrainRunner, AccumulationMatchesOneBigStep) {
  auto weights_after = [](int64_t accum) {
    train::RunnerOptions o;
    o.model = "mlp";
    o.steps = 1;
    o.batch_size = 32;
    o.grad_accum = accum;
    train::TrainRunner runner(o);
    runner.run();
    return runner.model().state_dict();
  };
  const nn::NamedTensors one = weights_after(1), two = weights_after(2);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) {
    SCOPED_TRACE(one[i].first);
    EXPECT_TRUE(allclose(two[i].second, one[i].second, Tolerance{1e-4, 1e-5}));
  }
}

TEST(TrainRunner, MnistCnnEvaluatesAtTheEndOfItsEpoch) {
  train::RunnerOptions o;
  o.model = "mnist-cnn";
  o.synthetic = true;
  o.steps = 3;
  o.batch_size = 8;  // a generated set of 3 x 8 images: one epoch of three steps
  o.max_test = 32;
  o.workers = 0;
  std::vector<std::string> messages;
  o.on_message = [&](const std::string& m) { messages.push_back(m); };
  std::vector<train::Progress> records;
  o.on_progress = [&](const train::Progress& p) { records.push_back(p); };
  const train::RunResult r = train::TrainRunner(o).run();
  ASSERT_TRUE(r.test_accuracy.has_value());
  EXPECT_GE(*r.test_accuracy, 0.0);
  EXPECT_LE(*r.test_accuracy, 1.0);
  EXPECT_EQ(r.epochs, 1);
  int evaluations = 0;
  for (const std::string& m : messages) evaluations += m.find("test accuracy") != std::string::npos;
  EXPECT_EQ(evaluations, 1) << "the epoch's end is the run's end: one evaluation";
  ASSERT_FALSE(records.empty());
  EXPECT_EQ(records.back().epoch, 1);
  EXPECT_EQ(r.data.rfind("generated digits (24 train, 32 test images)", 0), 0u) << r.data;
}

TEST(TrainRunner, CheckpointHoldsWeightsOptimizerScheduleAndMetadata) {
  TempDir dir;
  train::RunnerOptions o = tiny_gpt();
  o.steps = 2;
  o.save_path = dir.file("a.safetensors");
  train::TrainRunner runner(o);
  runner.run();
  const nn::SafetensorsMetadata meta = nn::read_safetensors_metadata(o.save_path);
  EXPECT_EQ(meta.at("model"), "char-gpt");
  EXPECT_EQ(meta.at("step"), "2");
  EXPECT_EQ(meta.at("amp"), "none");
  EXPECT_EQ(meta.at("n_layer"), "1");
  EXPECT_EQ(meta.at("n_embd"), "32");
  EXPECT_EQ(meta.at("block_size"), "16");
  const nn::NamedTensors saved = nn::load_safetensors(o.save_path);
  std::set<std::string> names;
  for (const auto& [name, t] : saved) names.insert(name);
  for (const char* name : {"lm_head.weight", "transformer.wte.weight", "transformer.h.0.attn.c_attn.weight",
                           "optim.state.0.exp_avg", "optim.state.0.exp_avg_sq", "optim.param_groups.0.lr",
                           "sched.last_epoch"})
    EXPECT_TRUE(names.count(name)) << name;
  // The weights in the file are the model's, bit for bit.
  const auto model_bytes = bytes_of(runner.model().state_dict());
  const auto file_bytes = bytes_of(saved);
  for (const auto& [name, bytes] : model_bytes) EXPECT_EQ(file_bytes.at(name), bytes) << name;
}

TEST(TrainRunner, ResumeContinuesTheStepCounterFromTheSavedState) {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  train::RunnerOptions a = tiny_gpt();
  a.steps = 2;
  a.save_path = path;
  train::TrainRunner first(a);
  first.run();
  const auto weights = bytes_of(first.model().state_dict());
  const auto optimizer = bytes_of(first.trainer().state_dict());

  train::RunnerOptions b = tiny_gpt();
  b.n_layer = b.n_head = b.n_embd = b.block_size = 0;  // taken from the checkpoint
  b.steps = 4;
  b.resume_path = path;
  std::vector<int64_t> steps_seen;
  b.on_progress = [&](const train::Progress& p) { steps_seen.push_back(p.step); };
  b.log_interval = 1;
  train::TrainRunner second(b);
  second.setup();
  EXPECT_EQ(second.step(), 2);
  EXPECT_EQ(bytes_of(second.model().state_dict()), weights) << "the weights load exactly";
  EXPECT_EQ(bytes_of(second.trainer().state_dict()), optimizer) << "and the optimizer state";
  const train::RunResult r = second.run();
  EXPECT_EQ(r.start_step, 2);
  EXPECT_EQ(r.steps, 4);
  EXPECT_EQ(steps_seen, (std::vector<int64_t>{3, 4})) << "two more steps, numbered on from the saved one";
  EXPECT_NE(bytes_of(second.model().state_dict()), weights) << "and they train";

  // A resume that asks for another shape, or another model, is refused.
  train::RunnerOptions c = tiny_gpt();
  c.n_layer = 2;
  c.resume_path = path;
  EXPECT_THROW(train::TrainRunner(c).setup(), ValueError);
  train::RunnerOptions d;
  d.model = "mlp";
  d.resume_path = path;
  EXPECT_THROW(train::TrainRunner{d}, ValueError);
  train::RunnerOptions e = tiny_gpt();
  e.amp = "bf16";
  e.resume_path = path;
  EXPECT_THROW(train::TrainRunner{e}, ValueError);
}

TEST(TrainRunner, ResumeOfACorruptFileIsAFormatError) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  std::ofstream(path) << "not a checkpoint";
  train::RunnerOptions o;
  o.model = "mlp";
  o.resume_path = path;
  EXPECT_THROW(train::TrainRunner{o}, FormatError);
}

TEST(TrainRunner, ATraceOfTheFirstStepsIsWritten) {
  TempDir dir;
  train::RunnerOptions o;
  o.model = "mlp";
  o.steps = 3;
  o.batch_size = 8;
  o.trace_steps = 1;
  o.trace_path = dir.file("t.jsonl");
  o.html_path = dir.file("t.html");
  train::TrainRunner(o).run();
  std::ifstream jsonl(o.trace_path);
  std::string line;
  int64_t lines = 0, allocs = 0;
  while (std::getline(jsonl, line)) {
    ++lines;
    allocs += nlohmann::json::parse(line).value("action", "") == "alloc";
  }
  EXPECT_GT(allocs, 4) << "the weights, at least";
  std::ifstream html(o.html_path);
  const std::string page((std::istreambuf_iterator<char>(html)), std::istreambuf_iterator<char>());
  EXPECT_NE(page.find("<svg"), std::string::npos);
  EXPECT_FALSE(memory::cpu_allocator().trace().size()) << "the trace is off after --trace-steps";
}

TEST(Progress, FormatsByHand) {
  train::Progress p;
  p.step = 5;
  p.total_steps = 20;
  p.epoch = 2;
  p.loss = 0.5;
  p.samples_per_s = 100.0;
  p.allocated_bytes = 3 * 1024 * 1024;
  p.reserved_bytes = 4 * 1024 * 1024;
  EXPECT_EQ(train::format_progress(p),
            "step 5/20  epoch 2  loss 0.5000  100.0 samples/s  allocated 3.00 MiB  reserved 4.00 MiB");
  EXPECT_EQ(train::format_progress(p, 8).substr(0, 11), "[##------] ");
}

}  // namespace
}  // namespace ember::testing
