// The standard training configs of `ember bench train` (ember/train/bench_train.cpp) in libtorch's C++ API, timed
// the same way and reported as the same JSON line: the peer of scripts/compare-cpu.
// Invariant: models, shapes, init, loss, optimizer and timed region are ember's — only the framework differs.
//
//   libtorch_train_bench --model mlp|cnn|gpt [--steps 20] [--warmup 3] [--threads 1] [--seed 0]
//                        [--attention explicit|sdpa] [--json]
//   libtorch_train_bench --show-config     (libtorch's build configuration: its BLAS, OpenMP, CPU capability)
//
// Note [What the peer copies]
// mlp: Linear 784-1024-1024-10 with ReLU between, batch 256 of randn inputs, labels in [0, 10). cnn: the MNIST Net
// without dropout (conv 1->32 3x3, ReLU, conv 32->64 3x3, ReLU, max-pool 2, fc 9216->128, ReLU, fc 128->10), batch
// 64 of randn 1x28x28. gpt: nanoGPT's char config (vocab 65, block 64, 4 layers, 4 heads, 128 wide, dropout 0, no
// biases in Linear or LayerNorm, tied lm_head, nanoGPT's init), batch 12 of random tokens. Loss: mean cross-entropy
// of the logits (gpt: flattened to [B*T, 65]). AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 1e-2 on
// every parameter. A timed step is: forward + loss, backward, optimizer step, gradients set to None, loss.item();
// `warmup` untimed steps first; median/min/max over the timed steps. The random draws are libtorch's, so losses
// match ember's in scale, not digit for digit.
//
// Note [Peer attention]
// libtorch 1.13 (Debian bookworm) has no public scaled_dot_product_attention (it appeared in 2.0); it has the
// private at::_scaled_dot_product_attention(q, k, v, mask, p, need_weights, is_causal), which on CPU runs the
// composite math path. --attention explicit (default) is nanoGPT's slow path (q k^T * 1/sqrt(hd), masked_fill of
// the causal mask with -inf, softmax, @ v); --attention sdpa calls the private op with is_causal = true.
#include <dlfcn.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace {

struct Options {
  std::string model = "mlp";
  int64_t steps = 20, warmup = 3;
  int threads = 1;
  uint64_t seed = 0;
  std::string attention = "explicit";
  bool json = false;
  bool show_config = false;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "libtorch_train_bench: %s\nusage: libtorch_train_bench --model mlp|cnn|gpt [--steps N] [--warmup W] "
               "[--threads T] [--seed S] [--attention explicit|sdpa] [--json] | --show-config\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    auto integer = [&](int64_t lo) {
      const std::string v = value();
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < lo) usage(("bad value for " + a + ": " + v).c_str());
      return static_cast<int64_t>(n);
    };
    if (a == "--model") o.model = value();
    else if (a == "--steps") o.steps = integer(1);
    else if (a == "--warmup") o.warmup = integer(0);
    else if (a == "--threads") o.threads = static_cast<int>(integer(1));
    else if (a == "--seed") o.seed = static_cast<uint64_t>(integer(0));
    else if (a == "--attention") o.attention = value();
    else if (a == "--json") o.json = true;
    else if (a == "--show-config") o.show_config = true;
    else usage(("unknown argument " + a).c_str());
  }
  if (o.model != "mlp" && o.model != "cnn" && o.model != "gpt") usage("--model must be mlp, cnn or gpt");
  if (o.attention != "explicit" && o.attention != "sdpa") usage("--attention must be explicit or sdpa");
  return o;
}

// ---- models -----------------------------------------------------------------------------------------------------

