// Parsing and printing of EMBER_ALLOC_CONF (PYTORCH_CUDA_ALLOC_CONF's "key:value,key:value" syntax plus `capacity`).
// Invariant: parse_alloc_config builds a fresh config and returns it only when every entry was valid (nothing is
// half-applied), and parse_alloc_config(c.str()) == c for every config it returns.
#include "ember/memory/alloc_config.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <set>
#include <string_view>
#include <system_error>

#include "ember/base/error.h"
#include "ember/memory/allocator.h"

namespace ember::memory {

// Note [roundup_power2_divisions intervals]
// Entry k of AllocatorConfig::roundup_power2_divisions covers request sizes in [2^(k-1), 2^k) MiB; entry 0 covers
// everything below 1 MiB and the last entry everything from 2^62 MiB up. A list key K (a power of two, in MiB) names
// the interval that ENDS at K, i.e. entry log2(K): "[256:1,512:2,1024:4,>:8]" gives 1 division to every size below
// 256 MiB (the first key also fills all smaller intervals), 2 to [256, 512) MiB, 4 to [512, 1024) MiB and 8 to
// everything from 1 GiB up. That is the behaviour PyTorch documents for this example; PyTorch's own table is one
// interval off from its documentation (its key 256 sets [256, 512) MiB). Intervals between two listed keys that
// are not listed keep 0 (no power-of-two rounding), and `>` fills every interval above the last key, as in PyTorch.

int64_t AllocatorConfig::divisions_for(int64_t size) const {
  if (roundup_power2_divisions.empty()) return 0;
  int64_t k = 0;
  if (size >= kMiB) k = static_cast<int64_t>(std::bit_width(static_cast<uint64_t>(size))) - 20;  // floor(log2)-19
  k = std::min<int64_t>(k, static_cast<int64_t>(roundup_power2_divisions.size()) - 1);
  return roundup_power2_divisions[static_cast<size_t>(k)];
}

namespace {

constexpr const char* kKeys =
    "max_split_size_mb, roundup_power2_divisions, garbage_collection_threshold, expandable_segments, capacity, "
    "per_process_memory_fraction, pinned_use_cuda_host_register, pinned_num_register_threads, backend";

// PyTorch keys that ember recognises but does not implement: a clearer message than "unknown key".
constexpr const char* kPyTorchOnlyKeys[] = {"max_non_split_rounding_mb",        "release_lock_on_cudamalloc",
                                            "release_lock_on_hipmalloc",        "pinned_use_hip_host_register",
                                            "pinned_use_background_threads",    "pinned_reserve_segment_size_mb",
                                            "graph_capture_record_stream_reuse"};

constexpr int64_t kMaxDivisions = int64_t{1} << 30;  // PyTorch reads divisions with stoi: 2^30 is its largest
constexpr int kMaxRegisterThreads = 128;

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

template <class... Parts>
std::string cat(const Parts&... parts) {
  return detail::concat(parts...);
}

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// Throws ConfigError for `key` in the config string `text`: "<why>; <key> accepts <accepted>".
[[noreturn]] void bad(const std::string& text, std::string_view key, const std::string& why,
                      const std::string& accepted) {
  EMBER_THROW(ConfigError, "allocator config \"", text, "\": ", key, ": ", why, "; ", key, " accepts ", accepted);
}

// A whole decimal number (optional surrounding spaces, no sign); false when it is not one or does not fit.
bool parse_int(std::string_view s, int64_t& out) {
  s = trim(s);
  if (s.empty() || !std::isdigit(static_cast<unsigned char>(s.front()))) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

bool parse_double(std::string_view s, double& out);

// Why a value is not accepted as a number: a negative number is named as such (every numeric key is >= 0).
std::string number_problem(std::string_view value, const char* expected) {
  const std::string_view t = trim(value);
  double magnitude = 0.0;
  if (t.size() > 1 && t.front() == '-' && parse_double(t.substr(1), magnitude))
    return cat("\"", value, "\" is negative");
  return cat("\"", value, "\" is not ", expected);
}

bool parse_double(std::string_view s, double& out) {
  s = trim(s);
  if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s.front())) || s.front() == '.')) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

bool parse_bool(std::string_view s, bool& out) {
  s = trim(s);
  if (s == "True" || s == "true") {
    out = true;
    return true;
  }
  if (s == "False" || s == "false") {
    out = false;
    return true;
  }
  return false;
}

