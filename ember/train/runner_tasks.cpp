// The training recipes of TrainRunner (runner_tasks.h): mnist-cnn (examples/mnist_cnn.cpp's recipe through a
// DataLoader), char-gpt (examples/char_gpt.cpp's nanoGPT recipe) and the standard synthetic tasks (bench_train.h).
// Invariant: evaluation runs without recording, under the trainer's autocast, in eval mode, and leaves the model in
// training mode.
#include "ember/train/runner_tasks.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>

#include "ember/autograd/functions.h"
#include "ember/base/error.h"
#include "ember/core/generator.h"
#include "ember/core/grad_mode.h"
#include "ember/data/dataloader.h"
#include "ember/data/image_dataset.h"
#include "ember/data/mnist.h"
#include "ember/data/text_dataset.h"
#include "ember/data/transforms.h"
#include "ember/memory/tags.h"
#include "ember/nn/functional.h"
#include "ember/nn/models.h"
#include "ember/nn/transformer.h"
#include "ember/optim/adam.h"
#include "ember/train/bench_train.h"

namespace ember::train::detail {

namespace F = nn::functional;

namespace {

std::string fmt(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

int64_t meta_int(const nn::SafetensorsMetadata& meta, const std::string& key) {
  auto it = meta.find(key);
  EMBER_CHECK(it != meta.end(), ValueError, "the checkpoint's metadata has no '", key, "'");
  try {
    size_t used = 0;
    const long long v = std::stoll(it->second, &used);
    EMBER_CHECK(used == it->second.size() && v > 0, ValueError, "");
    return v;
  } catch (const std::exception&) {
    EMBER_THROW(ValueError, "the checkpoint's metadata '", key, "' is not a positive integer: '", it->second, "'");
  }
}

// ---- mnist-cnn ----------------------------------------------------------------------------------------------------

// The MNIST images as samples f32 [1, 28, 28] normalised with the training set's statistics, labels i64.
std::shared_ptr<const data::Dataset> mnist_samples(const data::MnistData& raw) {
  auto images = std::make_shared<data::ImageDataset>(data::ImageDataset::from(raw));
  return std::make_shared<data::TransformDataset>(
      images, data::Compose({data::ToTensor(), data::Normalize({data::kMnistMean}, {data::kMnistStd})}));
}

class MnistTask final : public RunTask {
 public:
  using RunTask::RunTask;

  std::string load_data(int64_t planned) override {
    const std::string dir = o_.data.empty() ? std::string("../shared/data/mnist") : o_.data;
    const bool real = !o_.synthetic && std::filesystem::exists(dir);
    EMBER_CHECK(real || o_.synthetic || o_.data.empty(), ValueError, "--data ", dir, " does not exist");
    const int64_t gen_train =
        resumed_train_ > 0 ? resumed_train_ : planned >= 0 ? std::clamp<int64_t>(planned, 1, 60000) : 60000;
    const int64_t gen_test = o_.max_test >= 0 ? std::clamp<int64_t>(o_.max_test, 1, 10000) : 10000;
    {
      memory::PhaseScope phase(memory::Phase::Data);
      train_raw_ = real ? data::load_mnist(dir, true) : data::synthetic_mnist(gen_train, seed_);
      test_raw_ = real ? data::load_mnist(dir, false) : data::synthetic_mnist(gen_test, seed_ + 1);
    }
    real_ = real;
    return std::string(real ? "real MNIST" : "generated digits") + " (" + std::to_string(train_raw_.size()) +
           " train, " + std::to_string(test_raw_.size()) + " test images)" + (real ? " from " + dir : "");
  }

  // A generated training set is sized from the first run's --steps: a resumed run regenerates that many.
  void adopt_data(const nn::SafetensorsMetadata& meta) override {
    auto it = meta.find("generated_train_samples");
    if (it == meta.end()) return;
    const std::string& v = it->second;
    EMBER_CHECK(!v.empty() && v.size() <= 5 && v.find_first_not_of("0123456789") == std::string::npos, ValueError,
                "the checkpoint's generated_train_samples '", v, "' is not a count");
    resumed_train_ = std::clamp<int64_t>(std::stoll(v), 1, 60000);
  }
  nn::SafetensorsMetadata architecture() const override {
    if (real_) return {};
    return {{"generated_train_samples", std::to_string(train_raw_.size())}};
  }

  std::shared_ptr<nn::Module> build_model() override {
    manual_seed(seed_);
    auto model = std::make_shared<nn::MnistNet>();
    model->to(o_.device);
    return model;
  }

  int64_t default_batch() const override { return 64; }
  int64_t default_steps() const override { return 0; }
  double default_lr() const override { return 3e-3; }
  bool has_block_chain() const override { return false; }
  optim::OptimizerFactory optimizer(double lr) const override {
    return [lr](std::vector<optim::ParamGroup> g) {
      return std::make_unique<optim::AdamW>(std::move(g), optim::AdamWOptions{.lr = lr, .weight_decay = 0.0});
    };
  }
  // Warmup over the first 100 steps (a tenth of shorter runs), cosine decay to 0 at the last step.
  std::unique_ptr<optim::LRScheduler> scheduler(optim::Optimizer& opt, int64_t total) const override {
    return std::make_unique<optim::CosineWarmupLR>(opt, std::min<int64_t>(100, total / 10), std::max<int64_t>(total, 1),
                                                   0.0);
  }

  data::DataLoaderOptions train_options(int64_t batch) const {
    data::DataLoaderOptions train_opts;
    train_opts.batch_size = batch;
    train_opts.shuffle = true;
    train_opts.seed = seed_;
    train_opts.num_workers = o_.workers;
    train_opts.device = o_.device;
    return train_opts;
  }
  int64_t held_ahead() const override { return data::DataLoader::held_ahead(train_options(1)); }

  int64_t start_data(int64_t batch, int64_t start) override {
    const data::DataLoaderOptions train_opts = train_options(batch);
    train_ = std::make_unique<data::DataLoader>(mnist_samples(train_raw_), train_opts);
    data::DataLoaderOptions test_opts = train_opts;
    // Test batches of at most 256 images (their conv activations stay ~100 MiB) and no larger than a training
    // micro-batch, whose step needs more memory than its forward without recording: a batch that trains fits here.
    test_opts.batch_size = std::clamp<int64_t>(batch / std::max<int64_t>(o_.grad_accum, 1), 1, 256);
    test_opts.shuffle = false;
    test_ = std::make_unique<data::DataLoader>(mnist_samples(test_raw_), test_opts);
    per_epoch_ = train_->num_batches();
    // Resuming: the position of step `start` (Note [Loader position] in data/dataloader.h: the consumed batches are
    // skipped without loading them); a training checkpoint then restores the saved position itself.
    train_->load_state({start / per_epoch_, start % per_epoch_, seed_});
    return per_epoch_;
  }

  Batch next_batch() override {
    memory::PhaseScope phase(memory::Phase::Data);
    std::optional<data::Batch> b = train_->next();
    if (!b) {  // the epoch is over: the next one
      train_->start_epoch();
      b = train_->next();
      EMBER_CHECK(b.has_value(), ValueError, "mnist-cnn: the training set yields no batch");
    }
    return {b->data, b->target};
  }

  data::DataLoader* train_loader() override { return train_.get(); }

  LossResult loss(nn::Module& model, const Batch& b) const override {
    return LossResult{F::cross_entropy(model.forward(b[0]), b[1]), b[1].numel()};
  }

  Batch random_batch(int64_t rows, Device device) const override {
    const TensorOptions f32(DType::f32, device);
    return {randn({rows, 1, 28, 28}, f32), (rand({rows}, f32) * 10.0).to(DType::i64)};
  }

  std::string evaluate(nn::Module& model, const AmpTrainer& trainer, int64_t step, bool epoch_done, bool last,
                       RunResult& result) override {
    if (!epoch_done && !last) return "";
    if (last && !epoch_done && evaluated_at_ == step) return "";
    evaluated_at_ = step;
    const double acc = accuracy(model, trainer);
    result.test_accuracy = acc;
    return "step " + std::to_string(step) + (epoch_done ? " (end of epoch " + std::to_string(step / per_epoch_) + ")"
                                                        : std::string()) +
           ": test accuracy " + fmt("%.2f%%", 100.0 * acc) + " on " + std::to_string(tested_) + " images";
  }

 private:
  double accuracy(nn::Module& model, const AmpTrainer& trainer) {
    NoGradGuard no_grad;
    AutocastGuard region = trainer.autocast();
    model.eval();
    int64_t correct = 0, seen = 0;
    const int64_t max_test = o_.max_test;
    test_->start_epoch();
    while (true) {
      std::optional<data::Batch> b;
      {
        memory::PhaseScope phase(memory::Phase::Data);
        b = test_->next();
      }
      if (!b || (max_test >= 0 && seen >= max_test)) break;
      const int64_t len = max_test >= 0 ? std::min(b->size(), max_test - seen) : b->size();
      const Tensor logits = model.forward(b->data.narrow(0, 0, len));
      correct += static_cast<int64_t>(
          sum(eq(argmax(logits, 1), b->target.narrow(0, 0, len)).to(DType::f64)).item_double());
      seen += len;
    }
    model.train();
    tested_ = seen;
    return static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(seen, 1));
  }

  data::MnistData train_raw_, test_raw_;
  std::unique_ptr<data::DataLoader> train_, test_;
  int64_t per_epoch_ = 1, evaluated_at_ = -1, tested_ = 0, resumed_train_ = 0;
  bool real_ = false;
};

// ---- char-gpt -----------------------------------------------------------------------------------------------------

// A stand-in corpus when Tiny Shakespeare is absent: repetitive verse the model can learn.
std::string generated_text() {
  const char* lines[] = {"First Citizen:\nBefore we proceed any further, hear me speak.\n\n", "All:\nSpeak, speak.\n\n",
                         "First Citizen:\nYou are all resolved rather to die than to famish?\n\n",
                         "All:\nResolved. resolved.\n\n"};
  std::string s;
  for (int i = 0; i < 4000; ++i) s += lines[i % 4];
  return s;
}

class CharGptTask final : public RunTask {
 public:
  CharGptTask(const RunnerOptions& o, uint64_t seed) : RunTask(o, seed) {
    cfg_.n_layer = o.n_layer > 0 ? o.n_layer : 4;
    cfg_.n_head = o.n_head > 0 ? o.n_head : 4;
    cfg_.n_embd = o.n_embd > 0 ? o.n_embd : 128;
    cfg_.block_size = o.block_size > 0 ? o.block_size : 64;
  }

