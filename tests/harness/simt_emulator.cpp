// The fiber scheduler of simt_emulator.h: one ucontext per emulated thread, run round-robin on the calling thread;
// barriers count arrivals per generation and yield until the generation moves on.
#include "tests/harness/simt_emulator.h"

#include <ucontext.h>

#include <exception>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define EMBER_SIMT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMBER_SIMT_ASAN 1
#endif
#endif

#if defined(EMBER_SIMT_ASAN)
// AddressSanitizer's fiber annotations (sanitizer/common_interface_defs.h): a stack switch it is not told about
// looks like a wild stack pointer.
extern "C" void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom, size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old, size_t* size_old);
#endif

namespace ember::testing::simt {
namespace {

constexpr size_t kStackBytes = size_t{256} << 10;  // the kernels keep their register arrays on this stack
constexpr size_t kSharedAlign = 4096;
constexpr unsigned kSkewPeriods = 4;  // warps run every 1st, 2nd, 3rd or 4th round (launch's skewed rounds)
constexpr uint64_t kSkewCycle = 12;   // rounds in which every period comes round: lcm(1, 2, 3, 4)
static_assert(kSkewPeriods == 4 && kSkewCycle % 12 == 0, "the cycle must be a multiple of lcm(1 .. kSkewPeriods)");
constexpr unsigned char kPoison = 0xff;  // what a cp.async destination holds until the copy lands

struct Barrier {
  unsigned arrived = 0;
  uint64_t generation = 0;
};

struct Mbarrier {
  unsigned count = 0, pending = 0;
  int64_t tx = 0;  // expected transaction bytes not yet delivered
  uint64_t phase = 0;
};

// A cp.async issued and not yet waited for: its 16 bytes land at the wait that covers its group.
struct AsyncCopy {
  void* dst;
  const void* src;
  int src_bytes;
  int64_t group;               // -1 until a commit closes it into a group
  unsigned char snapshot[16];  // the source at the issue: a write to it while in flight is an error
};

struct Fiber {
  ucontext_t context{};
  std::vector<AsyncCopy> copies;  // issue order
  int64_t groups = 0;             // groups committed so far
  std::unique_ptr<char[]> stack;
  ThreadIndex index;
  unsigned cta = 0;  // rank of its block in the cluster
  bool done = false;
  void* fake_stack = nullptr;  // AddressSanitizer's, while switched out
};

struct Scheduler {
  ucontext_t main{};
  std::vector<Fiber> fibers;
  size_t running = 0;
  unsigned live = 0;  // fibers of the running blocks not yet done
  unsigned block_threads = 0, cluster_blocks = 1;
  std::vector<Barrier> blocks;  // __syncthreads, per block of the cluster
  Barrier cluster;              // barrier.cluster
  std::vector<Barrier> warps;
  std::vector<std::vector<char>> warp_slots;  // 32 contributions per warp
  std::vector<Barrier> warpgroups;
  std::vector<std::vector<char>> warpgroup_slots;       // 128 contributions per warpgroup
  std::unordered_map<const void*, Mbarrier> mbarriers;  // of the running block
  uint64_t progress = 0;                                // barrier completions and finished fibers
  const std::function<void()>* kernel = nullptr;
  size_t shared_size = 0;
  std::vector<std::unique_ptr<char[]>> shared_bytes;  // dynamic shared memory per block of the cluster
  std::vector<char*> shared;                          // 128-byte aligned within shared_bytes
  std::exception_ptr error;
  const void* main_bottom = nullptr;
  size_t main_size = 0;
};

thread_local Scheduler* g_scheduler = nullptr;

Scheduler& scheduler() {
  if (g_scheduler == nullptr) throw SimtError("simt: no kernel is running on this thread");
  return *g_scheduler;
}

// Fiber -> scheduler, and back when the scheduler resumes this fiber.
void yield() {
  Scheduler& s = scheduler();
  Fiber& f = s.fibers[s.running];
#if defined(EMBER_SIMT_ASAN)
  __sanitizer_start_switch_fiber(&f.fake_stack, s.main_bottom, s.main_size);
#endif
  swapcontext(&f.context, &s.main);
#if defined(EMBER_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(f.fake_stack, nullptr, nullptr);
#endif
}

void fiber_entry() {
  Scheduler& s = scheduler();
#if defined(EMBER_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &s.main_bottom, &s.main_size);
#endif
  try {
    (*s.kernel)();
  } catch (...) {
    if (!s.error) s.error = std::current_exception();
  }
  Fiber& f = s.fibers[s.running];
  if (!f.copies.empty() && !s.error)
    s.error = std::make_exception_ptr(
        SimtError("cp.async: a thread exited with copies in flight (no cp.async.wait_group covered them)"));
  f.done = true;
  --s.live;
  ++s.progress;
#if defined(EMBER_SIMT_ASAN)
  __sanitizer_start_switch_fiber(nullptr, s.main_bottom, s.main_size);  // this fiber's stack is finished
#endif
  setcontext(&s.main);
}

// Waits at `b` until `count` threads have arrived in this generation.
void arrive_and_wait(Barrier& b, unsigned count) {
  Scheduler& s = scheduler();
  const uint64_t generation = b.generation;
  if (++b.arrived == count) {
    b.arrived = 0;
    ++b.generation;
    ++s.progress;
    return;
  }
  while (b.generation == generation) yield();
}

}  // namespace

const ThreadIndex& current() {
  Scheduler& s = scheduler();
  return s.fibers[s.running].index;
}

void syncthreads() {
  Scheduler& s = scheduler();
  arrive_and_wait(s.blocks[s.fibers[s.running].cta], s.block_threads);
}

unsigned cluster_ctarank() {
  Scheduler& s = scheduler();
  return s.fibers[s.running].cta;
}

void cluster_sync() {
  Scheduler& s = scheduler();
  arrive_and_wait(s.cluster, static_cast<unsigned>(s.fibers.size()));
}

void* map_shared(const void* p, unsigned rank) {
  Scheduler& s = scheduler();
  if (rank >= s.cluster_blocks)
    throw SimtError("simt: mapa to rank " + std::to_string(rank) + " of a cluster of " +
                    std::to_string(s.cluster_blocks));
  const char* mine = s.shared[s.fibers[s.running].cta];
  const char* q = static_cast<const char*>(p);
  if (q < mine || q >= mine + s.shared_size) throw SimtError("simt: mapa of an address outside dynamic shared memory");
  return s.shared[rank] + (q - mine);
}

void warp_exchange(const void* in, size_t bytes, void* all) {
  Scheduler& s = scheduler();
  const ThreadIndex& me = s.fibers[s.running].index;
  const size_t warp = s.running / 32;
  std::vector<char>& slots = s.warp_slots[warp];
  if (slots.size() < 32 * bytes) slots.resize(32 * bytes);
  std::memcpy(slots.data() + static_cast<size_t>(me.lane) * bytes, in, bytes);
  arrive_and_wait(s.warps[warp], 32);  // every lane has written
  std::memcpy(all, slots.data(), 32 * bytes);
  arrive_and_wait(s.warps[warp], 32);  // every lane has read: the slots may be reused
}

namespace {

// The last of `n` threads to arrive at `b` runs combine over their `slots`, then opens the barrier.
void collective(Barrier& b, std::vector<char>& slots, unsigned n, unsigned index, const void* in, size_t in_bytes,
                void* out, size_t out_bytes, const std::function<void(const char* all_in, char* all_out)>& combine) {
  Scheduler& s = scheduler();
  if (slots.size() < n * (in_bytes + out_bytes)) slots.resize(n * (in_bytes + out_bytes));
  char* all_in = slots.data();
  char* all_out = slots.data() + n * in_bytes;
  std::memcpy(all_in + static_cast<size_t>(index) * in_bytes, in, in_bytes);
  const uint64_t generation = b.generation;
  if (++b.arrived == n) {
    combine(all_in, all_out);
    b.arrived = 0;
    ++b.generation;
    ++s.progress;
  } else {
    while (b.generation == generation) yield();
  }
  std::memcpy(out, all_out + static_cast<size_t>(index) * out_bytes, out_bytes);
  arrive_and_wait(b, n);  // every thread has read: the slots may be reused
}

}  // namespace

void warp_collective(const void* in, size_t in_bytes, void* out, size_t out_bytes,
                     const std::function<void(const char* all_in, char* all_out)>& combine) {
  Scheduler& s = scheduler();
  const ThreadIndex& me = s.fibers[s.running].index;
  const size_t warp = s.running / 32;
  collective(s.warps[warp], s.warp_slots[warp], 32, static_cast<unsigned>(me.lane), in, in_bytes, out, out_bytes,
             combine);
}

void warpgroup_collective(const void* in, size_t in_bytes, void* out, size_t out_bytes,
                          const std::function<void(const char* all_in, char* all_out)>& combine) {
  Scheduler& s = scheduler();
  if (s.block_threads % 128 != 0) throw SimtError("simt: a warpgroup operation in a block of partial warpgroups");
  const size_t t = s.running;
  collective(s.warpgroups[t / 128], s.warpgroup_slots[t / 128], 128, static_cast<unsigned>(t % 128), in, in_bytes, out,
             out_bytes, combine);
}

void yield_now() { yield(); }

void cp_async(void* dst, const void* src, int src_bytes) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || (src_bytes > 0 && reinterpret_cast<uintptr_t>(src) % 16 != 0))
    throw SimtError("cp.async: an address is not 16-byte aligned");
  if (src_bytes < 0 || src_bytes > 16) throw SimtError("cp.async: src_bytes " + std::to_string(src_bytes));
  Scheduler& s = scheduler();
  AsyncCopy c{dst, src, src_bytes, -1, {}};
  if (src_bytes > 0) std::memcpy(c.snapshot, src, static_cast<size_t>(src_bytes));
  std::memset(dst, kPoison, 16);
  s.fibers[s.running].copies.push_back(c);
}

