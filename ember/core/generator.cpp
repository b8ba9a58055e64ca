// Generator: mutex-protected Philox state.
// Invariant: every read-modify-write of the state holds the mutex, so reserve() ranges never overlap.
#include "ember/core/generator.h"

namespace ember {

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mutex_);
  state_ = {seed, 0};
}

PhiloxState Generator::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_;
}

void Generator::set_state(PhiloxState s) {
  std::lock_guard<std::mutex> lock(mutex_);
  state_ = s;
}

PhiloxState Generator::reserve(uint64_t counters) {
  std::lock_guard<std::mutex> lock(mutex_);
  PhiloxState s = state_;
  state_.offset += counters;
  return s;
}

Generator& default_generator() {
  static Generator g;
  return g;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace ember
