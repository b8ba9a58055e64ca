// The random generator state (seed, offset) behind rand/randn/dropout. Thread-safe: reserve() hands out disjoint
// counter ranges, so concurrent draws never overlap (Note [Philox stream] in philox.h).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

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
  // Returns the state to draw from and advances the offset by `counters` (or, under a DrawReplay on this thread, the
  // next logged state, without advancing: Note [Draw log]).
  PhiloxState reserve(uint64_t counters);

 private:
  mutable std::mutex mutex_;
  PhiloxState state_;
};

Generator& default_generator();
void manual_seed(uint64_t seed);  // seeds the default generator and resets its offset

// Note [Draw log]
// Activation checkpointing must give a recomputed region the random numbers its first run drew, even when other
// threads draw from the same generator in between. So a thread can log the states reserve() hands it (from any
// generator) while a DrawRecorder is alive, and later replay them: while a DrawReplay is alive, reserve() on this
// thread returns the logged states in order and leaves every generator untouched. Recorders nest (a draw goes into
// every active log of the thread, replayed draws included); the innermost replay serves.
struct DrawRecord {
  PhiloxState state;
  uint64_t counters = 0;
};

class DrawRecorder {
 public:
  explicit DrawRecorder(std::vector<DrawRecord>& log);
  ~DrawRecorder();
  DrawRecorder(const DrawRecorder&) = delete;
  DrawRecorder& operator=(const DrawRecorder&) = delete;

 private:
  std::vector<DrawRecord>* log_;
};

class DrawReplay {
 public:
  explicit DrawReplay(const std::vector<DrawRecord>& log);
  ~DrawReplay();
  DrawReplay(const DrawReplay&) = delete;
  DrawReplay& operator=(const DrawReplay&) = delete;
  // The next logged state; ValueError when the log is exhausted or the draw asks for another counter count.
  PhiloxState next(uint64_t counters);
  size_t consumed() const { return next_; }

 private:
  const std::vector<DrawRecord>& log_;
  size_t next_ = 0;
  DrawReplay* prev_;
};

}  // namespace ember