  std::string load_data(int64_t) override {
    const std::string path = o_.data.empty() ? std::string("../shared/data/tinyshakespeare/input.txt") : o_.data;
    const bool real = !o_.synthetic && std::filesystem::exists(path);
    EMBER_CHECK(real || o_.synthetic || o_.data.empty(), ValueError, "--data ", path, " does not exist");
    EMBER_CHECK(!real || std::filesystem::is_regular_file(path), ValueError, "--data ", path, " is not a file");
    ds_ = std::make_unique<data::CharDataset>(real ? data::CharDataset::from_file(path)
                                                   : data::CharDataset(generated_text()));
    cfg_.vocab_size = ds_->vocab_size();
    return std::string(real ? path : "generated text") + " (" + std::to_string(ds_->length()) +
           " characters, vocabulary " + std::to_string(cfg_.vocab_size) + ")";
  }

  // Note [Checkpoint architecture]
  // The metadata is only text beside the tensors: every entry is checked against the tensors themselves (n_layer is
  // the number of blocks transformer.h.<i> present, vocab_size and n_embd the embedding's shape, block_size the
  // position table's rows) and against sane bounds before a model is built from it, and the vocabulary is compared
  // as text (its characters in id order) so that another text with as many characters is refused too. A checkpoint
  // without the "vocabulary" entry is compared by size only.
  void adopt_architecture(const nn::SafetensorsMetadata& meta, const TensorShapes& shapes) override {
    struct Field {
      const char* key;
      const char* flag;
      int64_t given;
      int64_t* value;
      int64_t max;
    };
    const Field fields[] = {{"n_layer", "--n-layer", o_.n_layer, &cfg_.n_layer, kMaxLayers},
                            {"n_head", "--n-head", o_.n_head, &cfg_.n_head, kMaxWidth},
                            {"n_embd", "--n-embd", o_.n_embd, &cfg_.n_embd, kMaxWidth},
                            {"block_size", "--block-size", o_.block_size, &cfg_.block_size, kMaxBlock}};
    for (const Field& f : fields) {
      const int64_t saved = meta_int(meta, f.key);
      EMBER_CHECK(saved <= f.max, ValueError, "the checkpoint's ", f.key, " ", saved, " exceeds ", f.max);
      EMBER_CHECK(f.given == 0 || f.given == saved, ValueError, f.flag, " ", f.given,
                  " does not match the checkpoint's ", saved);
      *f.value = saved;
    }
    const int64_t vocab = meta_int(meta, "vocab_size");
    EMBER_CHECK(cfg_.n_embd % cfg_.n_head == 0, ValueError, "the checkpoint's n_head ", cfg_.n_head,
                " does not divide its n_embd ", cfg_.n_embd);
    check_tensors(shapes, vocab);
    auto text = meta.find("vocabulary");
    if (text != meta.end()) {
      const std::string ours = vocabulary_text();
      EMBER_CHECK(text->second == ours, ValueError, "the checkpoint's vocabulary (", vocab,
                  " characters) is not the data's (", cfg_.vocab_size, " characters",
                  vocab == cfg_.vocab_size ? ", other ones" : "", "; a different text?)");
    }
    EMBER_CHECK(vocab == cfg_.vocab_size, ValueError, "the checkpoint's vocabulary has ", vocab,
                " characters, the data's ", cfg_.vocab_size, " (a different text?)");
  }

