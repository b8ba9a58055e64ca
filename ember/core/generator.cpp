// Generator: mutex-protected Philox state.
// Invariant: every read-modify-write of the state holds the mutex, so reserve() ranges never overlap.
#include "ember/core/generator.h"

#include <algorithm>

#include "ember/base/error.h"

namespace ember {

namespace {
// Note [Draw log]: this thread's active logs (outermost first) and innermost replay.
thread_local std::vector<std::vector<DrawRecord>*> t_recorders;
thread_local DrawReplay* t_replay = nullptr;
}  // namespace

DrawRecorder::DrawRecorder(std::vector<DrawRecord>& log) : log_(&log) { t_recorders.push_back(log_); }
DrawRecorder::~DrawRecorder() {
  auto it = std::find(t_recorders.rbegin(), t_recorders.rend(), log_);
  if (it != t_recorders.rend()) t_recorders.erase(std::next(it).base());
}

DrawReplay::DrawReplay(const std::vector<DrawRecord>& log) : log_(log), prev_(t_replay) { t_replay = this; }
DrawReplay::~DrawReplay() { t_replay = prev_; }

PhiloxState DrawReplay::next(uint64_t counters) {
  EMBER_CHECK(next_ < log_.size(), ValueError, "random draw ", next_ + 1, " of a replay that logged only ",
              log_.size(), " draws");
  const DrawRecord& r = log_[next_];
  EMBER_CHECK(r.counters == counters, ValueError, "random draw ", next_ + 1, " of a replay asks for ", counters,
              " counters; the logged draw reserved ", r.counters);
  ++next_;
  return r.state;
}

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
  PhiloxState s;
  if (t_replay != nullptr) {
    s = t_replay->next(counters);
  } else {
    std::lock_guard<std::mutex> lock(mutex_);
    s = state_;
    state_.offset += counters;
  }
  for (std::vector<DrawRecord>* log : t_recorders) log->push_back({s, counters});
  return s;
}

Generator& default_generator() {
  static Generator g;
  return g;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace ember
