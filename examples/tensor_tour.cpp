// A tour of ember's tensor layer: views, broadcasting, the op set on every available device, mixed storage dtypes,
// reproducible Philox randomness, typed errors — ending with what the allocator saw (a memory report).
// Usage: tensor_tour [--device cpu|cuda|cuda:N]   (default: every available device)
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