void cp_async_commit_group() {
  Scheduler& s = scheduler();
  Fiber& f = s.fibers[s.running];
  for (AsyncCopy& c : f.copies)
    if (c.group < 0) c.group = f.groups;
  ++f.groups;  // an empty group counts too, as on the hardware
}

void cp_async_wait_group(int pending) {
  Scheduler& s = scheduler();
  Fiber& f = s.fibers[s.running];
  const int64_t done_below = f.groups - pending;  // groups [0, done_below) must have landed
  size_t kept = 0;
  for (AsyncCopy& c : f.copies) {
    if (c.group >= 0 && c.group < done_below) {
      // The hardware reads the source and writes the destination at some time between the issue and the wait: a
      // store to either in between makes the result undefined.
      const unsigned char* d = static_cast<const unsigned char*>(c.dst);
      for (int k = 0; k < 16; ++k)
        if (d[k] != kPoison) throw SimtError("cp.async: its destination was written while the copy was in flight");
      if (c.src_bytes > 0 && std::memcmp(c.snapshot, c.src, static_cast<size_t>(c.src_bytes)) != 0)
        throw SimtError("cp.async: its source was written while the copy was in flight");
      std::memset(c.dst, 0, 16);
      if (c.src_bytes > 0) std::memcpy(c.dst, c.snapshot, static_cast<size_t>(c.src_bytes));
    } else {
      f.copies[kept++] = c;
    }
  }
  f.copies.resize(kept);
}

