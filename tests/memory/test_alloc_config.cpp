// Allocator configuration: parse_bytes, every EMBER_ALLOC_CONF key (valid and invalid values), the
// roundup_power2_divisions list syntax against hand-computed interval tables, str() round trips, and the environment.
// Expected values are written out by hand (sizes in MiB, interval tables), never taken from the code under test.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "ember/base/error.h"
#include "ember/memory/alloc_config.h"
#include "ember/memory/allocator.h"
#include "tests/harness/op_harness.h"

using ember::ConfigError;
using namespace ember::memory;

namespace {

constexpr int64_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB, TiB = 1024 * GiB;

// Runs fn, expects a ConfigError whose message contains every one of `parts`.
template <class Fn>
void expect_config_error(Fn fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

void expect_bad_conf(const std::string& text, std::initializer_list<std::string> parts) {
  SCOPED_TRACE(text);
  expect_config_error([&] { parse_alloc_config(text); }, parts);
}

void expect_same(const AllocatorConfig& a, const AllocatorConfig& b) {
  EXPECT_EQ(a.max_split_size, b.max_split_size);
  EXPECT_EQ(a.roundup_power2_divisions, b.roundup_power2_divisions);
  EXPECT_EQ(a.garbage_collection_threshold, b.garbage_collection_threshold);
  EXPECT_EQ(a.expandable_segments, b.expandable_segments);
  EXPECT_EQ(a.capacity, b.capacity);
  EXPECT_EQ(a.memory_fraction, b.memory_fraction);
  EXPECT_EQ(a.pinned_use_host_register, b.pinned_use_host_register);
  EXPECT_EQ(a.pinned_num_register_threads, b.pinned_num_register_threads);
  EXPECT_EQ(a.backend, b.backend);
}

// A divisions table from (first entry, last entry, value) runs, the rest 0.
std::vector<int64_t> table(std::initializer_list<std::tuple<int, int, int64_t>> runs) {
  std::vector<int64_t> t(AllocatorConfig::kRoundupIntervals, 0);
  for (auto [lo, hi, v] : runs)
    for (int k = lo; k <= hi; ++k) t[k] = v;
  return t;
}

// Restores an environment variable when it goes out of scope.
class EnvGuard {
 public:
  explicit EnvGuard(const char* name) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
  }
  ~EnvGuard() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

// ---- parse_bytes ----------------------------------------------------------------------------------------------

TEST(ParseBytes, PlainIntegersAreBytes) {
  EXPECT_EQ(parse_bytes("0", "x"), 0);
  EXPECT_EQ(parse_bytes("1", "x"), 1);
  EXPECT_EQ(parse_bytes("4096", "x"), 4096);
  EXPECT_EQ(parse_bytes("  123 ", "x"), 123);
  EXPECT_EQ(parse_bytes("9223372036854775807", "x"), INT64_MAX);
  EXPECT_EQ(parse_bytes("100.0", "x"), 100);
}

TEST(ParseBytes, UnitsAreBinaryAndCaseInsensitive) {
  EXPECT_EQ(parse_bytes("7B", "x"), 7);
  EXPECT_EQ(parse_bytes("7b", "x"), 7);
  EXPECT_EQ(parse_bytes("1KB", "x"), 1024);
  EXPECT_EQ(parse_bytes("1KiB", "x"), 1024);
  EXPECT_EQ(parse_bytes("1kib", "x"), 1024);
  EXPECT_EQ(parse_bytes("512MiB", "x"), 512 * MiB);
  EXPECT_EQ(parse_bytes("512MB", "x"), 512 * MiB);
  EXPECT_EQ(parse_bytes("512mb", "x"), 512 * MiB);
  EXPECT_EQ(parse_bytes("6GiB", "x"), 6 * GiB);
  EXPECT_EQ(parse_bytes("6 GB", "x"), 6 * GiB);
  EXPECT_EQ(parse_bytes("6gB", "x"), 6 * GiB);
  EXPECT_EQ(parse_bytes("2TiB", "x"), 2 * TiB);
  EXPECT_EQ(parse_bytes("2 tb", "x"), 2 * TiB);
  EXPECT_EQ(parse_bytes("8388607TiB", "x"), 8388607 * TiB);  // the largest whole TiB count in int64
}

TEST(ParseBytes, DecimalsRoundToTheNearestByte) {
  EXPECT_EQ(parse_bytes("1.5 GB", "x"), 3 * GiB / 2);
  EXPECT_EQ(parse_bytes("1.5GiB", "x"), 1610612736);
  EXPECT_EQ(parse_bytes("0.5KiB", "x"), 512);
  EXPECT_EQ(parse_bytes(".25 MiB", "x"), 262144);
  EXPECT_EQ(parse_bytes("0.1KiB", "x"), 102);   // 102.4
  EXPECT_EQ(parse_bytes("0.3KiB", "x"), 307);   // 307.2
  EXPECT_EQ(parse_bytes("0.75KiB", "x"), 768);  // exact
  EXPECT_EQ(parse_bytes("1.0009765625KiB", "x"), 1025);
  EXPECT_EQ(parse_bytes("2.", "x"), 2);
}

TEST(ParseBytes, ErrorsNameTheSettingAndTheText) {
  const char* bad[] = {"",
                       "   ",
                       "-1",
                       "-1GiB",
                       "abc",
                       "GiB",
                       "1.5",
                       "1.5B",
                       "12 XB",
                       "1e9",
                       "1 2",
                       "1GiBs",
                       "0x10",
                       "+5",
                       "1..5",
                       "5 G B",
                       ".",
                       "1,5GiB",
                       "NaN",
                       "inf",
                       "9223372036854775808",
                       "99999999999999999999",
                       "8388608TiB",
                       "9007199254740992 KiB"};
  for (const char* text : bad) {
    SCOPED_TRACE(text);
    expect_config_error([&] { parse_bytes(text, "my_setting"); }, {"my_setting", std::string("\"") + text + "\""});
  }
  expect_config_error([] { parse_bytes("-3", "cap"); }, {"negative"});
  expect_config_error([] { parse_bytes("", "cap"); }, {"empty"});
  expect_config_error([] { parse_bytes("99999999999999999999", "cap"); }, {"64 bits"});
  expect_config_error([] { parse_bytes("12 XB", "cap"); }, {"unit"});
}

// ---- parse_alloc_config: keys -----------------------------------------------------------------------------------

TEST(AllocConfig, DefaultsAndEmptyString) {
  const AllocatorConfig d;
  EXPECT_EQ(d.max_split_size, kNoLimit);
  EXPECT_EQ(d.roundup_power2_divisions, std::vector<int64_t>(64, 0));
  EXPECT_EQ(d.garbage_collection_threshold, 0.0);
  EXPECT_FALSE(d.expandable_segments);
  EXPECT_EQ(d.capacity, kNoLimit);
  EXPECT_EQ(d.memory_fraction, 1.0);
  EXPECT_FALSE(d.pinned_use_host_register);
  EXPECT_EQ(d.pinned_num_register_threads, 1);
  EXPECT_EQ(d.backend, "native");
  EXPECT_EQ(d.str(), "");
  expect_same(parse_alloc_config(""), d);
  expect_same(parse_alloc_config("   "), d);
  for (int64_t s : {int64_t{0}, int64_t{1}, MiB, GiB, TiB}) EXPECT_EQ(d.divisions_for(s), 0);
}

TEST(AllocConfig, MaxSplitSize) {
  EXPECT_EQ(parse_alloc_config("max_split_size_mb:21").max_split_size, 21 * MiB);
  EXPECT_EQ(parse_alloc_config("max_split_size_mb:128").max_split_size, 128 * MiB);
  EXPECT_EQ(parse_alloc_config(" max_split_size_mb : 512 ").max_split_size, 512 * MiB);
  EXPECT_EQ(parse_alloc_config("max_split_size_mb:100000").max_split_size, 100000 * MiB);
  // More MiB than int64 bytes can hold: no limit (PyTorch clamps the same way).
  EXPECT_EQ(parse_alloc_config("max_split_size_mb:99999999999999999").max_split_size, kNoLimit);
  for (const char* v : {"20", "0", "1", "-128", "abc", "128.5", "128MB", "1e3", "99999999999999999999"})
    expect_bad_conf(std::string("max_split_size_mb:") + v, {"max_split_size_mb", "greater than 20"});
}

TEST(AllocConfig, GarbageCollectionThreshold) {
  EXPECT_EQ(parse_alloc_config("garbage_collection_threshold:0.8").garbage_collection_threshold, 0.8);
  EXPECT_EQ(parse_alloc_config("garbage_collection_threshold:0.001").garbage_collection_threshold, 0.001);
  EXPECT_EQ(parse_alloc_config("garbage_collection_threshold:.5").garbage_collection_threshold, 0.5);
  EXPECT_EQ(parse_alloc_config("garbage_collection_threshold:0.999999").garbage_collection_threshold, 0.999999);
  for (const char* v : {"0", "0.0", "1", "1.0", "1.5", "-0.2", "abc", "nan", "inf", "0.5x"})
    expect_bad_conf(std::string("garbage_collection_threshold:") + v, {"garbage_collection_threshold", "0 < F < 1"});
}

TEST(AllocConfig, Booleans) {
  EXPECT_TRUE(parse_alloc_config("expandable_segments:True").expandable_segments);
  EXPECT_TRUE(parse_alloc_config("expandable_segments:true").expandable_segments);
  EXPECT_FALSE(parse_alloc_config("expandable_segments:False").expandable_segments);
  EXPECT_FALSE(parse_alloc_config("expandable_segments:false").expandable_segments);
  EXPECT_TRUE(parse_alloc_config("pinned_use_cuda_host_register:True").pinned_use_host_register);
  EXPECT_TRUE(parse_alloc_config("pinned_use_cuda_host_register:true").pinned_use_host_register);
  EXPECT_FALSE(parse_alloc_config("pinned_use_cuda_host_register:False").pinned_use_host_register);
  for (const char* key : {"expandable_segments", "pinned_use_cuda_host_register"})
    for (const char* v : {"TRUE", "yes", "1", "0", "on", "Truee"})
      expect_bad_conf(std::string(key) + ":" + v, {key, "True or False"});
}

TEST(AllocConfig, Capacity) {
  EXPECT_EQ(parse_alloc_config("capacity:6GiB").capacity, 6 * GiB);
  EXPECT_EQ(parse_alloc_config("capacity: 1.5 GB").capacity, 3 * GiB / 2);
  EXPECT_EQ(parse_alloc_config("capacity:512MB").capacity, 512 * MiB);
  EXPECT_EQ(parse_alloc_config("capacity:1048576").capacity, MiB);
  for (const char* v : {"abc", "-1GiB", "6 XB", "1.5"}) expect_bad_conf(std::string("capacity:") + v, {"capacity", v});
  expect_bad_conf("capacity:0", {"capacity", "positive"});
}

TEST(AllocConfig, MemoryFraction) {
  EXPECT_EQ(parse_alloc_config("per_process_memory_fraction:1").memory_fraction, 1.0);
  EXPECT_EQ(parse_alloc_config("per_process_memory_fraction:0.25").memory_fraction, 0.25);
  EXPECT_EQ(parse_alloc_config("per_process_memory_fraction:1.0").memory_fraction, 1.0);
  for (const char* v : {"0", "1.01", "2", "-0.5", "half"})
    expect_bad_conf(std::string("per_process_memory_fraction:") + v, {"per_process_memory_fraction", "0 < F <= 1"});
}

TEST(AllocConfig, PinnedRegisterThreads) {
  for (int n : {1, 2, 4, 8, 16, 32, 64, 128})
    EXPECT_EQ(parse_alloc_config("pinned_num_register_threads:" + std::to_string(n)).pinned_num_register_threads, n);
  for (const char* v : {"0", "3", "6", "256", "-8", "eight", "4.0"})
    expect_bad_conf(std::string("pinned_num_register_threads:") + v, {"pinned_num_register_threads", "power of two"});
}

TEST(AllocConfig, Backend) {
  EXPECT_EQ(parse_alloc_config("backend:native").backend, "native");
  expect_bad_conf("backend:cudaMallocAsync", {"backend", "cudaMallocAsync", "not provided", "native"});
  expect_bad_conf("backend:foo", {"backend", "foo", "native"});
}

TEST(AllocConfig, SyntaxErrorsNameTheKey) {
  expect_bad_conf("max_split_sizes_mb:128",
                  {"unknown key", "max_split_sizes_mb", "max_split_size_mb", "expandable_segments", "capacity"});
  expect_bad_conf("max_non_split_rounding_mb:64", {"max_non_split_rounding_mb", "does not implement"});
  expect_bad_conf("release_lock_on_cudamalloc:True", {"release_lock_on_cudamalloc", "does not implement"});
  expect_bad_conf("expandable_segments", {"expandable_segments", "no value"});
  expect_bad_conf("expandable_segments True", {"unknown key"});  // no colon: the whole entry is read as the key
  expect_bad_conf("expandable_segments:", {"expandable_segments", "empty value"});
  expect_bad_conf("max_split_size_mb:128,max_split_size_mb:256", {"max_split_size_mb", "more than once"});
  expect_bad_conf("expandable_segments:True,,capacity:1GiB", {"empty entry"});
  expect_bad_conf(",expandable_segments:True", {"empty entry"});
  expect_bad_conf(":True", {"unknown key"});
  expect_bad_conf("max_split_size_mb:128:256", {"max_split_size_mb"});
}

TEST(AllocConfig, NothingIsHalfApplied) {
  // The bad entry comes last: the first ones must not leak into anything observable (the call returns nothing).
  expect_bad_conf("expandable_segments:True,max_split_size_mb:128,garbage_collection_threshold:2",
                  {"garbage_collection_threshold"});
  const AllocatorConfig fresh = parse_alloc_config("capacity:1GiB");
  EXPECT_FALSE(fresh.expandable_segments);
  EXPECT_EQ(fresh.max_split_size, kNoLimit);
}

TEST(AllocConfig, SeveralKeysSpacesAndTrailingComma) {
  const AllocatorConfig c = parse_alloc_config(
      " max_split_size_mb:128 , garbage_collection_threshold : 0.6,expandable_segments:True, capacity:6GiB,"
      "per_process_memory_fraction:0.5,pinned_use_cuda_host_register:True,pinned_num_register_threads:8,"
      "backend:native,roundup_power2_divisions:4,");
  EXPECT_EQ(c.max_split_size, 128 * MiB);
  EXPECT_EQ(c.garbage_collection_threshold, 0.6);
  EXPECT_TRUE(c.expandable_segments);
  EXPECT_EQ(c.capacity, 6 * GiB);
  EXPECT_EQ(c.memory_fraction, 0.5);
  EXPECT_TRUE(c.pinned_use_host_register);
  EXPECT_EQ(c.pinned_num_register_threads, 8);
  EXPECT_EQ(c.backend, "native");
  EXPECT_EQ(c.roundup_power2_divisions, std::vector<int64_t>(64, 4));
}

// ---- roundup_power2_divisions -----------------------------------------------------------------------------------

TEST(AllocConfig, RoundupSingleValueAppliesToEverySize) {
  const AllocatorConfig c = parse_alloc_config("roundup_power2_divisions:8");
  EXPECT_EQ(c.roundup_power2_divisions, std::vector<int64_t>(64, 8));
  for (int64_t s : {int64_t{1}, int64_t{4096}, MiB - 1, MiB, 300 * MiB, 5 * GiB, 100 * TiB, INT64_MAX})
    EXPECT_EQ(c.divisions_for(s), 8) << s;
  EXPECT_EQ(parse_alloc_config("roundup_power2_divisions:1").roundup_power2_divisions, std::vector<int64_t>(64, 1));
  for (const char* v : {"0", "3", "12", "-4", "four", "2147483648", "4.0"})
    expect_bad_conf(std::string("roundup_power2_divisions:") + v, {"roundup_power2_divisions", "power of two"});
}

TEST(AllocConfig, RoundupListFollowsPyTorchDocumentation) {
  // PyTorch's documented example: 1 division below 256 MiB, 2 in [256, 512) MiB, 4 in [512, 1024) MiB, 8 above.
  const AllocatorConfig c = parse_alloc_config("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
  EXPECT_EQ(c.roundup_power2_divisions, table({{0, 8, 1}, {9, 9, 2}, {10, 10, 4}, {11, 63, 8}}));
  EXPECT_EQ(c.divisions_for(512), 1);
  EXPECT_EQ(c.divisions_for(MiB - 1), 1);
  EXPECT_EQ(c.divisions_for(MiB), 1);
  EXPECT_EQ(c.divisions_for(100 * MiB), 1);
  EXPECT_EQ(c.divisions_for(256 * MiB - 1), 1);
  EXPECT_EQ(c.divisions_for(256 * MiB), 2);
  EXPECT_EQ(c.divisions_for(512 * MiB - 1), 2);
  EXPECT_EQ(c.divisions_for(512 * MiB), 4);
  EXPECT_EQ(c.divisions_for(GiB - 1), 4);
  EXPECT_EQ(c.divisions_for(GiB), 8);
  EXPECT_EQ(c.divisions_for(80 * GiB), 8);
  EXPECT_EQ(c.divisions_for(INT64_MAX), 8);
}

TEST(AllocConfig, RoundupListIntervalBoundaries) {
  // Entry k covers [2^(k-1), 2^k) MiB; entry 0 everything below 1 MiB.
  const AllocatorConfig c = parse_alloc_config("roundup_power2_divisions:[1:2,2:4,4:8,>:16]");
  EXPECT_EQ(c.roundup_power2_divisions, table({{0, 0, 2}, {1, 1, 4}, {2, 2, 8}, {3, 63, 16}}));
  EXPECT_EQ(c.divisions_for(0), 2);
  EXPECT_EQ(c.divisions_for(MiB - 1), 2);
  EXPECT_EQ(c.divisions_for(MiB), 4);
  EXPECT_EQ(c.divisions_for(2 * MiB - 1), 4);
  EXPECT_EQ(c.divisions_for(2 * MiB), 8);
  EXPECT_EQ(c.divisions_for(4 * MiB - 1), 8);
  EXPECT_EQ(c.divisions_for(4 * MiB), 16);
}

TEST(AllocConfig, RoundupListGapsAndEnds) {
  // Unlisted intervals between keys stay 0; with no '>' the intervals above the last key stay 0.
  EXPECT_EQ(parse_alloc_config("roundup_power2_divisions:[1:2,8:4]").roundup_power2_divisions,
            table({{0, 0, 2}, {3, 3, 4}}));
  EXPECT_EQ(parse_alloc_config("roundup_power2_divisions:[2:4]").roundup_power2_divisions, table({{0, 1, 4}}));
  EXPECT_EQ(parse_alloc_config("roundup_power2_divisions:[>:8]").roundup_power2_divisions, std::vector<int64_t>(64, 8));
  EXPECT_EQ(parse_alloc_config("roundup_power2_divisions:[ 64 : 0 , > : 4 ]").roundup_power2_divisions,
            table({{7, 63, 4}}));
  const AllocatorConfig gap = parse_alloc_config("roundup_power2_divisions:[1:2,8:4]");
  EXPECT_EQ(gap.divisions_for(3 * MiB), 0);
  EXPECT_EQ(gap.divisions_for(5 * MiB), 4);
  EXPECT_EQ(gap.divisions_for(9 * MiB), 0);
  // Keys far above any real size land in the last interval.
  EXPECT_EQ(parse_alloc_config("roundup_power2_divisions:[4611686018427387904:2]").roundup_power2_divisions,
            table({{0, 62, 2}}));
}

TEST(AllocConfig, RoundupListErrors) {
  for (const char* v :
       {"[256:3]", "[300:1]", "[0:1]", "[512:2,256:1]", "[256:1,256:2]", "[>:8,256:1]", "[256:1", "256:1]", "[]", "[ ]",
        "[256]", "[256:1,,512:2]", "[256:x]", "[x:2]", "[256:-2]", "[256:2147483648]", "[-256:2]", "[256:1]]"}) {
    expect_bad_conf(std::string("roundup_power2_divisions:") + v, {"roundup_power2_divisions"});
  }
}

// ---- str() round trips --------------------------------------------------------------------------------------------

TEST(AllocConfig, StrIsCanonical) {
  EXPECT_EQ(parse_alloc_config("expandable_segments:true, max_split_size_mb: 128").str(),
            "max_split_size_mb:128,expandable_segments:True");
  EXPECT_EQ(parse_alloc_config("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").str(),
            "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
  EXPECT_EQ(parse_alloc_config("roundup_power2_divisions:4").str(), "roundup_power2_divisions:4");
  EXPECT_EQ(parse_alloc_config("roundup_power2_divisions:[>:4]").str(), "roundup_power2_divisions:4");
  EXPECT_EQ(parse_alloc_config("capacity:1.5GiB").str(), "capacity:1536MiB");
  EXPECT_EQ(parse_alloc_config("capacity:1000").str(), "capacity:1000");
  EXPECT_EQ(parse_alloc_config("garbage_collection_threshold:0.8").str(), "garbage_collection_threshold:0.8");
  EXPECT_EQ(parse_alloc_config("backend:native,expandable_segments:False").str(), "");
}

// A negative number is called negative; text after a minus sign is still "not a number".
TEST(AllocConfig, NegativeValuesAreNamed) {
  for (const char* text : {"max_split_size_mb:-5", "garbage_collection_threshold:-0.1"}) {
    try {
      parse_alloc_config(text);
      ADD_FAILURE() << text;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("is negative"), std::string::npos) << e.what();
    }
  }
  try {
    parse_alloc_config("max_split_size_mb:-x");
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("\"-x\" is not a whole number"), std::string::npos) << e.what();
  }
}

// explicit_str() means the same configuration over PyTorch's defaults and over ember's (which turn expandable
// segments on): str() of a fixed-segment configuration, read as EMBER_ALLOC_CONF, would not.
TEST(AllocConfig, ExplicitStrMeansTheSameOverEitherDefaults) {
  for (const char* text : {"", "expandable_segments:False,capacity:48MiB", "expandable_segments:True",
                           "max_split_size_mb:40,garbage_collection_threshold:0.5"}) {
    const AllocatorConfig c = parse_alloc_config(text);
    const std::string s = c.explicit_str();
    EXPECT_NE(s.find("expandable_segments:"), std::string::npos) << s;
    EXPECT_EQ(parse_alloc_config(s).str(), c.str()) << s;
    EXPECT_EQ(parse_alloc_config(s, ember_default_config()).str(), c.str()) << s;
  }
  EXPECT_EQ(parse_alloc_config("capacity:48MiB").explicit_str(), "expandable_segments:False,capacity:48MiB");
  EXPECT_TRUE(parse_alloc_config(parse_alloc_config("capacity:48MiB").str(), ember_default_config()).expandable_segments);
}

TEST(AllocConfig, StrRoundTrips) {
  const char* texts[] = {
      "max_split_size_mb:21",
      "max_split_size_mb:99999999999999999",
      "garbage_collection_threshold:0.1",
      "garbage_collection_threshold:0.333333333333333314829616256247390992939472198486328125",
      "per_process_memory_fraction:0.7",
      "capacity:6GiB,expandable_segments:True",
      "capacity:123457",
      "pinned_use_cuda_host_register:True,pinned_num_register_threads:128",
      "roundup_power2_divisions:[1:2,8:4]",
      "roundup_power2_divisions:[2:4]",
      "roundup_power2_divisions:[64:0,>:4]",
      "roundup_power2_divisions:[1:0,2:0,4:8,16:0,>:2]",
      "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
      "roundup_power2_divisions:[4:2,8:2,16:2,32:4,>:4]",
      "roundup_power2_divisions:[4611686018427387904:2]",
      "max_split_size_mb:256,roundup_power2_divisions:16,garbage_collection_threshold:0.95,"
      "expandable_segments:True,capacity:80GiB,per_process_memory_fraction:0.9,pinned_use_cuda_host_register:True,"
      "pinned_num_register_threads:4,backend:native",
  };
  for (const char* t : texts) {
    SCOPED_TRACE(t);
    const AllocatorConfig a = parse_alloc_config(t);
    const std::string s = a.str();
    SCOPED_TRACE(s);
    expect_same(parse_alloc_config(s), a);
    EXPECT_EQ(parse_alloc_config(s).str(), s);
  }
}

TEST(AllocConfig, StrRoundTripsRandomDivisionTables) {
  const uint64_t seed = ember::testing::test_seed();
  std::printf("StrRoundTripsRandomDivisionTables seed=%llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const int64_t values[] = {0, 1, 2, 4, 8, 16};
  for (int trial = 0; trial < 2000; ++trial) {
    AllocatorConfig a;
    // Runs of equal values, so that leading/trailing runs and interior zeros all occur.
    int k = 0;
    while (k < AllocatorConfig::kRoundupIntervals) {
      const int len = 1 + static_cast<int>(rng() % 24);
      const int64_t v = values[rng() % 6];
      for (int j = 0; j < len && k < AllocatorConfig::kRoundupIntervals; ++j) a.roundup_power2_divisions[k++] = v;
    }
    const std::string s = a.str();
    const AllocatorConfig b = parse_alloc_config(s);
    ASSERT_EQ(b.roundup_power2_divisions, a.roundup_power2_divisions)
        << "seed " << seed << " trial " << trial << ": " << s;
  }
}

// ---- environment --------------------------------------------------------------------------------------------------

TEST(AllocConfig, FromEnvironment) {
  EnvGuard guard("EMBER_ALLOC_CONF");
  // ember's process-wide default: PyTorch's settings except expandable segments on.
  AllocatorConfig ember_default;
  ember_default.expandable_segments = true;
  expect_same(ember_default_config(), ember_default);
  unsetenv("EMBER_ALLOC_CONF");
  expect_same(alloc_config_from_env(), ember_default);
  setenv("EMBER_ALLOC_CONF", "", 1);
  expect_same(alloc_config_from_env(), ember_default);
  setenv("EMBER_ALLOC_CONF", "max_split_size_mb:128,capacity:6GiB", 1);
  const AllocatorConfig c = alloc_config_from_env();
  EXPECT_EQ(c.max_split_size, 128 * MiB);
  EXPECT_TRUE(c.expandable_segments);  // not mentioned: keeps ember's default
  EXPECT_EQ(c.capacity, 6 * GiB);
  setenv("EMBER_ALLOC_CONF", "expandable_segments:False", 1);
  EXPECT_FALSE(alloc_config_from_env().expandable_segments);
  // parse_alloc_config on its own starts from PyTorch's defaults.
  EXPECT_FALSE(parse_alloc_config("max_split_size_mb:128").expandable_segments);
  setenv("EMBER_ALLOC_CONF", "max_split_size_mb:10", 1);
  expect_config_error([] { alloc_config_from_env(); }, {"EMBER_ALLOC_CONF", "max_split_size_mb", "10"});
}
