// The data pipeline's throughput and overlap. CPU: samples/s of the MNIST loader (ImageDataset + ToTensor +
// Normalize, batch 64, shuffled; and with RandomCrop(28, padding 4) + RandomHorizontalFlip augmentation) with 0, 1
// and 2 worker threads, plain and pinned collation, alone and beside a consumer that computes for a fixed time per
// batch (a training step's stand-in: workers overlap loading with it). GPU (when one is
// visible): the fraction of a training-like step the GPU waits for data, loading on demand without prefetch
// (0 workers, copies on demand) against workers + copies queued ahead on the copy stream.
// Usage: data_loader [--data DIR] [--batches N] [--reps R]; prints markdown tables and a JSON line. Without --data,
// ../shared/data/mnist, or generated digits when that is missing.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ember/data/dataloader.h"
#include "ember/data/image_dataset.h"
#include "ember/data/mnist.h"
#include "ember/data/transforms.h"
#include "ember/kernels/ops.h"
#include "ember/memory/cuda_device.h"

using namespace ember;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::shared_ptr<const data::Dataset> mnist_dataset(const std::string& dir, bool augment, std::string& source) {
  data::MnistData raw;
  if (std::filesystem::exists(dir)) {
    raw = data::load_mnist(dir, /*train=*/true);
    source = "MNIST train (" + dir + ")";
  } else {
    raw = data::synthetic_mnist(60000, 1);
    source = "generated digits (60000)";
  }
  auto images = std::make_shared<data::ImageDataset>(data::ImageDataset::from(raw));
  std::vector<data::Transform> steps;
  if (augment) {
    steps.push_back(data::RandomCrop(28, 28, 4));
    steps.push_back(data::RandomHorizontalFlip());
  }
  steps.push_back(data::ToTensor());
  steps.push_back(data::Normalize({data::kMnistMean}, {data::kMnistStd}));
  return std::make_shared<data::TransformDataset>(images, data::Compose(steps));
}

// Spins for `us` microseconds (the consumer's work per batch; a busy loop, so it occupies a core as compute does).
void busy_for(double us) {
  if (us <= 0) return;
  const auto t0 = Clock::now();
  while (std::chrono::duration<double, std::micro>(Clock::now() - t0).count() < us) {
  }
}

// Samples per second over `batches` batches (median of `reps` runs, a fresh epoch each).
double loader_rate(const std::shared_ptr<const data::Dataset>& ds, int64_t workers, bool pinned, int64_t batches,
                   int reps, double consumer_us = 0) {
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    data::DataLoaderOptions o;
    o.batch_size = 64;
    o.shuffle = true;
    o.seed = static_cast<uint64_t>(r);
    o.num_workers = workers;
    o.pin_memory = pinned;
    data::DataLoader loader(ds, o);
    const auto t0 = Clock::now();
    int64_t samples = 0;
    loader.start_epoch();
    for (int64_t b = 0; b < batches; ++b) {
      std::optional<data::Batch> batch = loader.next();
      if (!batch) break;
      samples += batch->size();
      busy_for(consumer_us);
    }
    rates.push_back(static_cast<double>(samples) / seconds_since(t0));
  }
  return median(rates);
}

// A stand-in for a step's GPU work: `launches` elementwise kernels over the batch.
Tensor gpu_work(const Tensor& x, int launches) {
  Tensor y = x;
  for (int i = 0; i < launches; ++i) y = ops::add(ops::mul(y, 0.999), 0.001);
  return y;
}

struct Overlap {
  double step_ms = 0, compute_ms = 0, wait_fraction = 0;
};