std::string fmt_double(double v) {
  char buf[64];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, v);  // shortest form that reads back to the same double
  return std::string(buf, p);
}

std::string fmt_bytes_exact(int64_t v) {
  const char* units[] = {"TiB", "GiB", "MiB", "KiB"};
  for (int i = 0; i < 4; ++i) {
    const int64_t m = int64_t{1} << (10 * (4 - i));
    if (v % m == 0) return std::to_string(v / m) + units[i];
  }
  return std::to_string(v);
}

void parse_roundup(const std::string& text, std::string_view key, std::string_view value, AllocatorConfig& cfg) {
  const std::string accepted =
      "one power of two N (divisions for every size, e.g. roundup_power2_divisions:4) or a list "
      "[K:N,...,>:N] whose keys K are increasing powers of two in MiB (K:N applies to sizes below K MiB down to the "
      "previous key; '>' means every larger size, last) and whose N are 0 or powers of two (at most 2^30)";
  std::vector<int64_t>& div = cfg.roundup_power2_divisions;
  div.assign(AllocatorConfig::kRoundupIntervals, 0);
  if (value.front() != '[') {
    int64_t n = 0;
    if (!parse_int(value, n)) bad(text, key, number_problem(value, "a whole number"), accepted);
    if (!is_pow2(n) || n > kMaxDivisions) bad(text, key, cat(n, " is not a power of two up to 2^30"), accepted);
    std::fill(div.begin(), div.end(), n);
    return;
  }
  if (value.back() != ']') bad(text, key, "the list has no closing ']'", accepted);
  const std::string_view body = trim(value.substr(1, value.size() - 2));
  if (body.empty()) bad(text, key, "the list is empty", accepted);
  int64_t last_index = -1;  // entry of the previous key; -1 before the first
  bool saw_rest = false;
  size_t pos = 0;
  while (pos <= body.size()) {
    const size_t comma = std::min(body.find(',', pos), body.size());
    const std::string_view item = trim(body.substr(pos, comma - pos));
    pos = comma + 1;
    if (item.empty()) bad(text, key, "the list has an empty entry", accepted);
    if (saw_rest) bad(text, key, cat("\"", item, "\" follows '>', which must be the last entry"), accepted);
    const size_t colon = item.find(':');
    if (colon == std::string_view::npos) bad(text, key, cat("list entry \"", item, "\" has no ':'"), accepted);
    const std::string_view k = trim(item.substr(0, colon));
    const std::string_view v = trim(item.substr(colon + 1));
    int64_t n = 0;
    if (!parse_int(v, n)) bad(text, key, cat("\"", v, "\" in \"", item, "\" is not a whole number"), accepted);
    if (n != 0 && (!is_pow2(n) || n > kMaxDivisions))
      bad(text, key, cat(n, " in \"", item, "\" is neither 0 nor a power of two up to 2^30"), accepted);
    if (k == ">") {
      std::fill(div.begin() + (last_index + 1), div.end(), n);
      saw_rest = true;
      continue;
    }
    int64_t size_mb = 0;
    if (!parse_int(k, size_mb) || !is_pow2(size_mb))
      bad(text, key, cat("\"", k, "\" in \"", item, "\" is not a power-of-two size in MiB"), accepted);
    int64_t index = std::countr_zero(static_cast<uint64_t>(size_mb));  // log2
    index = std::min<int64_t>(index, AllocatorConfig::kRoundupIntervals - 1);
    if (index <= last_index) bad(text, key, cat("key ", k, " is not larger than the key before it"), accepted);
    if (last_index < 0) std::fill(div.begin(), div.begin() + index, n);  // the first key covers all smaller sizes
    div[static_cast<size_t>(index)] = n;
    last_index = index;
  }
}

// Splits at commas outside brackets.
std::vector<std::string_view> split_entries(std::string_view s) {
  std::vector<std::string_view> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || (s[i] == ',' && depth == 0)) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    } else if (s[i] == '[') {
      ++depth;
    } else if (s[i] == ']') {
      --depth;
    }
  }
  return out;
}

}  // namespace

AllocatorConfig ember_default_config() {
  AllocatorConfig c;
  c.expandable_segments = true;
  return c;
}

