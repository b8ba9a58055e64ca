// The random generator state (seed, offset) behind rand/randn/dropout. Thread-safe: reserve() hands out disjoint
// counter ranges, so concurrent draws never overlap (Note [Philox stream] in philox.h).
#pragma once

#include <cstdint>
#include <mutex>

namespace ember {

struct PhiloxState {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

class Generator {
 public:
  explicit Generator(uint64_t seed = 0x5eed) : state_{seed, 0} {}
  void manual_seed(uint64_t seed);
  PhiloxState state() const;
  void set_state(PhiloxState s);
  // Returns the state to draw from and advances the offset by `counters`.
  PhiloxState reserve(uint64_t counters);

 private:
  mutable std::mutex mutex_;
  PhiloxState state_;
};

Generator& default_generator();
void manual_seed(uint64_t seed);  // seeds the default generator and resets its offset

}  // namespace ember
