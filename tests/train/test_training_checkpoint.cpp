// Training checkpoints: 20 steps straight equal 10 steps + save + load into fresh objects + 10 steps, bit for bit
// (weights, optimizer state, loss scaler, schedule, generator, loader position) for a model with dropout, AdamW under
// a warmup + cosine schedule, fp32 / fp16 loss-scaled / autocast-fp16 trainers and a shuffling 2-worker loader with a
// random transform — also at and across epoch boundaries; a crash between write and rename keeps the old checkpoint;
// malformed, truncated or mismatched files raise typed errors and change nothing.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ember/autograd/functions.h"
#include "ember/base/atomic_file.h"
#include "ember/data/dataloader.h"
#include "ember/data/random.h"
#include "ember/nn/functional.h"
#include "ember/nn/layers.h"
#include "ember/nn/safetensors.h"
#include "ember/optim/adam.h"
#include "ember/optim/lr_scheduler.h"
#include "ember/optim/sgd.h"
#include "ember/train/amp.h"
#include "ember/train/runner.h"
#include "ember/train/training_checkpoint.h"
#include "tests/harness/op_harness.h"

namespace ember::testing {
namespace {

namespace F = nn::functional;
namespace fs = std::filesystem;
using train::AmpMode;
using train::AmpTrainer;
using train::TrainingParts;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("ember_ckpt_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  // Files whose name starts with `prefix`.
  int64_t count(const std::string& prefix) const {
    int64_t n = 0;
    for (const auto& e : fs::directory_iterator(path_)) n += e.path().filename().string().rfind(prefix, 0) == 0;
    return n;
  }

 private:
  fs::path path_;
  static inline int counter_ = 0;
};

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

// Sample i: 4 features from a fixed formula plus noise from the sample's generator (a random transform), class i % 3.
class NoisyClasses final : public data::Dataset {
 public:
  int64_t size() const override { return 24; }
  data::Example get(int64_t index, Generator& rng) const override {
    std::vector<float> x(4);
    for (int64_t k = 0; k < 4; ++k)
      x[static_cast<size_t>(k)] = static_cast<float>(std::sin(0.7 * static_cast<double>(index * (k + 1))) +
                                                     0.3 * data::uniform(rng));
    return {from_vector<float>(x, {4}), scalar_tensor(index % 3, DType::i64)};
  }
};

optim::OptimizerFactory adamw(double lr) {
  return [lr](std::vector<optim::ParamGroup> g) {
    return std::make_unique<optim::AdamW>(std::move(g), optim::AdamWOptions{.lr = lr, .weight_decay = 0.01});
  };
}

// A model with dropout, its trainer, schedule and loader; `init_seed` keys the initial weights (and leaves the
// default generator there), so objects built with another seed start elsewhere in every respect.
struct Rig {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<AmpTrainer> trainer;
  std::unique_ptr<optim::CosineWarmupLR> sched;
  std::unique_ptr<data::DataLoader> loader;

  Rig(AmpMode mode, uint64_t init_seed, int64_t hidden = 16, int64_t batch = 4) {
    manual_seed(init_seed);
    model = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(4, hidden), std::make_shared<nn::ReLU>(),
                                             std::make_shared<nn::Dropout>(0.25),
                                             std::make_shared<nn::Linear>(hidden, 3));
    trainer = std::make_unique<AmpTrainer>(*model, std::vector<optim::ParamGroup>{{model->parameters()}}, adamw(2e-2),
                                           mode);
    sched = std::make_unique<optim::CosineWarmupLR>(trainer->optimizer(), 3, 20, 1e-4);
    data::DataLoaderOptions o;
    o.batch_size = batch;  // 6 batches per epoch
    o.shuffle = true;
    o.seed = 11;
    o.num_workers = 2;
    loader = std::make_unique<data::DataLoader>(std::make_shared<NoisyClasses>(), o);
  }

  TrainingParts parts() {
    TrainingParts p;
    p.model = model.get();
    p.trainer = trainer.get();
    p.scheduler = sched.get();
    p.loader = loader.get();
    return p;
  }

