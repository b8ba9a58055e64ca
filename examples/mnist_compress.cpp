// Compresses a trained MNIST CNN three ways and shows what each one really saves: 50% global magnitude pruning with a
// short masked fine-tune, then CSR storage for the Linear weights; 30% structured (L2) pruning that physically
// shrinks the layers, with a short fine-tune; int8 per-channel weights (fp32 activations, and dynamic int8
// activations for the Linears). For each: test accuracy, weight and state bytes (tensor bytes and the allocator's
// blocks under "MODEL/parameters"), and the allocator's peak during one inference batch (compression_report.h).
//   mnist_compress [--init model.safetensors] [--data DIR] [--epochs 2 | --base-batches N] [--finetune-batches 300]
//                  [--lr 3e-4]
//                  [--unstructured 0.5] [--structured 0.3] [--seed 1] [--max-test N] [--json FILE]
// Without --init the base model is trained first with mnist_cnn's default recipe (AdamW 3e-3, warmup, cosine).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>

#include "ember/data/dataloader.h"
#include "ember/data/image_dataset.h"
#include "ember/data/mnist.h"
#include "ember/data/transforms.h"
#include "ember/ember.h"
#include "ember/nn/compression_report.h"
#include "ember/nn/functional.h"
#include "ember/nn/models.h"
#include "ember/nn/prune.h"
#include "ember/nn/quantize.h"
#include "ember/nn/safetensors.h"
#include "ember/nn/sparse_linear.h"
#include "ember/nn/structured_prune.h"
#include "ember/optim/adam.h"
#include "ember/optim/lr_scheduler.h"

using namespace ember;
namespace F = ember::nn::functional;

namespace {

std::shared_ptr<const data::Dataset> mnist_samples(const data::MnistData& raw) {
  auto images = std::make_shared<data::ImageDataset>(data::ImageDataset::from(raw));
  return std::make_shared<data::TransformDataset>(
      images, data::Compose({data::ToTensor(), data::Normalize({data::kMnistMean}, {data::kMnistStd})}));
}

double accuracy(nn::Module& model, data::DataLoader& test, int64_t max_test) {
  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  int64_t correct = 0, seen = 0;
  test.start_epoch();
  while (std::optional<data::Batch> b = test.next()) {
    if (max_test >= 0 && seen >= max_test) break;
    const int64_t len = max_test >= 0 ? std::min(b->size(), max_test - seen) : b->size();
    const Tensor logits = model.forward(b->data.narrow(0, 0, len));
    correct += static_cast<int64_t>(
        sum(eq(argmax(logits, 1), b->target.narrow(0, 0, len)).to(DType::f64)).item_double());
    seen += len;
  }
  model.train(was_training);
  return static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(seen, 1));
}

