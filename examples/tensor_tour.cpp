// A tour of ember's tensor layer: views, broadcasting, the op set on every available device, mixed storage dtypes,
// reproducible Philox randomness, typed errors, autograd fitting a small MLP (with the memory its backward pass
// used) — ending with what the allocator saw (a memory report).
// Usage: tensor_tour [--device cpu|cuda|cuda:N]   (default: every available device)
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "ember/ember.h"

using namespace ember;

namespace {

void section(const char* title) { std::printf("\n== %s ==\n", title); }

void report_allocator(const char* label, const memory::Allocator& a) {
  const memory::AllocatorStats s = a.stats();
  std::printf("  %-22s allocated %-12s peak %-12s reserved %-12s allocs %-7lld frees %-7lld ooms %lld\n", label,
              memory::format_bytes(s.allocated_bytes).c_str(), memory::format_bytes(s.peak_allocated_bytes).c_str(),
              memory::format_bytes(s.reserved_bytes).c_str(), static_cast<long long>(s.num_allocs),
              static_cast<long long>(s.num_frees), static_cast<long long>(s.num_ooms));
}

// A small two-layer MLP forward pass with softmax, on `device`, in `dtype`.
void mlp_forward(Device device, DType dtype) {
  manual_seed(42);
  const int64_t batch = 64, in = 256, hidden = 512, out = 10;
  Tensor x = randn({batch, in}, {dtype, device});
  Tensor w1 = normal({hidden, in}, 0.0, 0.05, {dtype, device});
  Tensor b1 = zeros({hidden}, {dtype, device});
  Tensor w2 = normal({out, hidden}, 0.0, 0.05, {dtype, device});
  Tensor h = gelu(linear(x, w1, b1), GeluApprox::Tanh);
  h = layer_norm(h, {hidden});
  Tensor logits = linear(h, w2);
  Tensor probs = softmax(logits, -1);
  Tensor row_sums = sum(probs, {-1});
  Tensor pred = argmax(probs, -1);
  std::printf("  %-6s %-5s logits %s, softmax rows sum to [%.4f .. %.4f], first predictions %lld %lld %lld\n",
              device.str().c_str(), dtype_name(dtype), shape_str(logits.sizes()).c_str(),
              amin(row_sums).item_double(), amax(row_sums).item_double(),
              static_cast<long long>(pred.select(0, 0).item<int64_t>()),
              static_cast<long long>(pred.select(0, 1).item<int64_t>()),
              static_cast<long long>(pred.select(0, 2).item<int64_t>()));
}

void conv_forward(Device device) {
  manual_seed(7);
  Tensor img = rand({8, 1, 28, 28}, {DType::f32, device});
  Tensor w = normal({32, 1, 3, 3}, 0.0, 0.3, {DType::f32, device});
  Conv2dParams cp;
  cp.padding[0] = cp.padding[1] = 1;
  Tensor y = relu(conv2d(img, w, Tensor(), cp));
  Tensor p = max_pool2d(y, Pool2dParams{});
  Tensor d = dropout(p, 0.25);
  std::printf("  %-6s conv 3x3 %s -> %s, maxpool -> %s, dropout kept %.1f%%\n", device.str().c_str(),
              shape_str(img.sizes()).c_str(), shape_str(y.sizes()).c_str(), shape_str(p.sizes()).c_str(),
              100.0 * mean(ne(d, zeros_like(d)).to(DType::f32)).item_double() /
                  mean(ne(p, zeros_like(p)).to(DType::f32)).item_double());
}

// Fits a 2-layer MLP to labels drawn from a random "teacher" network with plain SGD: autograd computes the
// gradients; the allocator's statistics show what the forward kept for backward and what backward itself needed.
void autograd_fit(Device device) {
  manual_seed(3);
  const int64_t n = 512, in = 32, hidden = 128, classes = 8;
  const TensorOptions opts(DType::f32, device);
  Tensor x = randn({n, in}, opts);
  Tensor labels;
  {
    NoGradGuard no_grad;
    labels = argmax(matmul(tanh(matmul(x, randn({in, 16}, opts))), randn({16, classes}, opts)), 1);
  }
  const Tensor one_hot = eq(labels.unsqueeze(1), arange(0, classes, 1, TensorOptions(DType::i64, device)).unsqueeze(0))
                             .to(DType::f32);
  Tensor w1 = (randn({hidden, in}, opts) * (1.0 / std::sqrt(double(in)))).requires_grad_();
  Tensor b1 = zeros({hidden}, opts).requires_grad_();
  Tensor w2 = (randn({classes, hidden}, opts) * (1.0 / std::sqrt(double(hidden)))).requires_grad_();
  Tensor b2 = zeros({classes}, opts).requires_grad_();
  memory::Allocator& alloc = allocator_for(device);
  int64_t fwd_kept = 0, bwd_peak = 0;
  const double lr = 0.5;
  for (int step = 0; step <= 200; ++step) {
    const int64_t before = alloc.stats().allocated_bytes;
    Tensor logits = linear(relu(linear(x, w1, b1)), w2, b2);
    Tensor loss = -mean(sum(log_softmax(logits, -1) * one_hot, {-1}));
    const int64_t after_forward = alloc.stats().allocated_bytes;
    alloc.reset_peak_stats();
    loss.backward();
    if (step == 0) {
      fwd_kept = after_forward - before;
      bwd_peak = alloc.stats().peak_allocated_bytes - before;
    }
    {
      NoGradGuard no_grad;
      for (Tensor p : {w1, b1, w2, b2}) {
        p.copy_(p - p.grad() * lr);
        p.set_grad(Tensor());
      }
    }
    if (step % 50 == 0) {
      NoGradGuard no_grad;
      const double acc = mean(eq(argmax(logits, 1), labels).to(DType::f32)).item_double();
      std::printf("  %-6s step %3d  loss %.4f  train accuracy %5.1f%%\n", device.str().c_str(), step,
                  loss.item_double(), 100.0 * acc);
    }
  }
  std::printf("  forward kept %s for backward (saved activations + graph); backward peaked at %s above the\n"
              "  pre-step level, freeing each node's saved tensors as soon as it ran\n",
              memory::format_bytes(fwd_kept).c_str(), memory::format_bytes(bwd_peak).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Device> devices;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
      try {
        devices.push_back(Device(std::string(argv[++i])));
      } catch (const Error& e) {
        std::fprintf(stderr, "tensor_tour: %s\n", e.what());
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: tensor_tour [--device cpu|cuda|cuda:N]\n");
      return 2;
    }
  }
  const int gpus = memory::cuda::device_count();
  for (const Device& d : devices)
    if (d.is_cuda() && d.index >= gpus) {  // before the tour, not after the CPU part of it
      std::fprintf(stderr, "tensor_tour: %s is not available (%d CUDA device(s) visible)\n", d.str().c_str(), gpus);
      return 1;
    }
  if (devices.empty()) {
    devices.push_back(Device::cpu());
    for (int d = 0; d < gpus; ++d) devices.push_back(Device::cuda(d));
  }
  std::printf("ember tensor tour — %d CUDA device(s) visible%s\n", gpus,
              gpus == 0 ? " (running on CPU; CUDA code is built when nvcc is present)" : "");

  try {
    section("views share storage; contiguous() copies");
    Tensor a = arange(0, 12, 1, DType::f32).view({3, 4});
    Tensor at = a.t();
    std::printf("  a = arange(12).view(3,4); a.t() has strides %s, contiguous: %s\n", shape_str(at.strides()).c_str(),
                at.is_contiguous() ? "yes" : "no");
    Tensor col = a.select(1, 2);
    col.fill_(-1);
    std::cout << "  after a.select(1, 2).fill_(-1): " << a << "\n";
    Tensor b = a.slice(0, 0, 3, 2).unsqueeze(0).expand({2, 2, 4});
    std::printf("  slice/unsqueeze/expand -> %s with strides %s (no copy)\n", shape_str(b.sizes()).c_str(),
                shape_str(b.strides()).c_str());

    section("broadcasting and type promotion");
    Tensor x = tensor({1, 2, 3}).view({3, 1});
    Tensor y = tensor({10, 20}, DType::f16);
    Tensor z = x + y;
    std::cout << "  f32[3,1] + f16[2] = " << z << "\n";
    Tensor i = arange(5);
    std::cout << "  arange(5) / 2 (true division) = " << (i / Scalar(2)) << "\n";

    section("the op set on each device");
    for (const Device& dev : devices) {
      for (DType dt : {DType::f32, DType::bf16}) mlp_forward(dev, dt);
      conv_forward(dev);
    }

    section("autograd: fit a small MLP with SGD");
    for (const Device& dev : devices) {
      if (dev.is_cuda()) {
        std::printf("  %-6s skipped: the CUDA reduction/matmul/backward kernels come with the CUDA backend\n",
                    dev.str().c_str());
        continue;
      }
      autograd_fit(dev);
    }

    section("reproducible randomness (Philox)");
    manual_seed(123);
    Tensor r1 = rand({4});
    manual_seed(123);
    Tensor r2 = rand({4});
    std::cout << "  rand(4) twice from seed 123: " << r1 << " == " << r2 << "\n";

    section("typed errors");
    try {
      matmul(ones({2, 3}), ones({4, 5}));
    } catch (const ShapeError& e) {
      std::printf("  ShapeError: %s\n", e.what());
    }
    try {
      exp(arange(3));
    } catch (const DTypeError& e) {
      std::printf("  DTypeError: %s\n", e.what());
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "tensor_tour: %s\n", e.what());
    return 1;
  }

  section("memory report (every tensor byte came from these allocators)");
  report_allocator("cpu", memory::cpu_allocator());
  for (int d = 0; d < gpus; ++d) report_allocator(("cuda:" + std::to_string(d)).c_str(), memory::cuda::allocator(d));
  std::printf("\n%s", memory::cpu_allocator().memory_summary().c_str());
  return 0;
}