  void step() {
    std::optional<data::Batch> b = loader->next();
    if (!b) {
      loader->start_epoch();
      b = loader->next();
    }
    ASSERT_TRUE(b.has_value());
    Tensor loss;
    {
      AutocastGuard region = trainer->autocast();
      loss = F::cross_entropy(model->forward(b->data), b->target);
    }
    trainer->backward(loss);
    trainer->step();
    trainer->zero_grad();
    sched->step();
  }
  void steps(int64_t n) {
    for (int64_t i = 0; i < n; ++i) step();
  }
};

// Everything a step changes, bitwise.
struct Snapshot {
  std::map<std::string, std::vector<unsigned char>> weights, optimizer;
  PhiloxState gen;
  int64_t sched_epoch = 0, loader_epoch = 0, loader_consumed = 0;
  double lr = 0;

  explicit Snapshot(Rig& r)
      : weights(bytes_of(r.model->state_dict())), optimizer(bytes_of(r.trainer->state_dict())),
        gen(default_generator().state()), sched_epoch(r.sched->last_epoch()), loader_epoch(r.loader->state().epoch),
        loader_consumed(r.loader->state().batches_consumed), lr(r.trainer->optimizer().param_groups()[0].lr()) {}
};

void expect_equal(const Snapshot& a, const Snapshot& b) {
  EXPECT_EQ(a.weights, b.weights) << "weights";
  EXPECT_EQ(a.optimizer, b.optimizer) << "optimizer state (and the loss scaler's)";
  EXPECT_EQ(a.gen.seed, b.gen.seed);
  EXPECT_EQ(a.gen.offset, b.gen.offset) << "the default generator";
  EXPECT_EQ(a.sched_epoch, b.sched_epoch);
  EXPECT_EQ(std::memcmp(&a.lr, &b.lr, sizeof a.lr), 0) << "lr";
  EXPECT_EQ(a.loader_epoch, b.loader_epoch);
  EXPECT_EQ(a.loader_consumed, b.loader_consumed);
}

class ResumeTest : public ::testing::TestWithParam<AmpMode> {};

TEST_P(ResumeTest, TwentyStepsEqualStepsSaveLoadSteps) {
  const AmpMode mode = GetParam();
  constexpr int64_t kTotal = 20;
  Rig straight(mode, 1);
  const Snapshot initial(straight);
  straight.steps(kTotal);
  const Snapshot reference(straight);
  ASSERT_NE(reference.weights, initial.weights) << "the run trains";
  TempDir dir;
  // 10: the middle of the second epoch (6 batches each); 6: exactly at the end of the first; 13: into the third.
  for (int64_t at : {10, 6, 13}) {
    SCOPED_TRACE("saved after step " + std::to_string(at));
    const std::string path = dir.file("ckpt_" + std::to_string(at) + ".safetensors");
    {
      Rig first(mode, 1);
      first.steps(at);
      train::save_training_checkpoint(path, first.parts(), at);
    }
    Rig resumed(mode, 77);  // other weights, generator and (until loaded) everything else
    const train::TrainingCheckpointInfo info = train::load_training_checkpoint(path, resumed.parts());
    EXPECT_EQ(info.step, at);
    resumed.steps(kTotal - at);
    expect_equal(Snapshot(resumed), reference);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, ResumeTest,
                         ::testing::Values(AmpMode::none, AmpMode::fp16, AmpMode::autocast_fp16),
                         [](const ::testing::TestParamInfo<AmpMode>& i) {
                           return std::string(i.param == AmpMode::none   ? "fp32"
                                              : i.param == AmpMode::fp16 ? "fp16_loss_scaled"
                                                                         : "autocast_fp16");
                         });

TEST(TrainingCheckpoint, TheManifestRecordsWhatWasSaved) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  Rig r(AmpMode::fp16, 1);
  r.steps(8);
  train::save_training_checkpoint(path, r.parts(), 8, {{"note", "hello"}});
  const train::TrainingCheckpointInfo info = train::read_training_checkpoint_info(path);
  EXPECT_EQ(info.version, train::kTrainingCheckpointVersion);
  EXPECT_EQ(info.step, 8);
  EXPECT_EQ(info.model_kind, "Sequential");
  EXPECT_EQ(info.optimizer_kind, "fp16/AdamW");
  EXPECT_EQ(info.scheduler_kind, "CosineWarmupLR");
  ASSERT_TRUE(info.loader.has_value());
  EXPECT_EQ(info.loader->epoch, 1);
  EXPECT_EQ(info.loader->batches_consumed, 2);
  EXPECT_EQ(info.loader->seed, 11u);
  EXPECT_EQ(info.loader_batches_per_epoch, 6);
  ASSERT_EQ(info.generators.count("default"), 1u);
  EXPECT_EQ(info.generators.at("default").offset, default_generator().state().offset);
  ASSERT_TRUE(info.loss_scale.has_value());
  EXPECT_EQ(*info.loss_scale, r.trainer->loss_scale());
  EXPECT_EQ(info.extra.at("note"), "hello");
  EXPECT_EQ(info.tensors.at("model").size(), 4u);
  EXPECT_FALSE(info.tensors.at("optimizer").empty());
  EXPECT_EQ(info.tensors.at("scheduler").size(), 3u);  // last_epoch, base_lrs.0, last_lr.0
  // The model's tensors sit under their own names: a plain safetensors reader finds the state dict.
  std::set<std::string> names;
  for (const auto& [n, t] : nn::load_safetensors(path)) names.insert(n);
  EXPECT_TRUE(names.count("0.weight") && names.count("3.bias") && names.count("sched.last_epoch"));
}

TEST(TrainingCheckpoint, ACrashBetweenWriteAndRenameKeepsThePreviousCheckpoint) {
  TempDir dir;
  const std::string path = dir.file("run.safetensors");
  Rig r(AmpMode::none, 1);
  r.steps(5);
  train::save_training_checkpoint(path, r.parts(), 5);
  const Snapshot at5(r);
  r.steps(5);
  set_atomic_write_fault(AtomicWriteFault::before_rename);
  EXPECT_THROW(train::save_training_checkpoint(path, r.parts(), 10), Error);
  EXPECT_EQ(dir.count(".run.safetensors.tmp."), 1) << "the crashed write's complete temporary file stays behind";

  Rig fresh(AmpMode::none, 77);
  EXPECT_EQ(train::load_training_checkpoint(path, fresh.parts()).step, 5) << "the old checkpoint still loads";
  expect_equal(Snapshot(fresh), at5);

  // The stale temporary file confuses neither a later save nor a load; the fault fired once.
  train::save_training_checkpoint(path, r.parts(), 10);
  const Snapshot at10(r);
  Rig again(AmpMode::none, 78);
  EXPECT_EQ(train::load_training_checkpoint(path, again.parts()).step, 10);
  expect_equal(Snapshot(again), at10);
  EXPECT_EQ(dir.count(".run.safetensors.tmp."), 1);
}

TEST(TrainingCheckpoint, AFailingWriteRemovesItsTemporaryFile) {
  TempDir dir;
  const std::string path = dir.file("x.bin");
  EXPECT_THROW(write_file_atomically(path, [](const AtomicFileWrite& write) {
                 write("abc", 3);
                 EMBER_THROW(ValueError, "the writer gave up");
               }),
               ValueError);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(dir.count(".x.bin.tmp."), 0);
  write_file_atomically(path, std::string_view("new contents"));
  std::ifstream in(path, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "new contents");
  const std::string msg = error_message<Error>([&] { write_file_atomically(dir.file("no/such/dir/f"), "x"); });
  EXPECT_NE(msg.find("no/such/dir"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file"), std::string::npos) << "the errno text: " << msg;
}

// The replaced file's permission bits are kept; a new file gets 0666 less the umask (not a fixed 0644, which would
// make a private user's checkpoints world-readable); the temporary descriptor is close-on-exec; a symbolic link at
// the path becomes the new regular file and its target is left alone.
TEST(TrainingCheckpoint, AtomicWritesKeepModesCloseOnExecAndReplaceALink) {
  TempDir dir;
  auto mode_of = [](const std::string& p) { return fs::status(p).permissions() & fs::perms::all; };
  const mode_t old_mask = ::umask(077);
  write_file_atomically(dir.file("private"), std::string_view("a"));
  ::umask(022);
  write_file_atomically(dir.file("shared"), std::string_view("a"));
  ::umask(old_mask);
  EXPECT_EQ(mode_of(dir.file("private")), fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(mode_of(dir.file("shared")),
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read);
  fs::permissions(dir.file("shared"), fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  write_file_atomically(dir.file("shared"), std::string_view("b"));
  EXPECT_EQ(mode_of(dir.file("shared")), fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read)
      << "a replaced file keeps its mode";

  // Close-on-exec: the descriptor of the temporary file, found through /proc/self/fd while the fill runs.
  int flags = -1;
  const std::string prefix = atomic_temp_prefix(dir.file("cloexec"));
  write_file_atomically(dir.file("cloexec"), [&](const AtomicFileWrite& write) {
    for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      const fs::path target = fs::read_symlink(e.path(), ec);
      if (!ec && target.string().rfind(prefix, 0) == 0) flags = ::fcntl(std::stoi(e.path().filename()), F_GETFD);
    }
    write("x", 1);
  });
  ASSERT_GE(flags, 0) << "the temporary file's descriptor was not found";
  EXPECT_TRUE(flags & FD_CLOEXEC);

  write_file_atomically(dir.file("target"), std::string_view("old"));
  fs::create_symlink(dir.file("target"), dir.file("link"));
  write_file_atomically(dir.file("link"), std::string_view("new"));
  EXPECT_FALSE(fs::is_symlink(dir.file("link")));
  std::ifstream t(dir.file("target")), l(dir.file("link"));
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(t), {}), "old");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(l), {}), "new");
}