// AdamW (no weight decay) over `batches` batches with a short warmup and a cosine decay to 0; `after_step` runs
// after every optimizer step. The optimizer is new, so its state starts at zero.
void train_batches(nn::Module& model, data::DataLoader& loader, int64_t batches, double lr, const char* what,
                   const std::function<void()>& after_step = {}) {
  optim::AdamW opt({optim::ParamGroup{model.parameters()}}, optim::AdamWOptions{.lr = lr, .weight_decay = 0.0});
  optim::CosineWarmupLR sched(opt, std::max<int64_t>(1, std::min<int64_t>(100, batches / 10)), batches, 0.0);
  model.train();
  const auto t0 = std::chrono::steady_clock::now();
  int64_t done = 0;
  double loss_sum = 0;
  while (done < batches) {
    loader.start_epoch();
    while (std::optional<data::Batch> b = loader.next()) {
      if (done >= batches) break;
      Tensor loss = F::cross_entropy(model.forward(b->data), b->target);
      loss.backward();
      opt.step();
      opt.zero_grad();
      sched.step();
      if (after_step) after_step();
      loss_sum += loss.item_double();
      ++done;
      if (done % 200 == 0)
        std::printf("  %s: batch %5lld  loss %.4f\n", what, static_cast<long long>(done),
                    loss_sum / static_cast<double>(done));
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("  %s: %lld batches in %.1f s, mean loss %.4f\n", what, static_cast<long long>(batches), secs,
              loss_sum / static_cast<double>(std::max<int64_t>(done, 1)));
}

}  // namespace

int main(int argc, char** argv) {
  std::string data_dir = "../shared/data/mnist", init_path, json_path;
  int64_t epochs = 2, base_batches = -1, finetune_batches = 300, max_test = -1;
  double lr = 3e-4, unstructured = 0.5, structured = 0.3;
  uint64_t seed = 1;
  CLI::App app{"Prune and quantize a trained MNIST CNN, and measure what it saves"};
  app.add_option("--init", init_path, "trained MnistNet weights (mnist_cnn --save); trained here when absent");
  app.add_option("--data", data_dir, "directory with the MNIST IDX files (raw or .gz)");
  app.add_option("--epochs", epochs, "epochs of base training when there is no --init")->check(CLI::PositiveNumber);
  app.add_option("--base-batches", base_batches, "train the base model for N batches instead of --epochs");
  app.add_option("--finetune-batches", finetune_batches, "fine-tuning batches after each pruning")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lr", lr, "peak fine-tuning learning rate (AdamW, cosine to 0)")->check(CLI::PositiveNumber);
  app.add_option("--unstructured", unstructured, "fraction of all conv/fc weights pruned by global magnitude")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--structured", structured, "fraction of the channels of conv1, conv2 and fc1 pruned")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", seed);
  app.add_option("--max-test", max_test, "evaluate on the first N test images only");
  app.add_option("--json", json_path, "write the rows as JSON to this file");
  bool generated = false;
  app.add_flag("--generated", generated, "use generated digits even when the real data is there");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; a usage error or a rejected value: 2, with the parser's message
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  try {
    const bool real = !generated && std::filesystem::exists(data_dir);
    EMBER_CHECK(real || generated || app.count("--data") == 0, ValueError, "--data ", data_dir, " does not exist");
    const data::MnistData train_raw = real ? data::load_mnist(data_dir, true) : data::synthetic_mnist(6000, seed);
    const data::MnistData test_raw = real ? data::load_mnist(data_dir, false) : data::synthetic_mnist(1000, seed + 1);
    std::printf("mnist_compress: %s data (%lld train, %lld test images)\n", real ? "real MNIST" : "generated digit",
                static_cast<long long>(train_raw.size()), static_cast<long long>(test_raw.size()));
    data::DataLoaderOptions train_opts;
    train_opts.batch_size = 64;
    train_opts.shuffle = true;
    train_opts.seed = seed;
    train_opts.num_workers = 1;
    data::DataLoader train_loader(mnist_samples(train_raw), train_opts);
    data::DataLoaderOptions test_opts = train_opts;
    test_opts.batch_size = 256;
    test_opts.shuffle = false;
    data::DataLoader test_loader(mnist_samples(test_raw), test_opts);
    test_loader.start_epoch();
    const Tensor probe = test_loader.next()->data.clone();  // the batch of 256 every inference peak is measured on

    manual_seed(seed);
    nn::NamedTensors base_state;
    if (!init_path.empty()) {
      base_state = nn::load_safetensors(init_path);
      std::printf("base: weights from %s\n", init_path.c_str());
    } else {
      auto base = std::make_shared<nn::MnistNet>();
      train_batches(*base, train_loader, base_batches >= 0 ? base_batches : epochs * train_loader.num_batches(), 3e-3,
                    "base training");
      for (const auto& [name, t] : base->state_dict()) base_state.emplace_back(name, t.clone());
    }
    auto fresh = [&] {
      auto m = std::make_shared<nn::MnistNet>();
      m->load_state_dict(base_state);
      return m;
    };

    std::vector<nn::CompressionRow> rows;
    auto add_row = [&](const std::string& name, nn::Module& model, double acc) {
      nn::CompressionRow row{name, nn::model_memory(model), nn::measure_inference(model, probe), acc};
      std::printf("%-40s accuracy %.2f%%, weights %s, state %s, inference peak %s\n", name.c_str(), 100.0 * acc,
                  memory::format_bytes(row.memory.weight_bytes).c_str(),
                  memory::format_bytes(row.memory.total_bytes).c_str(),
                  memory::format_bytes(row.inference.peak_bytes).c_str());
      rows.push_back(std::move(row));
    };

    {  // the dense baseline
      auto m = fresh();
      add_row("dense f32", *m, accuracy(*m, test_loader, max_test));
    }

    {  // unstructured: global magnitude pruning, masked fine-tune, then CSR for the Linears
      auto m = fresh();
      nn::global_unstructured({{m->conv1, "weight"}, {m->conv2, "weight"}, {m->fc1, "weight"}, {m->fc2, "weight"}},
                              nn::PruneAmount::fraction(unstructured));
      std::printf("unstructured %.0f%%: sparsity conv1 %.3f conv2 %.3f fc1 %.3f fc2 %.3f; accuracy before "
                  "fine-tuning %.2f%%\n",
                  100 * unstructured, nn::sparsity(m->conv1->weight), nn::sparsity(m->conv2->weight),
                  nn::sparsity(m->fc1->weight), nn::sparsity(m->fc2->weight),
                  100.0 * accuracy(*m, test_loader, max_test));
      if (finetune_batches > 0) train_batches(*m, train_loader, finetune_batches, lr, "masked fine-tune");
      const double acc = accuracy(*m, test_loader, max_test);
      add_row("unstructured, masks (dense storage)", *m, acc);
      nn::remove(*m->conv1, "weight");
      nn::remove(*m->conv2, "weight");
      nn::remove(*m->fc1, "weight");
      nn::remove(*m->fc2, "weight");
      const std::vector<std::string> packed = nn::sparsify_linears(*m, 0.0);
      const double acc_csr = accuracy(*m, test_loader, max_test);
      add_row("unstructured + CSR Linears", *m, acc_csr);
      std::printf("  CSR: %zu Linear layers packed; fc1 stored %s instead of %s dense\n", packed.size(),
                  memory::format_bytes(m->fc1->packed_weight->nbytes()).c_str(),
                  memory::format_bytes(int64_t{9216} * 128 * 4).c_str());
    }

    {  // structured: L2 over output channels of conv1, conv2, fc1; physically smaller; fine-tune
      auto m = fresh();
      const nn::StructuredPruneReport report =
          nn::ln_structured(nn::channel_groups(*m), nn::PruneAmount::fraction(structured), 2.0);
      std::printf("structured %.0f%%:\n%s  accuracy before fine-tuning %.2f%%\n", 100 * structured,
                  report.str().c_str(), 100.0 * accuracy(*m, test_loader, max_test));
      if (finetune_batches > 0) train_batches(*m, train_loader, finetune_batches, lr, "fine-tune");
      add_row("structured (smaller dense)", *m, accuracy(*m, test_loader, max_test));
    }

    {  // int8 weights, fp32 activations
      auto m = fresh();
      nn::quantize_model(*m, nn::ActivationQuant::None, /*convs=*/true);
      add_row("int8 weights", *m, accuracy(*m, test_loader, max_test));
    }
    {  // int8 weights, dynamic int8 activations for the Linears
      auto m = fresh();
      nn::quantize_model(*m, nn::ActivationQuant::Dynamic, /*convs=*/true);
      add_row("int8 weights + dynamic int8 activations", *m, accuracy(*m, test_loader, max_test));
    }

    std::printf("\n%s", nn::format_compression_table(rows).c_str());
    std::printf("(weights: Linear/Conv2d weights, dense or packed; state: every parameter and buffer; fwd peak: the "
                "allocator's peak above its level during one batch of %lld; infer = state + fwd peak; alloc: the "
                "caching allocator's blocks owned by MnistNet.../parameters)\n",
                static_cast<long long>(probe.size(0)));
    if (!json_path.empty()) {
      std::ofstream(json_path) << nn::compression_rows_json(rows) << "\n";
      std::printf("wrote %s\n", json_path.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mnist_compress: %s\n", e.what());
    return 1;
  }
  return 0;
}
