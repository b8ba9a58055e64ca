// The attention path setting of attention.h: EMBER_ATTENTION read once, set_attention_strategy after it.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <string>

#include "ember/base/error.h"
#include "ember/kernels/cuda/attention.h"
#include "ember/kernels/cuda/attention_flash.h"

namespace ember::cuda {

namespace {

constexpr int kUnset = -1;
std::atomic<int> g_strategy{kUnset};

std::atomic<int64_t> g_flash_calls{0};

AttentionStrategy strategy_from_env() {
  const char* env = std::getenv("EMBER_ATTENTION");
  if (env == nullptr || *env == '\0') return AttentionStrategy::Flash;  // falls back to tiled where it does not apply
  return parse_attention_strategy(env, "EMBER_ATTENTION");
}

}  // namespace

AttentionStrategy parse_attention_strategy(const char* name, const char* what) {
  std::string v(name == nullptr ? "" : name);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (v == "tiled") return AttentionStrategy::Tiled;
  EMBER_CHECK(v == "flash", ConfigError, what, ": expected tiled or flash, got '", name == nullptr ? "" : name, "'");
  return AttentionStrategy::Flash;
}

int64_t flash_attention_calls() { return g_flash_calls.load(std::memory_order_relaxed); }

void count_flash_attention_call() { g_flash_calls.fetch_add(1, std::memory_order_relaxed); }

const char* attention_strategy_name(AttentionStrategy s) { return s == AttentionStrategy::Flash ? "flash" : "tiled"; }

AttentionStrategy attention_strategy() {
  int v = g_strategy.load(std::memory_order_acquire);
  if (v == kUnset) {
    int expected = kUnset;  // a concurrent set_attention_strategy wins over the environment
    g_strategy.compare_exchange_strong(expected, static_cast<int>(strategy_from_env()), std::memory_order_acq_rel);
    v = g_strategy.load(std::memory_order_acquire);
  }
  return static_cast<AttentionStrategy>(v);
}

void set_attention_strategy(AttentionStrategy s) { g_strategy.store(static_cast<int>(s), std::memory_order_release); }

bool flash_attention_supported(DType dtype, int64_t head_dim) {
  return is_reduced_float(dtype) && (head_dim == 32 || head_dim == 64);
}

}  // namespace ember::cuda