// Rewrites a checkpoint with its manifest (or tensors) changed.
void rewrite(const std::string& from, const std::string& to,
             const std::function<void(nn::NamedTensors&, nn::SafetensorsMetadata&)>& edit) {
  nn::NamedTensors tensors = nn::load_safetensors(from);
  nn::SafetensorsMetadata meta = nn::read_safetensors_metadata(from);
  edit(tensors, meta);
  write_file_atomically(to, nn::serialize_safetensors(tensors, meta));
}

TEST(TrainingCheckpoint, BadFilesRaiseTypedErrorsAndChangeNothing) {
  TempDir dir;
  const std::string good = dir.file("good.safetensors");
  {
    Rig r(AmpMode::fp16, 1);
    r.steps(7);
    train::save_training_checkpoint(good, r.parts(), 7);
  }
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto variant = [&](const std::string& name,
                     const std::function<void(nn::NamedTensors&, nn::SafetensorsMetadata&)>& edit) {
    const std::string p = dir.file(name);
    rewrite(good, p, edit);
    return p;
  };
  const std::string key = train::kTrainingManifestKey;
  auto edit_manifest = [&](const std::function<void(nlohmann::json&)>& f) {
    return [&, f](nn::NamedTensors&, nn::SafetensorsMetadata& m) {
      nlohmann::json j = nlohmann::json::parse(m.at(key));
      f(j);
      m[key] = j.dump();
    };
  };
  const std::string truncated = dir.file("truncated.safetensors");
  {
    std::ofstream out(truncated, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() * 2 / 3));
  }
  struct Case {
    std::string what, path;
    bool format;  // FormatError, else ValueError
  };
  const std::vector<Case> formats = {
      {"truncated", truncated, true},
      {"not JSON", variant("a", [&](nn::NamedTensors&, nn::SafetensorsMetadata& m) { m[key] = "{not json"; }), true},
      {"no manifest", variant("b", [&](nn::NamedTensors&, nn::SafetensorsMetadata& m) { m.erase(key); }), true},
      {"no step", variant("c", edit_manifest([](nlohmann::json& j) { j.erase("step"); })), true},
      {"negative step", variant("d", edit_manifest([](nlohmann::json& j) { j["step"] = -3; })), true},
      {"other format", variant("e", edit_manifest([](nlohmann::json& j) { j["format"] = "x"; })), true},
      {"newer version", variant("f", edit_manifest([](nlohmann::json& j) { j["version"] = 99; })), true},
      {"seed as text", variant("g", edit_manifest([](nlohmann::json& j) { j["loader"]["seed"] = "11"; })), true},
      {"unlisted tensor",
       variant("h", [](nn::NamedTensors& t, nn::SafetensorsMetadata&) { t.emplace_back("stray", zeros({2})); }), true},
      {"missing tensor",
       variant("i", [](nn::NamedTensors& t, nn::SafetensorsMetadata&) { t.erase(t.begin()); }), true},
      {"wrong dtype",
       variant("j",
               [](nn::NamedTensors& t, nn::SafetensorsMetadata&) {
                 for (auto& [n, x] : t)
                   if (n == "0.weight") x = x.to(DType::f64);
               }),
       false},
      {"other model kind", variant("k", edit_manifest([](nlohmann::json& j) { j["model"]["kind"] = "GPT"; })), false},
      {"other optimizer kind",
       variant("l", edit_manifest([](nlohmann::json& j) { j["optimizer"]["kind"] = "fp16/SGD"; })), false},
      {"no loader", variant("m", edit_manifest([](nlohmann::json& j) { j["loader"] = nullptr; })), false},
      // More batches consumed than the epoch has: refused before anything changes (DataLoader::load_state, which
      // would refuse it too, runs last).
      {"consumed beyond the epoch",
       variant("n", edit_manifest([](nlohmann::json& j) { j["loader"]["batches_consumed"] = 7; })), true},
  };
  Rig target(AmpMode::fp16, 5);
  target.steps(3);
  const Snapshot before(target);
  for (const Case& c : formats) {
    SCOPED_TRACE(c.what);
    try {
      train::load_training_checkpoint(c.path, target.parts());
      ADD_FAILURE() << "loaded";
    } catch (const FormatError& e) {
      EXPECT_TRUE(c.format) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.path), std::string::npos) << "names the file: " << e.what();
    } catch (const ValueError& e) {
      EXPECT_FALSE(c.format) << e.what();
    }
    expect_equal(Snapshot(target), before);
  }
  {
    SCOPED_TRACE("missing file");
    EXPECT_THROW(train::load_training_checkpoint(dir.file("none.safetensors"), target.parts()), ValueError);
  }
  // Objects of another shape, optimizer, mode or loader.
  auto refuses = [&](Rig& other, const std::string& what, const std::function<void(TrainingParts&)>& adjust = {}) {
    SCOPED_TRACE(what);
    TrainingParts p = other.parts();
    if (adjust) adjust(p);
    const Snapshot b(other);
    EXPECT_THROW(train::load_training_checkpoint(good, p), ValueError);
    expect_equal(Snapshot(other), b);
  };
  Rig narrower(AmpMode::fp16, 5, /*hidden=*/8);
  refuses(narrower, "a narrower model");
  Rig fp32(AmpMode::none, 5);
  refuses(fp32, "an fp32 trainer");
  Rig other_batches(AmpMode::fp16, 5, 16, /*batch=*/5);
  refuses(other_batches, "a loader with other batches");
  Rig sgd_rig(AmpMode::none, 5);
  optim::SGD sgd(sgd_rig.model->parameters(), {.lr = 0.1, .momentum = 0.9});
  refuses(sgd_rig, "an SGD optimizer", [&](TrainingParts& p) {
    p.trainer = nullptr;
    p.optimizer = &sgd;
  });
  Generator extra(3);
  refuses(target, "an unknown generator",
          [&](TrainingParts& p) { p.generators.emplace_back("augment", &extra); });
  // The file holds state for a part not given: refused, since the resume would not be exact...
  refuses(target, "no scheduler given", [](TrainingParts& p) { p.scheduler = nullptr; });
  refuses(target, "no loader given", [](TrainingParts& p) { p.loader = nullptr; });
  refuses(target, "no optimizer given", [](TrainingParts& p) { p.trainer = nullptr; });
  refuses(target, "the default generator not given", [](TrainingParts& p) { p.generators = {}; });
  // ...unless the caller asks for a partial load: the model alone (fine-tuning from a training checkpoint).
  {
    SCOPED_TRACE("a partial load of the model");
    Rig source(AmpMode::fp16, 1);  // what wrote `good`
    source.steps(7);
    const std::map<std::string, std::vector<unsigned char>> saved_weights = Snapshot(source).weights;
    default_generator().set_state(before.gen);  // building the source drew from it; the load must not
    TrainingParts p = target.parts();
    p.trainer = nullptr;
    p.scheduler = nullptr;
    p.loader = nullptr;
    p.generators = {};
    p.partial = true;
    EXPECT_EQ(train::load_training_checkpoint(good, p).step, 7);
    const Snapshot after(target);
    EXPECT_EQ(after.weights, saved_weights) << "the saved weights";
    // Everything not given is as it was: optimizer state, lr and schedule, loader position, the default generator.
    Snapshot expected = before;
    expected.weights = after.weights;
    expect_equal(after, expected);
  }
}