namespace {

Mbarrier& mbarrier_at(void* bar) {
  Scheduler& s = scheduler();
  auto it = s.mbarriers.find(bar);
  if (it == s.mbarriers.end()) throw SimtError("simt: an mbarrier used before mbarrier.init");
  return it->second;
}

void complete_if_done(Mbarrier& m) {
  if (m.pending == 0 && m.tx == 0) {
    ++m.phase;
    m.pending = m.count;
    ++scheduler().progress;
  }
}

}  // namespace

void mbarrier_init(void* bar, unsigned count) {
  if (reinterpret_cast<uintptr_t>(bar) % 8 != 0) throw SimtError("simt: an mbarrier is not 8-byte aligned");
  if (count == 0) throw SimtError("simt: mbarrier.init with count 0");
  scheduler().mbarriers[bar] = Mbarrier{count, count, 0, 0};
}

void mbarrier_arrive(void* bar, unsigned expect_tx_bytes) {
  Mbarrier& m = mbarrier_at(bar);
  if (m.pending == 0) throw SimtError("simt: more arrivals on an mbarrier than its count");
  m.tx += expect_tx_bytes;
  --m.pending;
  complete_if_done(m);
}

void mbarrier_complete_tx(void* bar, unsigned bytes) {
  Mbarrier& m = mbarrier_at(bar);
  m.tx -= bytes;
  complete_if_done(m);
}