AllocatorConfig parse_alloc_config(const std::string& text, const AllocatorConfig& base) {
  AllocatorConfig cfg = base;
  if (trim(text).empty()) return cfg;
  std::vector<std::string_view> entries = split_entries(text);
  // A single trailing comma is tolerated, as PyTorch does.
  if (entries.size() > 1 && trim(entries.back()).empty()) entries.pop_back();
  std::set<std::string, std::less<>> seen;
  for (std::string_view raw : entries) {
    const std::string_view entry = trim(raw);
    if (entry.empty())
      EMBER_THROW(ConfigError, "allocator config \"", text,
                  "\": empty entry (entries are key:value separated by "
                  "commas); accepted keys: ",
                  kKeys);
    const size_t colon = entry.find(':');
    const std::string_view key = trim(entry.substr(0, std::min(colon, entry.size())));
    const std::string key_s(key);
    const bool known = key == "max_split_size_mb" || key == "roundup_power2_divisions" ||
                       key == "garbage_collection_threshold" || key == "expandable_segments" || key == "capacity" ||
                       key == "per_process_memory_fraction" || key == "pinned_use_cuda_host_register" ||
                       key == "pinned_num_register_threads" || key == "backend";
    if (!known) {
      for (const char* k : kPyTorchOnlyKeys)
        if (key == k)
          EMBER_THROW(ConfigError, "allocator config \"", text, "\": ", key,
                      " is a PyTorch setting that ember does not implement; accepted keys: ", kKeys);
      EMBER_THROW(ConfigError, "allocator config \"", text, "\": unknown key \"", key, "\"; accepted keys: ", kKeys);
    }
    if (colon == std::string_view::npos)
      EMBER_THROW(ConfigError, "allocator config \"", text, "\": ", key, " has no value (write ", key, ":value)");
    if (!seen.insert(key_s).second)
      EMBER_THROW(ConfigError, "allocator config \"", text, "\": ", key, " is given more than once");
    const std::string_view value = trim(entry.substr(colon + 1));
    const std::string value_s(value);
    if (value.empty())
      EMBER_THROW(ConfigError, "allocator config \"", text, "\": ", key, " has an empty value (write ", key, ":value)");

    if (key == "max_split_size_mb") {
      const std::string acc =
          "a whole number of MiB greater than 20 (the 20 MiB large-pool segment must stay "
          "splittable), e.g. max_split_size_mb:128";
      int64_t mb = 0;
      if (!parse_int(value, mb))
        bad(text, key, number_problem(value, "a whole number (that fits in 64 bits)"), acc);
      if (mb <= 20) bad(text, key, cat(mb, " is too small"), acc);
      cfg.max_split_size = mb > kNoLimit / kMiB ? kNoLimit : mb * kMiB;  // beyond int64: no limit, as PyTorch clamps
    } else if (key == "roundup_power2_divisions") {
      parse_roundup(text, key, value, cfg);
    } else if (key == "garbage_collection_threshold") {
      const std::string acc = "a fraction F with 0 < F < 1, e.g. garbage_collection_threshold:0.8";
      double f = 0;
      if (!parse_double(value, f)) bad(text, key, number_problem(value, "a number"), acc);
      if (!(f > 0.0 && f < 1.0)) bad(text, key, cat(value, " is out of range"), acc);
      cfg.garbage_collection_threshold = f;
    } else if (key == "expandable_segments") {
      if (!parse_bool(value, cfg.expandable_segments))
        bad(text, key, cat("\"", value, "\" is not a boolean"), "True or False (or true, false)");
    } else if (key == "capacity") {
      const std::string acc =
          "a positive byte size, e.g. capacity:6GiB, capacity:512MB (binary units), "
          "capacity:1073741824";
      int64_t bytes = 0;
      try {
        bytes = parse_bytes(value_s, "capacity");
      } catch (const ConfigError& e) {  // its message names capacity, the text and the accepted forms
        EMBER_THROW(ConfigError, "allocator config \"", text, "\": ", e.what());
      }
      if (bytes <= 0) bad(text, key, "the capacity must be positive", acc);
      cfg.capacity = bytes;
    } else if (key == "per_process_memory_fraction") {
      const std::string acc = "a fraction F with 0 < F <= 1, e.g. per_process_memory_fraction:0.5";
      double f = 0;
      if (!parse_double(value, f)) bad(text, key, number_problem(value, "a number"), acc);
      if (!(f > 0.0 && f <= 1.0)) bad(text, key, cat(value, " is out of range"), acc);
      cfg.memory_fraction = f;
    } else if (key == "pinned_use_cuda_host_register") {
      if (!parse_bool(value, cfg.pinned_use_host_register))
        bad(text, key, cat("\"", value, "\" is not a boolean"), "True or False (or true, false)");
    } else if (key == "pinned_num_register_threads") {
      const std::string acc = "a power of two from 1 to 128, e.g. pinned_num_register_threads:8";
      int64_t n = 0;
      if (!parse_int(value, n))
        bad(text, key, number_problem(value, "a whole number (that fits in 64 bits)"), acc);
      if (!is_pow2(n) || n > kMaxRegisterThreads) bad(text, key, cat(n, " is not allowed"), acc);
      cfg.pinned_num_register_threads = static_cast<int>(n);
    } else {  // backend
      if (value == "cudaMallocAsync")
        bad(text, key,
            "cudaMallocAsync (CUDA's stream-ordered allocator) is not provided by ember; its own caching allocator "
            "is the only backend",
            "native");
      if (value != "native") bad(text, key, cat("unknown backend \"", value, "\""), "native");
      cfg.backend = "native";
    }
  }
  return cfg;
}