  nn::SafetensorsMetadata architecture() const override {
    return {{"n_layer", std::to_string(cfg_.n_layer)},
            {"n_head", std::to_string(cfg_.n_head)},
            {"n_embd", std::to_string(cfg_.n_embd)},
            {"block_size", std::to_string(cfg_.block_size)},
            {"vocab_size", std::to_string(cfg_.vocab_size)},
            {"vocabulary", vocabulary_text()}};
  }

  std::shared_ptr<nn::Module> build_model() override {
    EMBER_CHECK(cfg_.n_embd % cfg_.n_head == 0, ValueError, "char-gpt: --n-embd ", cfg_.n_embd,
                " is not a multiple of --n-head ", cfg_.n_head);
    for (data::Split s : {data::Split::train, data::Split::val})
      EMBER_CHECK(ds_->split_length(s) > cfg_.block_size, ValueError, "char-gpt: the text's ",
                  s == data::Split::train ? "training" : "validation", " split (", ds_->split_length(s),
                  " characters) is not longer than the block size ", cfg_.block_size);
    manual_seed(seed_);
    auto model = std::make_shared<nn::GPT>(cfg_);
    model->to(o_.device);
    return model;
  }

  int64_t default_batch() const override { return 12; }
  int64_t default_steps() const override { return 2000; }
  double default_lr() const override { return 1e-3; }
  bool has_block_chain() const override { return true; }
  double max_grad_norm() const override { return 1.0; }
  // nanoGPT's configure_optimizers: weight decay 0.1 on matrices (dim >= 2) only.
  std::vector<optim::ParamGroup> param_groups(nn::Module& model) const override {
    std::vector<Tensor> decay, no_decay;
    for (const Tensor& p : model.parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
    return {{decay, {{"weight_decay", 0.1}}}, {no_decay, {{"weight_decay", 0.0}}}};
  }
  optim::OptimizerFactory optimizer(double lr) const override {
    return [lr](std::vector<optim::ParamGroup> g) {
      return std::make_unique<optim::AdamW>(std::move(g), optim::AdamWOptions{.lr = lr, .betas = {0.9, 0.99}});
    };
  }
  // nanoGPT: 100 warmup steps of 2000 (a tenth of shorter runs), cosine decay to lr / 10 at the last step.
  std::unique_ptr<optim::LRScheduler> scheduler(optim::Optimizer& opt, int64_t total) const override {
    const double base = opt.param_groups().front().lr();
    return std::make_unique<optim::CosineWarmupLR>(opt, std::min<int64_t>(100, total / 10), std::max<int64_t>(total, 1),
                                                   base / 10.0);
  }

  int64_t start_data(int64_t batch, int64_t start) override {
    batch_ = batch;
    // A resumed run's training checkpoint restores both generators' states (generators()), so it draws the windows
    // the uninterrupted run would have.
    train_gen_ = std::make_unique<Generator>(seed_);
    eval_gen_ = std::make_unique<Generator>(seed_ + 1);
    return 0;
  }

  std::vector<std::pair<std::string, Generator*>> generators() override {
    return {{"char-gpt.train", train_gen_.get()}, {"char-gpt.eval", eval_gen_.get()}};
  }

  Batch next_batch() override {
    memory::PhaseScope phase(memory::Phase::Data);
    const auto [x, y] = ds_->get_batch(data::Split::train, batch_, cfg_.block_size, *train_gen_, o_.device);
    return {x, y};
  }

  LossResult loss(nn::Module& model, const Batch& b) const override {
    auto& gpt = static_cast<nn::GPT&>(model);
    return LossResult{gpt.forward(b[0], b[1]).loss, b[1].numel()};
  }

  Batch random_batch(int64_t rows, Device device) const override {
    const TensorOptions f32(DType::f32, device);
    const double vocab = static_cast<double>(cfg_.vocab_size);
    return {(rand({rows, cfg_.block_size}, f32) * vocab).to(DType::i64),
            (rand({rows, cfg_.block_size}, f32) * vocab).to(DType::i64)};
  }

  // nanoGPT's estimate_loss on both splits every eval_interval steps and at the end.
  std::string evaluate(nn::Module& model, const AmpTrainer& trainer, int64_t step, bool, bool last,
                       RunResult& result) override {
    if (!last && (o_.eval_interval <= 0 || step % o_.eval_interval != 0)) return "";
    if (last && evaluated_at_ == step) return "";
    evaluated_at_ = step;
    auto& gpt = static_cast<nn::GPT&>(model);
    const double tl = estimate_loss(gpt, data::Split::train, trainer);
    const double vl = estimate_loss(gpt, data::Split::val, trainer);
    result.train_loss = tl;
    result.val_loss = vl;
    return "step " + std::to_string(step) + ": train loss " + fmt("%.4f", tl) + ", val loss " + fmt("%.4f", vl);
  }

 private:
  double estimate_loss(nn::GPT& model, data::Split split, const AmpTrainer& trainer) {
    NoGradGuard no_grad;
    AutocastGuard region = trainer.autocast();
    model.eval();
    double total = 0;
    const int64_t iters = std::max<int64_t>(o_.eval_iters, 1);
    for (int64_t i = 0; i < iters; ++i) {
      std::pair<Tensor, Tensor> xy;
      {
        memory::PhaseScope phase(memory::Phase::Data);
        xy = ds_->get_batch(split, batch_, cfg_.block_size, *eval_gen_, o_.device);
      }
      total += model.forward(xy.first, xy.second).loss.item_double();
    }
    model.train();
    return total / static_cast<double>(iters);
  }

  nn::GPTConfig cfg_;
  static constexpr int64_t kMaxLayers = 4096, kMaxWidth = int64_t{1} << 16, kMaxBlock = int64_t{1} << 20;

  // The vocabulary's characters in id order, as UTF-8.
  std::string vocabulary_text() const {
    std::vector<int64_t> ids(static_cast<size_t>(cfg_.vocab_size));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
    return ds_->decode(ids);
  }

  // The metadata (already in cfg_, and `vocab`) against the tensors' shapes: Note [Checkpoint architecture].
  void check_tensors(const TensorShapes& shapes, int64_t vocab) const {
    auto shape_of = [&](const std::string& name) -> const std::vector<int64_t>& {
      auto it = shapes.find(name);
      EMBER_CHECK(it != shapes.end(), ValueError, "the checkpoint has no tensor ", name);
      EMBER_CHECK(it->second.size() == 2, ValueError, "the checkpoint's ", name, " has ", it->second.size(),
                  " dimensions, not 2");
      return it->second;
    };
    const std::vector<int64_t>& wte = shape_of("transformer.wte.weight");
    EMBER_CHECK(wte[0] == vocab, ValueError, "the checkpoint's vocab_size ", vocab,
                " does not match its embedding's ", wte[0], " rows");
    EMBER_CHECK(wte[1] == cfg_.n_embd, ValueError, "the checkpoint's n_embd ", cfg_.n_embd,
                " does not match its embedding's ", wte[1], " columns");
    const std::vector<int64_t>& wpe = shape_of("transformer.wpe.weight");
    EMBER_CHECK(wpe[0] == cfg_.block_size && wpe[1] == cfg_.n_embd, ValueError, "the checkpoint's block_size ",
                cfg_.block_size, " and n_embd ", cfg_.n_embd, " do not match its position table [", wpe[0], ", ",
                wpe[1], "]");
    const std::string prefix = "transformer.h.";
    std::set<int64_t> blocks;
    for (const auto& entry : shapes) {
      const std::string& name = entry.first;
      if (name.rfind(prefix, 0) != 0) continue;
      const size_t dot = name.find('.', prefix.size());
      const std::string index = name.substr(prefix.size(), dot == std::string::npos ? dot : dot - prefix.size());
      EMBER_CHECK(!index.empty() && index.size() <= 9 &&
                      index.find_first_not_of("0123456789") == std::string::npos,
                  ValueError, "the checkpoint's tensor ", name, " is not in a numbered transformer block");
      blocks.insert(std::stoll(index));
    }
    const int64_t present = static_cast<int64_t>(blocks.size());
    EMBER_CHECK(present == cfg_.n_layer && (blocks.empty() || *blocks.rbegin() == present - 1), ValueError,
                "the checkpoint's n_layer ", cfg_.n_layer, " does not match its tensors (", present,
                " transformer blocks)");
  }

  std::unique_ptr<data::CharDataset> ds_;
  std::unique_ptr<Generator> train_gen_, eval_gen_;
  int64_t batch_ = 12, evaluated_at_ = -1;
};

// ---- mlp / cnn / gpt ----------------------------------------------------------------------------------------------

// One fixed random batch (make_standard_task), as `ember bench train` steps; AdamW lr 1e-3.
class StandardRunTask final : public RunTask {
 public:
  using RunTask::RunTask;

