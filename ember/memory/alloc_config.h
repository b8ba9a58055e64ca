// Caching-allocator configuration: EMBER_ALLOC_CONF takes PYTORCH_CUDA_ALLOC_CONF's keys and syntax
// ("key:value,key:value"), plus ember's own `capacity`. Invariant: a parsed AllocatorConfig is always valid; any
// bad string raises ConfigError naming the key and the accepted values, and nothing is half-applied.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ember::memory {

inline constexpr int64_t kMiB = 1024 * 1024;
inline constexpr int64_t kNoLimit = INT64_MAX;

struct AllocatorConfig {
  // max_split_size_mb:N (N > 20). Cached blocks of at least this size are never split, and serve only requests
  // within kLargeBuffer (20 MiB) of their size. kNoLimit = off.
  int64_t max_split_size = kNoLimit;
  // roundup_power2_divisions:N or [256:1,512:2,1024:4,>:8]. Requests are rounded up to one of N equal steps between
  // two powers of two. Indexed by the power-of-two interval of the size in MiB: entry k covers sizes in
  // [2^(k-1), 2^k) MiB (entry 0: below 1 MiB); the last entry covers everything above. 0 or 1 = plain 512 B rounding.
  std::vector<int64_t> roundup_power2_divisions = std::vector<int64_t>(kRoundupIntervals, 0);
  static constexpr int kRoundupIntervals = 64;
  // garbage_collection_threshold:F (0 < F < 1). When reserved memory exceeds F × the allowed memory, cached
  // unsplit blocks are freed, least recently used first, before asking the backing for more. 0 = off.
  double garbage_collection_threshold = 0.0;
  // expandable_segments:True|False. Segments are virtual ranges that grow page by page instead of fixed blocks.
  bool expandable_segments = false;
  // capacity:SIZE (ember) — a cap on reserved memory below the device's own ("6GiB"); kNoLimit = the device's.
  int64_t capacity = kNoLimit;
  // per_process_memory_fraction:F (0 < F <= 1; ember also reads it from the string; PyTorch sets it by a call).
  double memory_fraction = 1.0;
  // pinned_use_cuda_host_register:True|False, pinned_num_register_threads:N (power of two, <= 128) — pinned pool.
  bool pinned_use_host_register = false;
  int pinned_num_register_threads = 1;
  // backend:native (the only backend; cudaMallocAsync is accepted by PyTorch but not provided here -> ConfigError).
  std::string backend = "native";

  // Divisions that apply to a request of `size` bytes (0 or 1 = no power-of-two rounding).
  int64_t divisions_for(int64_t size) const;

 private:
  std::string spelled(bool explicit_expandable) const;

 public:
  std::string str() const;  // the canonical "key:value,..." form of every setting that differs from PyTorch's defaults
  // str() with expandable_segments always spelled out — the one default ember and PyTorch do not share — so the
  // string means this configuration whether it is read over PyTorch's defaults (parse_alloc_config) or over ember's
  // (EMBER_ALLOC_CONF, `ember mem replay --conf`). What ember writes for a reader to paste back.
  std::string explicit_str() const;
};

// Parses `text` on top of `base` (keys not mentioned keep base's values). AllocatorConfig{} holds PyTorch's defaults.
AllocatorConfig parse_alloc_config(const std::string& text, const AllocatorConfig& base = AllocatorConfig{});
// ember's defaults for the process-wide allocators: PyTorch's, except expandable_segments:True (where the backing
// supports it), which keeps fragmentation of training-like traces low (bench/RESULTS.md, "Caching allocator").
AllocatorConfig ember_default_config();
// Parses EMBER_ALLOC_CONF from the environment on top of ember_default_config() (unset or empty: those defaults).
AllocatorConfig alloc_config_from_env();

}  // namespace ember::memory
