// Intra-op parallelism for the CPU kernels: one process-wide pool of worker threads and parallel_for over an index
// range split into contiguous chunks. Invariant: the split depends only on (n, grain, align, num_threads), never on
// timing, and a chunk's body runs exactly as it would serially, so a kernel whose chunks own disjoint outputs gives
// the same bits whichever thread runs which chunk (Note [Parallel chunks]).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

namespace ember {

// Threads the CPU kernels use (the caller plus get_num_threads() - 1 workers), like torch::get_num_threads. The
// default is EMBER_NUM_THREADS when set (an integer in [1, 1024], else ConfigError on first use), otherwise the CPUs
// this process may run on (sched_getaffinity), at most 64.
int get_num_threads();
// Sets the thread count (1: every kernel runs on the calling thread); ConfigError unless 1 <= n <= 1024. Call it
// between ops, not while another thread runs kernels.
void set_num_threads(int n);

namespace parallel {

// Note [Parallel chunks]
// parallel_for(n, grain, align, f) splits [0, n) into c = chunk_count(n, grain) chunks: c = min(threads, n / grain),
// at least 1; chunk i is [chunk_begin(i), chunk_begin(i + 1)) with chunk_begin(i) = i * n / c rounded down to a
// multiple of align. f(i, begin, end) runs once per non-empty chunk, on the calling thread or a worker (whichever
// claims it first); parallel_for returns when all have finished and rethrows the exception of the lowest-numbered
// chunk that threw (the one a serial run raises first, so an error names the same element whichever thread ran which
// chunk). Inside a chunk (or with one thread) chunk_count is 1, so nested parallel_for runs serially. Chunk bodies
// must not allocate tensors: the allocator's statistics, traces and the meta replay of kernel workspace follow the
// calling thread's order, so a kernel takes per-chunk workspace before the call (chunk_count tells how many) and hands
// it out by the chunk index. If the pool is busy with another caller's job, the chunks run one after another on the
// caller.

// How many chunks parallel_for(n, grain, ...) uses now.
int64_t chunk_count(int64_t n, int64_t grain);

// Where chunk i of c chunks over [0, n) begins (chunk c "begins" at n).
int64_t chunk_begin(int64_t i, int64_t c, int64_t n, int64_t align);

// Runs f(chunk, begin, end) over the chunks of [0, n).
void parallel_for(int64_t n, int64_t grain, int64_t align, const std::function<void(int64_t, int64_t, int64_t)>& f);

// parallel_for with align 1 and a body that ignores the chunk index.
inline void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& f) {
  parallel_for(n, grain, 1, [&](int64_t, int64_t b, int64_t e) { f(b, e); });
}

// True on a pool worker, or on the calling thread while it runs chunks.
bool in_parallel_region();

// Runs f(slot, item) once for every item in [0, items) on `slots` chunks (slots <= chunk_count(slots, 1), e.g. the
// chunk_count a kernel took per-slot workspace for): each chunk claims the next unclaimed item whenever it is free,
// so a thread the OS deschedules holds up one item, not a fixed share of them. Which slot runs an item depends on
// timing, so each item must own its outputs and compute them the same way in any slot (its own workspace aside).
inline void for_each_claimed(int64_t items, int64_t slots, const std::function<void(int64_t, int64_t)>& f) {
  std::atomic<int64_t> next{0};
  parallel_for(slots, 1, 1, [&](int64_t slot, int64_t, int64_t) {
    for (int64_t item = next.fetch_add(1, std::memory_order_relaxed); item < items;
         item = next.fetch_add(1, std::memory_order_relaxed))
      f(slot, item);
  });
}

}  // namespace parallel
}  // namespace ember