bool mbarrier_test_parity(void* bar, unsigned parity) { return (mbarrier_at(bar).phase & 1u) != (parity & 1u); }

void tma_load_multicast(void* dst, const TensorMap& map, const int (&c)[3], void* bar, uint16_t cta_mask) {
  for (unsigned rank = 0; rank < 16; ++rank)
    if (cta_mask & (1u << rank)) tma_load(map_shared(dst, rank), map, c, map_shared(bar, rank));
}

void tma_load(void* dst, const TensorMap& map, const int (&c)[3], void* bar) {
  if (reinterpret_cast<uintptr_t>(dst) % 128 != 0) throw SimtError("simt: a TMA destination is not 128-byte aligned");
  const uint64_t row_bytes = uint64_t{map.box[0]} * map.elem_bytes;
  if (map.swizzle_128b && row_bytes != 128)
    throw SimtError("simt: the emulated 128-byte swizzle takes boxes of 128-byte rows only");
  char* out = static_cast<char*>(dst);
  for (uint32_t i2 = 0; i2 < map.box[2]; ++i2)
    for (uint32_t i1 = 0; i1 < map.box[1]; ++i1)
      for (uint32_t i0 = 0; i0 < map.box[0]; ++i0) {
        const int64_t g0 = int64_t{c[0]} + i0, g1 = int64_t{c[1]} + i1, g2 = int64_t{c[2]} + i2;
        uintptr_t at =
            reinterpret_cast<uintptr_t>(out) + ((uint64_t{i2} * map.box[1] + i1) * map.box[0] + i0) * map.elem_bytes;
        if (map.swizzle_128b) at = swizzle_128b(at);
        const bool inside = g0 >= 0 && g1 >= 0 && g2 >= 0 && static_cast<uint64_t>(g0) < map.dims[0] &&
                            static_cast<uint64_t>(g1) < map.dims[1] && static_cast<uint64_t>(g2) < map.dims[2];
        if (inside) {
          const char* src = static_cast<const char*>(map.base) + static_cast<uint64_t>(g0) * map.elem_bytes +
                            static_cast<uint64_t>(g1) * map.strides[1] + static_cast<uint64_t>(g2) * map.strides[2];
          std::memcpy(reinterpret_cast<void*>(at), src, map.elem_bytes);
        } else {
          std::memset(reinterpret_cast<void*>(at), 0, map.elem_bytes);
        }
      }
  mbarrier_complete_tx(bar, static_cast<unsigned>(uint64_t{map.box[0]} * map.box[1] * map.box[2] * map.elem_bytes));
}

void* dynamic_shared() {
  Scheduler& s = scheduler();
  return s.shared[s.fibers[s.running].cta];
}