// A plain optimizer with a GradScaler beside it (not a trainer): the scaler's scale and growth tracker travel with
// the checkpoint; a disabled scaler (GradScaler(enabled = false), PyTorch's `GradScaler(enabled=use_amp)`) saves no
// state and loads none; an enabled and a disabled scaler refuse each other's checkpoints and change nothing.
TEST(TrainingCheckpoint, AnOptimizerWithAnEnabledOrDisabledGradScalerRoundTrips) {
  TempDir dir;
  auto make_model = [](uint64_t seed) {
    manual_seed(seed);
    return std::make_shared<nn::Linear>(3, 2);
  };
  auto one_step = [](nn::Linear& m, optim::AdamW& opt, optim::GradScaler& scaler) {
    const Tensor x = from_vector<float>({1, 2, 3, -1, 0.5f, 2}, {2, 3});
    const Tensor loss = ember::sum(m.forward(x));
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    opt.zero_grad();
  };
  for (bool enabled : {true, false}) {
    SCOPED_TRACE(enabled ? "enabled" : "disabled");
    const std::string path = dir.file(enabled ? "on.safetensors" : "off.safetensors");
    auto m = make_model(1);
    optim::AdamW opt(m->parameters(), {.lr = 0.1});
    optim::GradScaler scaler({.init_scale = 1024.0, .growth_interval = 3, .enabled = enabled});
    for (int i = 0; i < 2; ++i) one_step(*m, opt, scaler);
    TrainingParts p;
    p.model = m.get();
    p.optimizer = &opt;
    p.scaler = &scaler;
    p.generators = {};
    train::save_training_checkpoint(path, p, 2);

    auto m2 = make_model(9);
    optim::AdamW opt2(m2->parameters(), {.lr = 0.1});
    optim::GradScaler scaler2({.init_scale = 8.0, .growth_interval = 3, .enabled = enabled});
    TrainingParts q = p;
    q.model = m2.get();
    q.optimizer = &opt2;
    q.scaler = &scaler2;
    ASSERT_NO_THROW(train::load_training_checkpoint(path, q));
    EXPECT_EQ(bytes_of(m2->state_dict()), bytes_of(m->state_dict()));
    EXPECT_EQ(bytes_of(opt2.state_dict()), bytes_of(opt.state_dict()));
    if (enabled) {
      EXPECT_EQ(scaler2.get_scale(), 1024.0);  // two clean steps, growth every 3: unchanged
      EXPECT_EQ(scaler2.growth_tracker(), 2);
    }

    // The other kind of scaler refuses the file and keeps its objects as they were.
    auto m3 = make_model(5);
    optim::AdamW opt3(m3->parameters(), {.lr = 0.1});
    optim::GradScaler scaler3({.enabled = !enabled});
    TrainingParts r = p;
    r.model = m3.get();
    r.optimizer = &opt3;
    r.scaler = &scaler3;
    const auto weights3 = bytes_of(m3->state_dict());
    EXPECT_THROW(train::load_training_checkpoint(path, r), ValueError);
    EXPECT_EQ(bytes_of(m3->state_dict()), weights3);
    for (const auto& [n, t] : opt3.state_dict()) EXPECT_NE(n.rfind("state.", 0), 0u) << n << ": no state loaded";

    // No scaler given: an enabled scaler's saved state is refused unless the load is partial; a disabled one saved
    // none, so there is nothing to refuse.
    auto m4 = make_model(6);
    optim::AdamW opt4(m4->parameters(), {.lr = 0.1});
    TrainingParts t = p;
    t.model = m4.get();
    t.optimizer = &opt4;
    t.scaler = nullptr;
    if (enabled) {
      EXPECT_THROW(train::load_training_checkpoint(path, t), ValueError);
      EXPECT_EQ(bytes_of(m4->state_dict()), bytes_of(make_model(6)->state_dict())) << "unchanged";
      t.partial = true;
    }
    ASSERT_NO_THROW(train::load_training_checkpoint(path, t));
    EXPECT_EQ(bytes_of(m4->state_dict()), bytes_of(m->state_dict()));
  }
}