  std::string load_data(int64_t) override { return "one fixed random batch (the standard " + o_.model + " task)"; }

  std::shared_ptr<nn::Module> build_model() override {
    task_ = make_standard_task(o_.model, o_.device, seed_, o_.auto_batch ? 0 : o_.batch_size);
    return task_.model;
  }

  int64_t default_batch() const override { return o_.model == "mlp" ? 256 : o_.model == "cnn" ? 64 : 12; }
  int64_t default_steps() const override { return 20; }
  double default_lr() const override { return 1e-3; }
  bool has_block_chain() const override { return o_.model != "cnn"; }

  int64_t start_data(int64_t batch, int64_t) override {
    if (batch != task_.batch) {  // the batch search chose another size: a fresh random batch of that many rows
      const Batch b = random_batch(batch, o_.device);
      task_.inputs = b[0];
      task_.targets = b[1];
      task_.batch = batch;
    }
    return 0;
  }

  Batch next_batch() override { return {task_.inputs, task_.targets}; }

  LossResult loss(nn::Module&, const Batch& b) const override {
    return LossResult{task_.loss_on(b[0], b[1]), b[1].numel()};
  }

  Batch random_batch(int64_t rows, Device device) const override {
    const TensorOptions f32(DType::f32, device);
    if (o_.model == "gpt") {
      const nn::GPTConfig gpt;
      const double vocab = static_cast<double>(gpt.vocab_size);
      return {(rand({rows, gpt.block_size}, f32) * vocab).to(DType::i64),
              (rand({rows, gpt.block_size}, f32) * vocab).to(DType::i64)};
    }
    const Tensor x = o_.model == "mlp" ? randn({rows, 784}, f32) : randn({rows, 1, 28, 28}, f32);
    return {x, (rand({rows}, f32) * 10.0).to(DType::i64)};
  }

