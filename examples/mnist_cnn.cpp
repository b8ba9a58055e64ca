// Trains pytorch/examples' MNIST CNN (conv 32 → conv 64 → max-pool → dropout → fc 128 → dropout → fc 10), batch 64,
// and reports test accuracy, time, and the memory the training used. The default recipe is AdamW lr 3e-3 with a
// 100-step warmup and a per-step cosine decay to 0 (≥ 99% test accuracy in 2 epochs, bench/RESULTS.md);
// --optimizer adadelta is that example's own recipe (Adadelta lr 1.0, StepLR gamma 0.7 per epoch: ~98.7%).
// Data: --data DIR (the IDX files, raw or .gz); by default ../shared/data/mnist when it exists, else generated
// digit images (so the example always runs). The images stay u8 on the host; a DataLoader with --workers threads
// normalises and batches them (pinned and copied ahead on a copy stream when training on CUDA).
// --amp fp16|bf16 trains with f16/bf16 weights, fp32 master weights and autocast (loss-scaled for fp16);
// --amp autocast-fp16|autocast-bf16 keeps fp32 weights under autocast (train/amp.h).
//   mnist_cnn [--data DIR] [--epochs 2] [--batch-size 64] [--optimizer adadelta|adamw] [--lr X] [--workers 1]
//             [--amp none|fp16|bf16|autocast-fp16|autocast-bf16] [--device cpu|cuda] [--max-batches N] [--max-test N]
//             [--save model.safetensors]   (the trained weights, f32, for examples/mnist_compress --init)
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>

#include "ember/data/dataloader.h"
#include "ember/data/image_dataset.h"
#include "ember/data/mnist.h"
#include "ember/data/transforms.h"
#include "ember/ember.h"
#include "ember/nn/functional.h"
#include "ember/nn/models.h"
#include "ember/nn/safetensors.h"
#include "ember/optim/adadelta.h"
#include "ember/optim/adam.h"
#include "ember/optim/lr_scheduler.h"
#include "ember/train/amp.h"

using namespace ember;
namespace F = ember::nn::functional;

namespace {

// The MNIST images as samples f32 [1, 28, 28] normalised with the training set's statistics, labels i64.
std::shared_ptr<const data::Dataset> mnist_samples(const data::MnistData& raw) {
  auto images = std::make_shared<data::ImageDataset>(data::ImageDataset::from(raw));
  return std::make_shared<data::TransformDataset>(
      images, data::Compose({data::ToTensor(), data::Normalize({data::kMnistMean}, {data::kMnistStd})}));
}

double accuracy(nn::Module& model, data::DataLoader& test, int64_t max_test, const train::AmpTrainer& trainer) {
  NoGradGuard no_grad;
  AutocastGuard region = trainer.autocast();
  model.eval();
  int64_t correct = 0, seen = 0;
  test.start_epoch();
  while (std::optional<data::Batch> b = test.next()) {  // batches of 256: the conv activations stay ~100 MiB
    if (max_test >= 0 && seen >= max_test) break;
    const int64_t len = max_test >= 0 ? std::min(b->size(), max_test - seen) : b->size();
    const Tensor logits = model.forward(b->data.narrow(0, 0, len));
    correct += static_cast<int64_t>(
        sum(eq(argmax(logits, 1), b->target.narrow(0, 0, len)).to(DType::f64)).item_double());
    seen += len;
  }
  model.train();
  return static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(seen, 1));
}

}  // namespace