std::string AllocatorConfig::str() const { return spelled(false); }

std::string AllocatorConfig::explicit_str() const { return spelled(true); }

std::string AllocatorConfig::spelled(bool explicit_expandable) const {
  const AllocatorConfig def;
  std::vector<std::string> parts;
  if (max_split_size != def.max_split_size) parts.push_back(cat("max_split_size_mb:", max_split_size / kMiB));
  if (roundup_power2_divisions != def.roundup_power2_divisions && !roundup_power2_divisions.empty()) {
    const std::vector<int64_t>& d = roundup_power2_divisions;
    const int64_t n = static_cast<int64_t>(d.size());
    if (std::all_of(d.begin(), d.end(), [&](int64_t v) { return v == d[0]; })) {
      parts.push_back(cat("roundup_power2_divisions:", d[0]));
    } else {
      // The first key covers the leading run of equal entries; '>' covers the trailing run; the middle entries
      // are listed one by one (zeros may be left out: unlisted intervals read back as 0).
      int64_t first = 0;
      while (first + 1 < n && d[first + 1] == d[0]) ++first;
      int64_t tail = n - 1;
      while (tail - 1 > first && d[tail - 1] == d[n - 1]) --tail;
      std::string list = cat("[", int64_t{1} << first, ":", d[first]);
      const bool rest = d[n - 1] != 0;
      for (int64_t k = first + 1; k < tail; ++k)  // '>' fills from the last listed key, so that one is kept
        if (d[k] != 0 || (rest && k == tail - 1)) list += cat(",", int64_t{1} << k, ":", d[k]);
      if (rest) list += cat(",>:", d[n - 1]);
      parts.push_back(cat("roundup_power2_divisions:", list, "]"));
    }
  }
  if (garbage_collection_threshold != def.garbage_collection_threshold)
    parts.push_back(cat("garbage_collection_threshold:", fmt_double(garbage_collection_threshold)));
  if (expandable_segments != def.expandable_segments || explicit_expandable)
    parts.push_back(std::string("expandable_segments:") + (expandable_segments ? "True" : "False"));
  if (capacity != def.capacity) parts.push_back(cat("capacity:", fmt_bytes_exact(capacity)));
  if (memory_fraction != def.memory_fraction)
    parts.push_back(cat("per_process_memory_fraction:", fmt_double(memory_fraction)));
  if (pinned_use_host_register != def.pinned_use_host_register)
    parts.push_back(std::string("pinned_use_cuda_host_register:") + (pinned_use_host_register ? "True" : "False"));
  if (pinned_num_register_threads != def.pinned_num_register_threads)
    parts.push_back(cat("pinned_num_register_threads:", pinned_num_register_threads));
  if (backend != def.backend) parts.push_back(cat("backend:", backend));
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? "," : "") + parts[i];
  return out;
}

AllocatorConfig alloc_config_from_env() {
  const char* env = std::getenv("EMBER_ALLOC_CONF");
  if (env == nullptr) return ember_default_config();
  try {
    return parse_alloc_config(env, ember_default_config());
  } catch (const ConfigError& e) {
    EMBER_THROW(ConfigError, "EMBER_ALLOC_CONF: ", e.what());
  }
}

}  // namespace ember::memory