Overlap gpu_overlap(const std::shared_ptr<const data::Dataset>& ds, int64_t workers, int64_t ahead,
                    int64_t batches, int launches) {
  const Device dev = Device::cuda(0);
  data::DataLoaderOptions o;
  o.batch_size = 64;
  o.shuffle = true;
  o.num_workers = workers;
  o.device = dev;
  o.device_prefetch = ahead;
  data::DataLoader loader(ds, o);
  loader.start_epoch();
  Tensor resident = loader.next()->data;  // warm-up, and the batch the compute-only loop reuses
  memory::cuda::synchronize(0);
  const auto t0 = Clock::now();
  int64_t steps = 0;
  for (; steps < batches; ++steps) {
    std::optional<data::Batch> b = loader.next();
    if (!b) break;
    gpu_work(b->data, launches);
  }
  memory::cuda::synchronize(0);
  const double total = seconds_since(t0);
  const auto t1 = Clock::now();
  for (int64_t s = 0; s < steps; ++s) gpu_work(resident, launches);
  memory::cuda::synchronize(0);
  const double compute = seconds_since(t1);
  Overlap r;
  r.step_ms = 1e3 * total / static_cast<double>(steps);
  r.compute_ms = 1e3 * compute / static_cast<double>(steps);
  r.wait_fraction = std::max(0.0, 1.0 - compute / total);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "../shared/data/mnist";
  int64_t batches = 300;
  int reps = 3;
  bool data_given = false;
  const char* usage = "usage: data_loader [--data DIR] [--batches N] [--reps N]\n";
  // A whole number in [1, max]; 0 when the text is anything else.
  auto count = [](const char* text, long long max) -> long long {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(text, &end, 10);
    return end != text && *end == '\0' && errno == 0 && v >= 1 && v <= max ? v : 0;
  };
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::printf("%s", usage);
      return 0;
    }
    if (flag != "--data" && flag != "--batches" && flag != "--reps") {
      std::fprintf(stderr, "data_loader: unknown flag %s\n%s", flag.c_str(), usage);
      return 2;
    }
    if (i + 1 == argc) {
      std::fprintf(stderr, "data_loader: %s needs a value\n%s", flag.c_str(), usage);
      return 2;
    }
    if (flag == "--data") {
      dir = argv[i + 1];
      data_given = true;
    } else if (flag == "--batches" || flag == "--reps") {
      const long long v = count(argv[i + 1], flag == "--reps" ? 1000 : (1LL << 40));
      if (v == 0) {
        std::fprintf(stderr, "data_loader: %s takes a positive whole number, got '%s'\n", flag.c_str(), argv[i + 1]);
        return 2;
      }
      if (flag == "--batches") batches = v;
      else reps = static_cast<int>(v);
    }
  }
  // The default directory may be missing (generated digits then); a directory the user named must exist.
  if (data_given && !std::filesystem::exists(dir)) {
    std::fprintf(stderr, "data_loader: --data %s: no such directory\n", dir.c_str());
    return 2;
  }
  try {
    std::string source;
    const auto ds = mnist_dataset(dir, false, source);
    const auto augmented = mnist_dataset(dir, true, source);
    // The consumer's time per batch: as long as loading one augmented batch without workers takes, so that
    // overlapping the two could at best double the rate on two cores.
    const double load_us = 64.0 * 1e6 / loader_rate(augmented, 0, false, batches, reps);
    std::printf("MNIST loader, %s, batch 64, shuffled; %lld batches, median of %d runs\n", source.c_str(),
                static_cast<long long>(batches), reps);
    std::printf("plain = ToTensor + Normalize; augmented = RandomCrop(28, pad 4) + RandomHorizontalFlip + plain;\n"
                "consumer = the loop spends %.0f us per batch computing (one augmented batch's loading time)\n\n",
                load_us);
    std::printf("| workers | collation | plain samples/s | augmented samples/s | augmented + consumer samples/s |\n"
                "|---:|---|---:|---:|---:|\n");
    std::string json = "{\"consumer_us\":" + std::to_string(load_us) + ",\"cpu\":[";
    bool first = true;
    for (int64_t workers : {0, 1, 2}) {
      for (bool pinned : {false, true}) {
        const double plain = loader_rate(ds, workers, pinned, batches, reps);
        const double aug = loader_rate(augmented, workers, pinned, batches, reps);
        const double busy = loader_rate(augmented, workers, pinned, batches, reps, load_us);
        std::printf("| %lld | %s | %.0f | %.0f | %.0f |\n", static_cast<long long>(workers),
                    pinned ? "pinned" : "plain", plain, aug, busy);
        json += std::string(first ? "" : ",") + "{\"workers\":" + std::to_string(workers) + ",\"pinned\":" +
                (pinned ? "true" : "false") + ",\"samples_per_s\":" + std::to_string(plain) +
                ",\"augmented_samples_per_s\":" + std::to_string(aug) +
                ",\"with_consumer_samples_per_s\":" + std::to_string(busy) + "}";
        first = false;
      }
    }
    json += "]";
    if (memory::cuda::is_available()) {
      std::printf("\nGPU: step = 64 elementwise launches on the batch; wait = 1 - compute-only time / step time\n\n");
      std::printf("| loading | workers | copies ahead | step ms | compute ms | GPU waits |\n|---|---:|---:|---:|---:|---:|\n");
      json += ",\"gpu\":[";
      first = true;
      struct Setting { const char* name; int64_t workers, ahead; };
      for (const Setting s : {Setting{"on demand, no prefetch", 0, 0}, Setting{"prefetch", 2, 1},
                              Setting{"prefetch, deeper", 2, 3}}) {
        const Overlap r = gpu_overlap(ds, s.workers, s.ahead, batches, 64);
        std::printf("| %s | %lld | %lld | %.3f | %.3f | %.1f%% |\n", s.name, static_cast<long long>(s.workers),
                    static_cast<long long>(s.ahead), r.step_ms, r.compute_ms, 100.0 * r.wait_fraction);
        json += std::string(first ? "" : ",") + "{\"workers\":" + std::to_string(s.workers) + ",\"ahead\":" +
                std::to_string(s.ahead) + ",\"step_ms\":" + std::to_string(r.step_ms) +
                ",\"wait_fraction\":" + std::to_string(r.wait_fraction) + "}";
        first = false;
      }
      json += "]";
    } else {
      std::printf("\n(no GPU visible: the GPU overlap rows need a CUDA device)\n");
    }
    std::printf("%s}\n", json.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "data_loader: %s\n", e.what());
    return 1;
  }
  return 0;
}