int main(int argc, char** argv) {
  std::string data_dir = "../shared/data/mnist", device_name = "cpu";
  int64_t epochs = 2, batch_size = 64, max_batches = -1, max_test = -1;
  double lr = -1.0;  // per optimizer: AdamW 3e-3, Adadelta 1.0
  std::string optimizer = "adamw", amp = "none", save_path;
  uint64_t seed = 1;
  int64_t workers = 1;
  const CLI::Range positive(int64_t{1}, std::numeric_limits<int64_t>::max());
  CLI::App app{"Train the pytorch/examples MNIST CNN with ember"};
  app.add_option("--data", data_dir, "directory with the MNIST IDX files (raw or .gz)");
  app.add_option("--epochs", epochs)->check(positive)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--batch-size", batch_size)->check(positive);
  app.add_option("--lr", lr, "learning rate (default: 3e-3 for adamw, 1.0 for adadelta)");
  app.add_option("--optimizer", optimizer,
                 "adamw (default): AdamW with warmup and a per-step cosine decay to 0 over the run; adadelta: "
                 "pytorch/examples' recipe (Adadelta, StepLR 0.7 per epoch)")
      ->check(CLI::IsMember({"adadelta", "adamw"}));
  app.add_option("--amp", amp, "mixed precision: none | fp16 | bf16 | autocast-fp16 | autocast-bf16")
      ->check(CLI::IsMember({"none", "fp32", "fp16", "bf16", "autocast-fp16", "autocast-bf16"}));
  app.add_option("--device", device_name, "cpu | cuda | cuda:N");
  app.add_option("--max-batches", max_batches, "stop each epoch after N batches (a quick run)")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  app.add_option("--max-test", max_test, "evaluate on the first N test images only")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  app.add_option("--seed", seed);
  app.add_option("--workers", workers, "data-loader threads (0: load in the training thread)")
      ->check(CLI::Range(int64_t{0}, int64_t{64}));
  app.add_option("--save", save_path, "write the trained weights (f32 safetensors) to this file");
  bool generated = false;
  app.add_flag("--generated", generated, "train on generated digits even when the real data is there");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; a usage error or a rejected value: 2, with the parser's message
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines appear as they happen, also when piped

  try {
    const Device device(device_name);
    const bool real = !generated && std::filesystem::exists(data_dir);
    EMBER_CHECK(real || generated || app.count("--data") == 0, ValueError, "--data ", data_dir, " does not exist");
    // Generated sets are as large as MNIST's, or as the run will use (--max-batches, --max-test).
    const int64_t gen_train = max_batches >= 0 ? std::min<int64_t>(60000, max_batches * batch_size) : 60000;
    const int64_t gen_test = max_test >= 0 ? std::min<int64_t>(10000, max_test) : 10000;
    const data::MnistData train_raw =
        real ? data::load_mnist(data_dir, true) : data::synthetic_mnist(std::max<int64_t>(gen_train, 1), seed);
    const data::MnistData test_raw =
        real ? data::load_mnist(data_dir, false) : data::synthetic_mnist(std::max<int64_t>(gen_test, 1), seed + 1);
    std::printf("mnist_cnn: %s data (%lld train, %lld test images) on %s, %lld loader worker(s)\n",
                real ? "real MNIST" : "generated digit", static_cast<long long>(train_raw.size()),
                static_cast<long long>(test_raw.size()), device.str().c_str(), static_cast<long long>(workers));
    data::DataLoaderOptions train_opts;
    train_opts.batch_size = batch_size;
    train_opts.shuffle = true;
    train_opts.seed = seed;
    train_opts.num_workers = workers;
    train_opts.device = device;
    data::DataLoader train_loader(mnist_samples(train_raw), train_opts);
    data::DataLoaderOptions test_opts = train_opts;
    test_opts.batch_size = 256;
    test_opts.shuffle = false;
    data::DataLoader test_loader(mnist_samples(test_raw), test_opts);

    manual_seed(seed);
    auto model = std::make_shared<nn::MnistNet>();
    model->to(device);
    const int64_t batches_per_epoch =
        max_batches >= 0 ? std::min(max_batches, train_loader.num_batches()) : train_loader.num_batches();
    std::unique_ptr<optim::LRScheduler> epoch_sched, step_sched;
    optim::OptimizerFactory make_optimizer;
    if (optimizer == "adadelta") {  // pytorch/examples: Adadelta(lr=1.0), StepLR(step_size=1, gamma=0.7)
      make_optimizer = [lr](std::vector<optim::ParamGroup> g) {
        return std::make_unique<optim::Adadelta>(std::move(g), optim::AdadeltaOptions{.lr = lr > 0 ? lr : 1.0});
      };
    } else {  // AdamW, warmup over the first 100 steps, cosine decay to 0 at the last step
      make_optimizer = [lr](std::vector<optim::ParamGroup> g) {
        return std::make_unique<optim::AdamW>(std::move(g),
                                              optim::AdamWOptions{.lr = lr > 0 ? lr : 3e-3, .weight_decay = 0.0});
      };
    }
    train::AmpTrainer trainer(*model, {optim::ParamGroup{model->parameters()}}, make_optimizer,
                              train::parse_amp_mode(amp));
    if (optimizer == "adadelta") {
      epoch_sched = std::make_unique<optim::StepLR>(trainer.optimizer(), 1, 0.7);
    } else {
      const int64_t total = epochs * batches_per_epoch;
      step_sched = std::make_unique<optim::CosineWarmupLR>(trainer.optimizer(), std::min<int64_t>(100, total / 10),
                                                           total, 0.0);
    }
    std::printf("model: %lld parameters (%s)\n", static_cast<long long>(model->num_parameters()),
                memory::format_bytes(model->parameter_bytes()).c_str());

    memory::Allocator& alloc = allocator_for(device);
    const auto t_start = std::chrono::steady_clock::now();
    for (int64_t epoch = 1; epoch <= epochs; ++epoch) {
      const auto t0 = std::chrono::steady_clock::now();
      double loss_sum = 0;
      int64_t batches = 0;
      train_loader.start_epoch();
      while (std::optional<data::Batch> batch = train_loader.next()) {
        if (max_batches >= 0 && batches >= max_batches) break;
        const Tensor& x = batch->data;
        const Tensor& y = batch->target;
        Tensor loss;
        {
          AutocastGuard region = trainer.autocast();
          loss = F::cross_entropy(model->forward(x), y);
        }
        trainer.backward(loss);
        trainer.step();
        trainer.zero_grad();
        if (step_sched) step_sched->step();
        loss_sum += loss.item_double();
        ++batches;
        if (batches % 200 == 0)
          std::printf("  epoch %lld  batch %5lld  loss %.4f\n", static_cast<long long>(epoch),
                      static_cast<long long>(batches), loss_sum / static_cast<double>(batches));
      }
      if (epoch_sched) epoch_sched->step();
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double acc = accuracy(*model, test_loader, max_test, trainer);
      std::printf("epoch %lld: train loss %.4f, test accuracy %.2f%%, %.1f s (%.1f ms/batch)\n",
                  static_cast<long long>(epoch), loss_sum / static_cast<double>(std::max<int64_t>(batches, 1)),
                  100.0 * acc, secs, 1000.0 * secs / static_cast<double>(std::max<int64_t>(batches, 1)));
    }
    const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    const memory::AllocatorStats s = alloc.stats();
    std::printf("total %.1f s; %s allocator: peak allocated %s, peak reserved %s\n", total, device.str().c_str(),
                memory::format_bytes(s.peak_allocated_bytes).c_str(),
                memory::format_bytes(s.peak_reserved_bytes).c_str());
    std::printf("precision %s: %s; %lld steps skipped, loss scale %g\n", train::amp_mode_name(trainer.mode()),
                trainer.memory().to_string().c_str(), static_cast<long long>(trainer.steps_skipped()),
                trainer.loss_scale());
    if (!save_path.empty()) {
      nn::NamedTensors state;
      for (const auto& [name, t] : model->state_dict()) state.emplace_back(name, t.to(Device::cpu(), DType::f32));
      nn::save_safetensors(save_path, state, {{"format", "pt"}});
      std::printf("saved the weights to %s\n", save_path.c_str());
    }
  } catch (const std::exception& e) {  // ember::Error and its typed subclasses, or a standard-library failure
    std::fprintf(stderr, "mnist_cnn: %s\n", e.what());
    return 1;
  }
  return 0;
}