void launch(Dim3 grid, unsigned block, const std::function<void()>& kernel, size_t dynamic_shared, unsigned cluster) {
  if (block == 0 || block % 32 != 0 || block > 1024)
    throw SimtError("simt::launch: block size " + std::to_string(block) + " is not 1..32 whole warps");
  if (cluster == 0 || cluster > 16 || grid.x % cluster != 0)
    throw SimtError("simt::launch: clusters of " + std::to_string(cluster) +
                    " blocks along x do not tile grid.x = " + std::to_string(grid.x));
  if (g_scheduler != nullptr) throw SimtError("simt::launch: a kernel is already running on this thread");
  Scheduler s;
  s.kernel = &kernel;
  s.block_threads = block;
  s.cluster_blocks = cluster;
  s.shared_size = dynamic_shared;
  // Every block's dynamic shared memory starts at the same alignment (4 KiB), as the same shared-memory window does on
  // a GPU: a kernel that rounds its base up finds its variables at the same offsets in every block of a cluster.
  for (unsigned r = 0; r < cluster; ++r) {
    s.shared_bytes.push_back(std::make_unique<char[]>(dynamic_shared + kSharedAlign));
    std::memset(s.shared_bytes.back().get(), 0, dynamic_shared + kSharedAlign);
    char* base = s.shared_bytes.back().get();
    s.shared.push_back(base + (kSharedAlign - reinterpret_cast<uintptr_t>(base) % kSharedAlign));
  }
  const unsigned threads = block * cluster;
  s.fibers.resize(threads);
  for (Fiber& f : s.fibers) f.stack = std::make_unique<char[]>(kStackBytes);
  s.blocks.resize(cluster);
  s.warps.resize(threads / 32);
  s.warp_slots.resize(threads / 32);
  s.warpgroups.resize((threads + 127) / 128);
  s.warpgroup_slots.resize((threads + 127) / 128);
  g_scheduler = &s;
  struct Reset {
    ~Reset() { g_scheduler = nullptr; }
  } reset;
  const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
  for (uint64_t b0 = 0; b0 < blocks; b0 += cluster) {  // one cluster at a time, its blocks together
    for (Barrier& w : s.blocks) w = Barrier{};
    s.cluster = Barrier{};
    for (Barrier& w : s.warps) w = Barrier{};
    for (Barrier& w : s.warpgroups) w = Barrier{};
    s.mbarriers.clear();
    for (unsigned i = 0; i < threads; ++i) {
      const uint64_t b = b0 + i / block;
      Fiber& f = s.fibers[i];
      f.done = false;
      f.fake_stack = nullptr;
      f.copies.clear();
      f.groups = 0;
      f.cta = i / block;
      f.index.thread_idx = {i % block, 0, 0};
      f.index.block_idx = {static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                           static_cast<unsigned>(b / grid.x / grid.y)};
      f.index.block_dim = {block, 1, 1};
      f.index.grid_dim = grid;
      f.index.lane = static_cast<int>(i % 32);
      getcontext(&f.context);
      f.context.uc_stack.ss_sp = f.stack.get();
      f.context.uc_stack.ss_size = kStackBytes;
      f.context.uc_link = nullptr;
      makecontext(&f.context, fiber_entry, 0);
    }
    s.live = threads;
    // Skewed rounds: warp w of a block runs in every period(w)-th round only, so between two block barriers the warps
    // drift apart by many steps, as they do on a GPU, and a read that a missing barrier leaves unordered against
    // another warp's write (or cp.async issue) sees the wrong bytes. Even blocks slow their later warps, odd blocks
    // their earlier ones, so either side of a race gets to be the late one. One warp of each block (warp b % warps of
    // block b, so every warp index is it in some block) is the late one: it runs only in a round in which the others
    // made no progress, i.e. once they all wait at a barrier that needs it (or spin on an mbarrier), so its writes
    // after a barrier come as late as a GPU may make them and its reads before one as late too.
    const unsigned warps_per_block = block / 32;
    std::vector<unsigned> period(threads);
    std::vector<char> late(threads);
    for (unsigned i = 0; i < threads; ++i) {
      const uint64_t b = b0 + i / block;
      const unsigned w = (i % block) / 32, skew = w % kSkewPeriods;
      period[i] = 1 + (b % 2 == 0 ? skew : kSkewPeriods - 1 - skew);
      late[i] = w == b % warps_per_block;
    }
    auto run = [&](size_t i) {
      s.running = i;
      void* main_fake = nullptr;
#if defined(EMBER_SIMT_ASAN)
      __sanitizer_start_switch_fiber(&main_fake, s.fibers[i].stack.get(), kStackBytes);
#endif
      swapcontext(&s.main, &s.fibers[i].context);
#if defined(EMBER_SIMT_ASAN)
      __sanitizer_finish_switch_fiber(main_fake, nullptr, nullptr);
#endif
      (void)main_fake;
      if (s.error) std::rethrow_exception(s.error);
    };
    uint64_t before = s.progress;
    for (uint64_t round = 0; s.live > 0; ++round) {
      const uint64_t round_start = s.progress;
      for (size_t i = 0; i < s.fibers.size(); ++i)
        if (!s.fibers[i].done && !late[i] && round % period[i] == 0) run(i);
      if (s.progress == round_start)
        for (size_t i = 0; i < s.fibers.size(); ++i)
          if (!s.fibers[i].done && late[i]) run(i);
      // A whole cycle of rounds (every thread ran at least once) in which no barrier opened and no thread finished:
      // everyone left waits for a thread that will never arrive.
      if (round % kSkewCycle == kSkewCycle - 1) {
        if (s.live > 0 && s.progress == before)
          throw SimtError("simt: deadlock in block " + std::to_string(b0) + ": " + std::to_string(s.live) +
                          " threads wait at a barrier that the others do not reach");
        before = s.progress;
      }
    }
  }
}

}  // namespace ember::testing::simt