// TrainRunner (`ember train`): a run that saves at step k of n (from its progress callback) and a run resumed from
// that file end with the weights and optimizer state of a run that never stopped — mnist-cnn (dropout, a shuffling
// 2-worker loader, warmup + cosine) and char-gpt (random windows from its own generator).
TEST(TrainingCheckpoint, TrainRunnerResumesBitExactly) {
  TempDir dir;
  struct Case {
    const char* what;
    train::RunnerOptions o;
    int64_t save_at;
  };
  train::RunnerOptions mnist;
  mnist.model = "mnist-cnn";
  mnist.synthetic = true;
  mnist.batch_size = 8;
  mnist.steps = 8;
  mnist.workers = 2;
  mnist.max_test = 8;
  train::RunnerOptions gpt;
  gpt.model = "char-gpt";
  gpt.synthetic = true;
  gpt.n_layer = 1;
  gpt.n_head = 2;
  gpt.n_embd = 32;
  gpt.block_size = 16;
  gpt.batch_size = 4;
  gpt.eval_iters = 1;
  gpt.steps = 6;
  for (const Case& c : {Case{"mnist-cnn", mnist, 3}, Case{"char-gpt", gpt, 4}}) {
    SCOPED_TRACE(c.what);
    const std::string path = dir.file(std::string(c.what) + ".safetensors");
    train::TrainRunner straight(c.o);
    straight.run();
    const auto weights = bytes_of(straight.model().state_dict());
    const auto optimizer = bytes_of(straight.trainer().state_dict());

    train::RunnerOptions saving = c.o;
    train::TrainRunner* self = nullptr;
    saving.log_interval = 1;
    saving.on_progress = [&](const train::Progress& p) {
      if (p.step == c.save_at) self->save(path);
    };
    train::TrainRunner interrupted(saving);
    self = &interrupted;
    interrupted.run();
    EXPECT_EQ(bytes_of(interrupted.model().state_dict()), weights) << "saving changes nothing";

    train::RunnerOptions resuming = c.o;
    resuming.resume_path = path;
    train::TrainRunner resumed(resuming);
    const train::RunResult r = resumed.run();
    EXPECT_EQ(r.start_step, c.save_at);
    EXPECT_EQ(bytes_of(resumed.model().state_dict()), weights);
    EXPECT_EQ(bytes_of(resumed.trainer().state_dict()), optimizer);
  }
}

}  // namespace
}  // namespace ember::testing