struct MnistNetImpl : torch::nn::Module {
  MnistNetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).stride(1)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).stride(1)))),
        fc1(register_module("fc1", torch::nn::Linear(9216, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(conv1->forward(x));
    x = torch::relu(conv2->forward(x));
    x = torch::max_pool2d(x, 2);
    x = torch::relu(fc1->forward(torch::flatten(x, 1)));
    return fc2->forward(x);
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(MnistNet);

struct GPTConfig {
  int64_t vocab_size = 65, block_size = 64, n_layer = 4, n_head = 4, n_embd = 128;
};

// nanoGPT's LayerNorm with bias=False: a weight, no bias.
struct LayerNormNoBiasImpl : torch::nn::Module {
  explicit LayerNormNoBiasImpl(int64_t n) : n(n) { weight = register_parameter("weight", torch::ones({n})); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::layer_norm(x, {n}, weight, {}, 1e-5); }
  int64_t n;
  torch::Tensor weight;
};
TORCH_MODULE(LayerNormNoBias);

torch::nn::Linear linear_no_bias(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

struct CausalSelfAttentionImpl : torch::nn::Module {
  CausalSelfAttentionImpl(const GPTConfig& c, bool sdpa)
      : c_attn(register_module("c_attn", linear_no_bias(c.n_embd, 3 * c.n_embd))),
        c_proj(register_module("c_proj", linear_no_bias(c.n_embd, c.n_embd))),
        n_head(c.n_head),
        n_embd(c.n_embd),
        sdpa(sdpa) {
    // nanoGPT's `bias` buffer: the lower-triangular causal mask, [1, 1, block, block].
    mask = register_buffer("bias", torch::tril(torch::ones({c.block_size, c.block_size}))
                                       .view({1, 1, c.block_size, c.block_size}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = n_embd, hd = C / n_head;
    const std::vector<torch::Tensor> qkv = c_attn->forward(x).split(C, 2);
    auto heads = [&](const torch::Tensor& t) { return t.view({B, T, n_head, hd}).transpose(1, 2); };
    const torch::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
    torch::Tensor y;
    if (sdpa) {
      y = std::get<0>(at::_scaled_dot_product_attention(q, k, v, {}, 0.0, false, /*is_causal=*/true));
    } else {
      torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(hd)));
      att = att.masked_fill(mask.narrow(2, 0, T).narrow(3, 0, T) == 0, -std::numeric_limits<float>::infinity());
      att = torch::softmax(att, -1);
      y = torch::matmul(att, v);
    }
    y = y.transpose(1, 2).contiguous().view({B, T, C});
    return c_proj->forward(y);
  }
  torch::nn::Linear c_attn, c_proj;
  torch::Tensor mask;
  int64_t n_head, n_embd;
  bool sdpa;
};
TORCH_MODULE(CausalSelfAttention);

struct MLPImpl : torch::nn::Module {
  explicit MLPImpl(const GPTConfig& c)
      : c_fc(register_module("c_fc", linear_no_bias(c.n_embd, 4 * c.n_embd))),
        c_proj(register_module("c_proj", linear_no_bias(4 * c.n_embd, c.n_embd))) {}
  torch::Tensor forward(const torch::Tensor& x) { return c_proj->forward(torch::gelu(c_fc->forward(x))); }
  torch::nn::Linear c_fc, c_proj;
};
TORCH_MODULE(MLP);

struct BlockImpl : torch::nn::Module {
  BlockImpl(const GPTConfig& c, bool sdpa)
      : ln_1(register_module("ln_1", LayerNormNoBias(c.n_embd))),
        attn(register_module("attn", CausalSelfAttention(c, sdpa))),
        ln_2(register_module("ln_2", LayerNormNoBias(c.n_embd))),
        mlp(register_module("mlp", MLP(c))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor h = x + attn->forward(ln_1->forward(x));
    return h + mlp->forward(ln_2->forward(h));
  }
  LayerNormNoBias ln_1;
  CausalSelfAttention attn;
  LayerNormNoBias ln_2;
  MLP mlp;
};
TORCH_MODULE(Block);

struct GPTImpl : torch::nn::Module {
  GPTImpl(const GPTConfig& c, bool sdpa)
      : wte(register_module("wte", torch::nn::Embedding(c.vocab_size, c.n_embd))),
        wpe(register_module("wpe", torch::nn::Embedding(c.block_size, c.n_embd))),
        h(register_module("h", torch::nn::ModuleList())),
        ln_f(register_module("ln_f", LayerNormNoBias(c.n_embd))) {
    for (int64_t i = 0; i < c.n_layer; ++i) h->push_back(Block(c, sdpa));
    // nanoGPT's init: N(0, 0.02) for Linear and Embedding weights, N(0, 0.02/sqrt(2 n_layer)) for every c_proj.
    torch::NoGradGuard no_grad;
    for (auto& p : named_parameters()) {
      const std::string& name = p.key();
      if (p.value().dim() != 2) continue;  // LayerNorm weights stay 1
      const bool proj = name.size() >= 13 && name.compare(name.size() - 13, 13, "c_proj.weight") == 0;
      p.value().normal_(0.0, proj ? 0.02 / std::sqrt(2.0 * double(c.n_layer)) : 0.02);
    }
  }
  torch::Tensor forward(const torch::Tensor& idx) {
    const int64_t T = idx.size(1);
    const torch::Tensor pos = torch::arange(T, torch::TensorOptions().dtype(torch::kLong));
    torch::Tensor x = wte->forward(idx) + wpe->forward(pos);
    for (const auto& block : *h) x = block->as<Block>()->forward(x);
    x = ln_f->forward(x);
    return torch::nn::functional::linear(x, wte->weight);  // lm_head tied to wte (one parameter)
  }
  torch::nn::Embedding wte, wpe;
  torch::nn::ModuleList h;
  LayerNormNoBias ln_f;
};
TORCH_MODULE(GPT);

// ---- the task -----------------------------------------------------------------------------------------------------

struct Task {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  torch::Tensor inputs, targets;
  int64_t batch = 0;
};

Task make_task(const Options& o) {
  torch::manual_seed(o.seed);
  Task t;
  if (o.model == "mlp") {
    t.batch = 256;
    torch::nn::Sequential net(torch::nn::Linear(784, 1024), torch::nn::ReLU(), torch::nn::Linear(1024, 1024),
                              torch::nn::ReLU(), torch::nn::Linear(1024, 10));
    t.module = net.ptr();
    t.forward = [net](const torch::Tensor& x) mutable { return net->forward(x); };
    t.inputs = torch::randn({t.batch, 784});
    t.targets = torch::randint(0, 10, {t.batch}, torch::kLong);
  } else if (o.model == "cnn") {
    t.batch = 64;
    MnistNet net;
    t.module = net.ptr();
    t.forward = [net](const torch::Tensor& x) mutable { return net->forward(x); };
    t.inputs = torch::randn({t.batch, 1, 28, 28});
    t.targets = torch::randint(0, 10, {t.batch}, torch::kLong);
  } else {
    t.batch = 12;
    const GPTConfig c;
    GPT net(c, o.attention == "sdpa");
    t.module = net.ptr();
    t.forward = [net](const torch::Tensor& x) mutable { return net->forward(x); };
    t.inputs = torch::randint(0, c.vocab_size, {t.batch, c.block_size}, torch::kLong);
    t.targets = torch::randint(0, c.vocab_size, {t.batch, c.block_size}, torch::kLong);
  }
  return t;
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

// The BLAS libtorch's sgemm calls resolve to, and OpenBLAS's thread count (OpenBLAS reads OPENBLAS_NUM_THREADS /
// OMP_NUM_THREADS at load; at::set_num_threads sets OpenMP's only, so it is set here too).
std::string blas_library(int threads) {
  if (auto set = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(threads);
  void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  Dl_info info{};
  if (sgemm && dladdr(sgemm, &info) && info.dli_fname) {
    char* real = realpath(info.dli_fname, nullptr);  // through Debian's libblas.so.3 alternative
    const std::string path = real ? real : info.dli_fname;
    std::free(real);
    return path;
  }
  return "unknown";
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.show_config) {
    std::printf("%s\nsgemm_ from: %s\n", at::show_config().c_str(), blas_library(o.threads).c_str());
    return 0;
  }
  torch::set_num_threads(o.threads);
  torch::set_num_interop_threads(1);
  const std::string blas = blas_library(o.threads);

  Task t = make_task(o);
  std::vector<torch::Tensor> params = t.module->parameters();
  int64_t parameters = 0;
  for (const auto& p : params) parameters += p.numel();
  torch::optim::AdamW opt(params,
                          torch::optim::AdamWOptions(1e-3).betas({0.9, 0.999}).eps(1e-8).weight_decay(1e-2));
  t.module->train();

  std::vector<double> ms;
  double first_loss = 0, last_loss = 0;
  for (int64_t i = 0; i < o.warmup + o.steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const torch::Tensor logits = t.forward(t.inputs);
    const torch::Tensor loss =
        torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), t.targets.reshape({-1}));
    loss.backward();
    opt.step();
    for (auto& p : params) p.mutable_grad() = torch::Tensor();  // zero_grad(set_to_none=True); 1.13 zeroes instead
    const double value = loss.item<double>();
    const auto t1 = std::chrono::steady_clock::now();
    if (i == 0) first_loss = value;
    last_loss = value;
    if (i >= o.warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  const double median = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  const double rss = peak_rss_mib();

  if (o.json) {
    std::printf(
        "{\"model\":%s,\"device\":\"cpu\",\"steps\":%lld,\"batch\":%lld,\"parameters\":%lld,"
        "\"ms_per_step_median\":%.6g,\"ms_per_step_min\":%.6g,\"ms_per_step_max\":%.6g,\"peak_rss_mib\":%.6g,"
        "\"peak_allocated_bytes\":-1,\"peak_reserved_bytes\":-1,\"first_loss\":%.9g,\"last_loss\":%.9g,"
        "\"amp\":\"none\",\"checkpoint\":\"none\",\"peer\":\"libtorch\",\"torch_version\":%s,\"threads\":%d,"
        "\"attention\":%s,\"blas\":%s}\n",
        json_string(o.model).c_str(), static_cast<long long>(o.steps), static_cast<long long>(t.batch),
        static_cast<long long>(parameters), median, ms.front(), ms.back(), rss, first_loss, last_loss,
        json_string(TORCH_VERSION).c_str(), o.threads, json_string(o.attention).c_str(), json_string(blas).c_str());
  } else {
    std::printf("libtorch %s %s: %lld params, batch %lld, %d thread(s), %.3f ms/step median (min %.3f, max %.3f), "
                "peak RSS %.1f MiB, loss %.4f -> %.4f, BLAS %s\n",
                TORCH_VERSION, o.model.c_str(), static_cast<long long>(parameters), static_cast<long long>(t.batch),
                o.threads, median, ms.front(), ms.back(), rss, first_loss, last_loss, blas.c_str());
  }
  return 0;
}
