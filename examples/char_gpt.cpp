// Trains nanoGPT's character-level GPT on Tiny Shakespeare with nanoGPT's CPU configuration (4 layers, 4 heads,
// 128 wide, block 64, batch 12, AdamW lr 1e-3 with warmup and cosine decay to 1e-4, betas (0.9, 0.99), weight decay
// 0.1 on matrices, gradient clipping at 1.0, dropout 0, 2000 iterations), reporting train/val loss and a sample.
// Data: --data FILE; by default ../shared/data/tinyshakespeare/input.txt when it exists, else a generated text.
// --amp fp16|bf16 trains with f16/bf16 weights, fp32 master weights and autocast (loss-scaled for fp16);
// --amp autocast-fp16|autocast-bf16 keeps fp32 weights under autocast (train/amp.h).
//   char_gpt [--data FILE] [--iters 2000] [--eval-interval 250] [--eval-iters 20] [--device cpu|cuda]
//            [--amp none|fp16|bf16|autocast-fp16|autocast-bf16]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>

#include "ember/data/text_dataset.h"
#include "ember/ember.h"
#include "ember/nn/transformer.h"
#include "ember/optim/adam.h"
#include "ember/optim/clip_grad.h"
#include "ember/optim/lr_scheduler.h"
#include "ember/train/amp.h"

using namespace ember;

namespace {

// A stand-in corpus when Tiny Shakespeare is absent: repetitive verse the model can learn.
std::string generated_text() {
  const char* lines[] = {"First Citizen:\nBefore we proceed any further, hear me speak.\n\n",
                         "All:\nSpeak, speak.\n\n",
                         "First Citizen:\nYou are all resolved rather to die than to famish?\n\n",
                         "All:\nResolved. resolved.\n\n"};
  std::string s;
  for (int i = 0; i < 4000; ++i) s += lines[i % 4];
  return s;
}

// nanoGPT's estimate_loss: the mean loss of eval_iters random batches of a split, without recording.
double estimate_loss(nn::GPT& model, const data::CharDataset& ds, data::Split split, int64_t eval_iters,
                     int64_t batch, int64_t block, Generator& gen, Device device, const train::AmpTrainer& trainer) {
  NoGradGuard no_grad;
  AutocastGuard region = trainer.autocast();
  model.eval();
  double total = 0;
  for (int64_t i = 0; i < eval_iters; ++i) {
    const auto [x, y] = ds.get_batch(split, batch, block, gen, device);
    total += model.forward(x, y).loss.item_double();
  }
  model.train();
  return total / static_cast<double>(eval_iters);
}

}  // namespace