 private:
  StandardTask task_;
};

}  // namespace

std::vector<optim::ParamGroup> RunTask::param_groups(nn::Module& model) const {
  return {optim::ParamGroup{model.parameters()}};
}

optim::OptimizerFactory RunTask::optimizer(double lr) const {
  return [lr](std::vector<optim::ParamGroup> g) {
    return std::make_unique<optim::AdamW>(std::move(g), optim::AdamWOptions{.lr = lr});
  };
}

std::unique_ptr<RunTask> make_run_task(const RunnerOptions& o, uint64_t seed) {
  if (o.model == "mnist-cnn") return std::make_unique<MnistTask>(o, seed);
  if (o.model == "char-gpt") return std::make_unique<CharGptTask>(o, seed);
  if (o.model == "mlp" || o.model == "cnn" || o.model == "gpt") return std::make_unique<StandardRunTask>(o, seed);
  EMBER_THROW(ValueError, "unknown model '", o.model, "' (known: ", runner_models(), ")");
}

uint64_t default_seed(const std::string& model) {
  if (model == "mnist-cnn") return 1;
  if (model == "char-gpt") return 1337;
  return 0;
}

bool model_has_block_chain(const std::string& model) { return model != "mnist-cnn" && model != "cnn"; }
bool model_has_epochs(const std::string& model) { return model == "mnist-cnn"; }

}  // namespace ember::train::detail

namespace ember::train {
const char* runner_models() { return "mnist-cnn, char-gpt, mlp, cnn, gpt"; }
}  // namespace ember::train
