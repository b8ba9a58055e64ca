// Byte counts as people write them: format_bytes ("1.50 MiB") and parse_bytes ("6GiB", "1.5 GB", "4096").
// Invariant: parse_bytes returns a non-negative int64 byte count or throws ConfigError naming the setting and the text;
// unit suffixes are binary whatever their spelling (KB == KiB == 1024 B), as PyTorch's "_mb" settings are.
#include <cctype>
#include <cstdio>
#include <string>
#include <string_view>

#include "ember/base/error.h"
#include "ember/memory/allocator.h"

namespace ember::memory {

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while ((v >= 1024.0 || v <= -1024.0) && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

namespace {

constexpr const char* kAccepted =
    "a whole number of bytes, or a number with a unit B, KB/KiB, MB/MiB, GB/GiB, TB/TiB (binary: 1 KB = 1024 B), "
    "e.g. \"4096\", \"512MiB\", \"1.5 GB\"";

[[noreturn]] void fail(const char* what, const std::string& text, const char* why) {
  EMBER_THROW(ConfigError, what, ": cannot read \"", text, "\" as a byte size: ", why, "; expected ", kAccepted);
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// The multiplier of a unit suffix (case-insensitive), or 0 when the suffix is not a unit.
int64_t unit_multiplier(std::string_view unit) {
  std::string u;
  for (char c : unit) u += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (u.empty() || u == "b") return 1;
  static const char* const prefixes = "kmgt";
  for (int i = 0; i < 4; ++i) {
    const char p = prefixes[i];
    if (u == std::string{p, 'b'} || u == std::string{p, 'i', 'b'}) return int64_t{1} << (10 * (i + 1));
  }
  return 0;
}

}  // namespace

int64_t parse_bytes(const std::string& text, const char* what) {
  const std::string_view s = trim(text);
  if (s.empty()) fail(what, text, "it is empty");
  if (s.front() == '-') fail(what, text, "it is negative");

  // Number: digits [ '.' digits ], kept as exact integers (whole part, fraction numerator and 10^digits).
  size_t i = 0;
  unsigned __int128 whole = 0;
  bool any_digit = false;
  constexpr unsigned __int128 kMax = static_cast<unsigned __int128>(INT64_MAX);
  for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) {
    whole = whole * 10 + static_cast<unsigned>(s[i] - '0');
    if (whole > kMax) fail(what, text, "it does not fit in 64 bits");
    any_digit = true;
  }
  unsigned __int128 frac = 0, scale = 1;
  if (i < s.size() && s[i] == '.') {
    ++i;
    for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) {
      if (scale < static_cast<unsigned __int128>(1000000000000000000ULL)) {  // 18 digits are exact enough
        frac = frac * 10 + static_cast<unsigned>(s[i] - '0');
        scale *= 10;
      }
      any_digit = true;
    }
  }
  if (!any_digit) fail(what, text, "it does not start with a number");

  const std::string_view unit = trim(s.substr(i));
  const int64_t mult = unit_multiplier(unit);
  if (mult == 0) fail(what, text, "unknown unit");

  const unsigned __int128 m = static_cast<unsigned __int128>(mult);
  const unsigned __int128 whole_bytes = whole * m;  // whole <= 2^63 and m <= 2^40: no 128-bit overflow
  const unsigned __int128 frac_scaled = frac * m;
  if (mult == 1 && frac_scaled % scale != 0) fail(what, text, "a byte count must be a whole number");
  // Fractions of a larger unit are rounded to the nearest byte.
  const unsigned __int128 total = whole_bytes + (frac_scaled + scale / 2) / scale;
  if (total > kMax) fail(what, text, "it does not fit in 64 bits");
  return static_cast<int64_t>(total);
}

}  // namespace ember::memory