int main(int argc, char** argv) {
  std::string data_path = "../shared/data/tinyshakespeare/input.txt", device_name = "cpu", amp = "none";
  int64_t iters = 2000, eval_interval = 250, eval_iters = 20, batch = 12;
  uint64_t seed = 1337;
  const CLI::Range positive(int64_t{1}, std::numeric_limits<int64_t>::max());
  CLI::App app{"Train nanoGPT's character-level Shakespeare model with ember"};
  app.add_option("--data", data_path, "a UTF-8 text file");
  app.add_option("--iters", iters)->check(positive);
  app.add_option("--eval-interval", eval_interval)->check(positive);
  app.add_option("--eval-iters", eval_iters)->check(positive);
  app.add_option("--batch-size", batch)->check(positive);
  app.add_option("--device", device_name, "cpu | cuda | cuda:N");
  app.add_option("--amp", amp, "mixed precision: none | fp16 | bf16 | autocast-fp16 | autocast-bf16")
      ->check(CLI::IsMember({"none", "fp32", "fp16", "bf16", "autocast-fp16", "autocast-bf16"}));
  app.add_option("--seed", seed);
  int64_t sample = 300;
  app.add_option("--sample", sample, "characters to generate at the end (0: none)")
      ->check(CLI::Range(int64_t{0}, int64_t{100000}));
  bool generated = false;
  app.add_flag("--generated", generated, "train on a generated text even when the real data is there");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; a usage error or a rejected value: 2, with the parser's message
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines appear as they happen, also when piped

  try {
    const Device device(device_name);
    const bool real = !generated && std::filesystem::exists(data_path);
    EMBER_CHECK(real || generated || app.count("--data") == 0, ValueError, "--data ", data_path, " does not exist");
    const data::CharDataset ds = real ? data::CharDataset::from_file(data_path) : data::CharDataset(generated_text());
    nn::GPTConfig cfg;  // n_layer 4, n_head 4, n_embd 128, block 64, dropout 0, bias false
    cfg.vocab_size = ds.vocab_size();
    std::printf("char_gpt: %s (%lld characters, vocabulary %lld) on %s\n", real ? data_path.c_str() : "generated text",
                static_cast<long long>(ds.length()), static_cast<long long>(cfg.vocab_size), device.str().c_str());

    manual_seed(seed);
    auto model = std::make_shared<nn::GPT>(cfg);
    model->to(device);
    std::printf("model: %.2fM parameters\n", static_cast<double>(model->get_num_params()) / 1e6);

    // nanoGPT's configure_optimizers: weight decay on matrices (dim >= 2) only.
    std::vector<Tensor> decay, no_decay;
    for (const Tensor& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
    train::AmpTrainer trainer(
        *model, {{decay, {{"weight_decay", 0.1}}}, {no_decay, {{"weight_decay", 0.0}}}},
        [](std::vector<optim::ParamGroup> g) {
          return std::make_unique<optim::AdamW>(std::move(g), optim::AdamWOptions{.lr = 1e-3, .betas = {0.9, 0.99}});
        },
        train::parse_amp_mode(amp));
    const int64_t warmup = std::min<int64_t>(100, iters / 10);  // nanoGPT: 100 of 2000; shorter runs scale it
    optim::CosineWarmupLR sched(trainer.optimizer(), warmup, /*lr_decay_iters=*/iters, /*min_lr=*/1e-4);

    Generator train_gen(seed), eval_gen(seed + 1);
    memory::Allocator& alloc = allocator_for(device);
    const auto t0 = std::chrono::steady_clock::now();
    double val_loss = 0;
    for (int64_t it = 0; it <= iters; ++it) {
      if (it % eval_interval == 0 || it == iters) {
        const double tl =
            estimate_loss(*model, ds, data::Split::train, eval_iters, batch, cfg.block_size, eval_gen, device, trainer);
        val_loss =
            estimate_loss(*model, ds, data::Split::val, eval_iters, batch, cfg.block_size, eval_gen, device, trainer);
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("step %5lld: train loss %.4f, val loss %.4f  (%.0f s)\n", static_cast<long long>(it), tl, val_loss,
                    secs);
      }
      if (it == iters) break;
      const auto [x, y] = ds.get_batch(data::Split::train, batch, cfg.block_size, train_gen, device);
      Tensor loss;
      {
        AutocastGuard region = trainer.autocast();
        loss = model->forward(x, y).loss;
      }
      trainer.backward(loss);
      trainer.clip_grad_norm_(1.0);
      trainer.step();
      trainer.zero_grad();
      sched.step();
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const memory::AllocatorStats s = alloc.stats();
    std::printf("final val loss %.4f after %lld iterations, %.1f s (%.1f ms/iter); %s allocator: peak allocated %s, "
                "peak reserved %s\n",
                val_loss, static_cast<long long>(iters), secs, 1000.0 * secs / static_cast<double>(iters),
                device.str().c_str(), memory::format_bytes(s.peak_allocated_bytes).c_str(),
                memory::format_bytes(s.peak_reserved_bytes).c_str());
    std::printf("precision %s: %s; %lld steps skipped, loss scale %g\n", train::amp_mode_name(trainer.mode()),
                trainer.memory().to_string().c_str(), static_cast<long long>(trainer.steps_skipped()),
                trainer.loss_scale());
    if (sample > 0) {
      const Tensor start = zeros({1, 1}, TensorOptions(DType::i64, device));
      AutocastGuard region = trainer.autocast();
      std::printf("--- sample ---\n%s\n", ds.decode(model->generate(start, sample, 1.0, 200, seed)).c_str());
    }
  } catch (const std::exception& e) {  // ember::Error and its typed subclasses, or a standard-library failure
    std::fprintf(stderr, "char_gpt: %s\n", e.what());
    return 1;
  }
  return 0;
}
