// The worker pool behind parallel_for: get_num_threads() - 1 threads that sleep on a condition variable (after a
// short spin, so back-to-back kernels do not pay a wake-up each) and claim chunks of the posted job through an atomic
// counter. One job runs at a time; a second caller (another user thread) runs its chunks itself.
#include "ember/core/parallel.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "ember/base/error.h"

namespace ember {
namespace {

thread_local bool t_in_region = false;

struct RegionGuard {
  bool prev = t_in_region;
  RegionGuard() { t_in_region = true; }
  ~RegionGuard() { t_in_region = prev; }
  RegionGuard(const RegionGuard&) = delete;
  RegionGuard& operator=(const RegionGuard&) = delete;
};

int default_threads() {
  if (const char* env = std::getenv("EMBER_NUM_THREADS"); env && *env) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    EMBER_CHECK(end && *end == '\0' && v >= 1 && v <= 1024, ConfigError,
                "EMBER_NUM_THREADS must be an integer in [1, 1024], got '", env, "'");
    return static_cast<int>(v);
  }
  cpu_set_t set;
  int n = 0;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) n = CPU_COUNT(&set);
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(n, 1, 64);
}

// One posted parallel_for: lives on the caller's stack until every worker that joined it has left.
struct Job {
  const std::function<void(int64_t)>* run = nullptr;
  int64_t chunks = 0;
  std::atomic<int64_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr error;  // the exception of the lowest-numbered chunk that threw
  int64_t error_chunk = 0;

  // Claims and runs chunks until none is left.
  void work() {
    RegionGuard region;
    for (int64_t i = next.fetch_add(1); i < chunks; i = next.fetch_add(1)) {
      try {
        (*run)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lk(error_mutex);
        if (!error || i < error_chunk) {
          error = std::current_exception();
          error_chunk = i;
        }
      }
    }
  }
};

class Pool {
 public:
  static constexpr int kSpins = 2048;

  explicit Pool(int workers) {
    threads_.reserve(static_cast<size_t>(workers));
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
      generation_.fetch_add(1);
    }
    cv_work_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // Runs job on the workers and the calling thread; false (nothing run) when another caller holds the pool.
  bool run(Job& job) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lk(m_);
      job_ = &job;
      generation_.fetch_add(1);
    }
    cv_work_.notify_all();
    job.work();
    std::unique_lock<std::mutex> lk(m_);
    job_ = nullptr;  // no worker joins from here on
    cv_done_.wait(lk, [&] { return active_ == 0; });
    return true;
  }

 private:
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      // Spin briefly for the next job before sleeping, since kernels are posted back to back; yield while spinning
      // so that an oversubscribed machine (several processes, each with its pool) still runs the other threads.
      for (int spin = 0; spin < kSpins && generation_.load(std::memory_order_acquire) == seen; ++spin) {
        if (spin % 16 == 15) std::this_thread::yield();
#if defined(__x86_64__) || defined(__i386__)
        else __builtin_ia32_pause();
#endif
      }
      Job* job = nullptr;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_work_.wait(lk, [&] { return stop_ || generation_.load() != seen; });
        if (stop_) return;
        seen = generation_.load();
        job = job_;
        if (job == nullptr) continue;  // woke after the job had finished
        ++active_;
      }
      job->work();
      {
        std::lock_guard<std::mutex> lk(m_);
        --active_;
      }
      cv_done_.notify_all();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex busy_;  // held by the caller whose job is posted
  std::mutex m_;     // guards stop_, job_, active_ and the generation's changes
  std::condition_variable cv_work_, cv_done_;
  std::atomic<uint64_t> generation_{0};
  bool stop_ = false;
  Job* job_ = nullptr;
  int active_ = 0;  // workers inside job_->work()
};

struct State {
  std::mutex m;
  int threads = 0;  // 0: not decided yet
  std::unique_ptr<Pool> pool;
};

State& state() {
  static State* s = [] {
    auto* st = new State();  // never destroyed: kernels may run during static destruction
    pthread_atfork(nullptr, nullptr, [] {
      // A forked child has none of the parent's workers: forget the pool (leaking the parent's copy of it).
      State& c = state();
      new (&c.m) std::mutex();
      (void)c.pool.release();
    });
    return st;
  }();
  return *s;
}

int threads_locked(State& s) {
  if (s.threads == 0) s.threads = default_threads();
  return s.threads;
}

Pool* pool() {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.m);
  const int t = threads_locked(s);
  if (t > 1 && !s.pool) s.pool = std::make_unique<Pool>(t - 1);
  return s.pool.get();
}

}  // namespace

int get_num_threads() {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.m);
  return threads_locked(s);
}

void set_num_threads(int n) {
  EMBER_CHECK(n >= 1 && n <= 1024, ConfigError, "set_num_threads: expects 1 <= n <= 1024, got ", n);
  std::unique_ptr<Pool> old;
  {
    State& s = state();
    std::lock_guard<std::mutex> lk(s.m);
    if (s.threads == n) return;
    s.threads = n;
    old = std::move(s.pool);
  }
  old.reset();  // joins the old workers outside the lock
}

namespace parallel {

bool in_parallel_region() { return t_in_region; }

int64_t chunk_count(int64_t n, int64_t grain) {
  if (n <= 0 || t_in_region) return 1;
  const int64_t t = get_num_threads();
  return std::clamp<int64_t>(n / std::max<int64_t>(grain, 1), 1, t);
}

int64_t chunk_begin(int64_t i, int64_t c, int64_t n, int64_t align) {
  if (i >= c) return n;
  const int64_t a = std::max<int64_t>(align, 1);
  const auto b = static_cast<int64_t>((static_cast<__int128>(i) * n) / c);
  return b - b % a;
}

void parallel_for(int64_t n, int64_t grain, int64_t align, const std::function<void(int64_t, int64_t, int64_t)>& f) {
  if (n <= 0) return;
  const int64_t c = chunk_count(n, grain);
  const std::function<void(int64_t)> run = [&](int64_t i) {
    const int64_t b = chunk_begin(i, c, n, align), e = chunk_begin(i + 1, c, n, align);
    if (b < e) f(i, b, e);
  };
  if (c == 1) {
    run(0);
    return;
  }
  Job job;
  job.run = &run;
  job.chunks = c;
  Pool* p = pool();
  if (p == nullptr || !p->run(job)) job.work();  // no pool, or it is busy with another caller's job
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace parallel
}  // namespace ember
