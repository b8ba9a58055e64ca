// Host and simulated backings: raw segments, events and (simulated) virtual-memory ranges for the caching allocator.
// Invariant (SimulatedBacking): used == bytes of live segments + mapped pages, always <= capacity; every address it
// handed out and has not taken back is in segments or ranges; all of it is guarded by one mutex.
#include "ember/memory/backing.h"

#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "ember/base/error.h"
#include "ember/memory/alloc_config.h"

namespace ember::memory {

namespace {

constexpr int64_t kSegmentAlignment = 512;
constexpr uintptr_t kFakeBase = 0x10000000000ULL;  // 1 TiB: fake addresses are far from anything real

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

class HostBacking final : public Backing {
 public:
  std::string name() const override { return "host"; }
  void* malloc(int64_t nbytes) override {
    EMBER_CHECK(nbytes > 0, ValueError, "host backing: malloc of ", nbytes, " bytes");
    return std::aligned_alloc(kSegmentAlignment, static_cast<size_t>(round_up(nbytes, kSegmentAlignment)));
  }
  void free(void* ptr, int64_t) override { std::free(ptr); }
  int64_t capacity() const override { return kNoLimit; }
  int64_t available() const override { return kNoLimit; }
  // Host work is synchronous: an event is complete as soon as it is recorded.
  EventId record_event(StreamId) override { return next_event_.fetch_add(1, std::memory_order_relaxed); }
  bool event_completed(EventId) override { return true; }
  void release_event(EventId) override {}
  void synchronize() override {}

 private:
  std::atomic<EventId> next_event_{1};
};

}  // namespace

std::unique_ptr<Backing> make_host_backing() { return std::make_unique<HostBacking>(); }

// ---- SimulatedBacking ------------------------------------------------------------------------------------------

struct SimulatedBacking::State {
  struct Range {
    int64_t size = 0;           // reserved bytes (a multiple of the page size)
    std::vector<bool> mapped;   // one flag per page
    void* mmap_base = nullptr;  // materialised: what mmap returned (before trimming to page alignment)
    int64_t mmap_size = 0;
  };
  std::mutex mutex;
  int64_t used = 0;
  int64_t device_requests = 0, event_ops = 0;  // lifetime counts (num_device_requests, num_event_ops)
  uintptr_t next_fake = kFakeBase;
  EventId next_event = 1;
  std::unordered_map<EventId, bool> events;         // id -> completed
  std::unordered_map<uintptr_t, int64_t> segments;  // base -> bytes
  std::map<uintptr_t, Range> ranges;                // base -> range (ordered: lookup of the range holding an address)

  uintptr_t fake(int64_t nbytes, int64_t alignment) {
    next_fake = static_cast<uintptr_t>(round_up(static_cast<int64_t>(next_fake), alignment));
    const uintptr_t p = next_fake;
    next_fake += static_cast<uintptr_t>(round_up(nbytes, alignment));
    return p;
  }

  // The range holding [addr, addr + nbytes) with both ends on page boundaries; throws otherwise.
  std::pair<uintptr_t, Range*> find_pages(void* addr, int64_t nbytes, int64_t page, const char* op) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
    auto it = ranges.upper_bound(a);
    EMBER_CHECK(it != ranges.begin(), ValueError, "SimulatedBacking::", op, ": ", addr,
                " is not inside a reserved range");
    --it;
    Range& r = it->second;
    const int64_t off = static_cast<int64_t>(a - it->first);
    EMBER_CHECK(nbytes >= 0 && off + nbytes <= r.size, ValueError, "SimulatedBacking::", op, ": [", addr, ", +", nbytes,
                ") is not inside the reserved range at ", reinterpret_cast<void*>(it->first), " of ", r.size, " bytes");
    EMBER_CHECK(off % page == 0 && nbytes % page == 0, ValueError, "SimulatedBacking::", op, ": [", addr, ", +", nbytes,
                ") does not start and end on ", page, "-byte page boundaries");
    return {it->first, &r};
  }
};

SimulatedBacking::SimulatedBacking(int64_t capacity, bool materialize)
    : capacity_(capacity), materialize_(materialize), state_(std::make_unique<State>()) {
  EMBER_CHECK(capacity > 0, ValueError, "SimulatedBacking: capacity must be positive, got ", capacity);
}

SimulatedBacking::~SimulatedBacking() {
  if (!materialize_) return;
  for (auto& [p, n] : state_->segments) std::free(reinterpret_cast<void*>(p));
  for (auto& [p, r] : state_->ranges) munmap(r.mmap_base, static_cast<size_t>(r.mmap_size));
}

std::string SimulatedBacking::name() const {
  return "simulated device (" + (capacity_ == kNoLimit ? std::string("unbounded") : format_bytes(capacity_)) +
         (materialize_ ? ")" : ", address-only)");
}

int64_t SimulatedBacking::used() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->used;
}

int64_t SimulatedBacking::num_device_requests() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->device_requests;
}

int64_t SimulatedBacking::num_event_ops() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->event_ops;
}

int64_t SimulatedBacking::available() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return capacity_ - state_->used;
}

void* SimulatedBacking::malloc(int64_t nbytes) {
  EMBER_CHECK(nbytes > 0, ValueError, "SimulatedBacking::malloc: ", nbytes, " bytes");
  std::lock_guard<std::mutex> lock(state_->mutex);
  ++state_->device_requests;
  if (device_faults_.next()) return nullptr;              // an injected fault: the device says it is full
  if (nbytes > capacity_ - state_->used) return nullptr;  // out of room (written so that it cannot overflow)
  void* p;
  if (materialize_) {
    p = std::aligned_alloc(kSegmentAlignment, static_cast<size_t>(round_up(nbytes, kSegmentAlignment)));
    if (p == nullptr) return nullptr;  // the host itself is out of memory: out of room as well
  } else {
    p = reinterpret_cast<void*>(state_->fake(nbytes, kSegmentAlignment));
  }
  try {
    state_->segments.emplace(reinterpret_cast<uintptr_t>(p), nbytes);
  } catch (...) {
    if (materialize_) std::free(p);
    throw;
  }
  state_->used += nbytes;
  ++num_mallocs_;
  return p;
}

void SimulatedBacking::free(void* ptr, int64_t nbytes) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto it = state_->segments.find(reinterpret_cast<uintptr_t>(ptr));
  EMBER_CHECK(it != state_->segments.end(), ValueError, "SimulatedBacking::free: ", ptr,
              " is not a live segment of this backing");
  EMBER_CHECK(it->second == nbytes, ValueError, "SimulatedBacking::free: segment ", ptr, " has ", it->second,
              " bytes, freed as ", nbytes);
  state_->used -= nbytes;
  state_->segments.erase(it);
  ++num_frees_;
  if (materialize_) std::free(ptr);
}

EventId SimulatedBacking::record_event(StreamId stream) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  const int64_t op = state_->event_ops++;
  if (event_faults_.next())
    EMBER_THROW(BackendError, "SimulatedBacking::record_event: injected failure of event operation ", op,
                " (stream ", stream, ")");
  const EventId id = state_->next_event++;
  state_->events.emplace(id, false);
  return id;
}

bool SimulatedBacking::event_completed(EventId event) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto it = state_->events.find(event);
  EMBER_CHECK(it != state_->events.end(), ValueError, "SimulatedBacking::event_completed: unknown event ", event);
  return it->second;
}

void SimulatedBacking::release_event(EventId event) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  EMBER_CHECK(state_->events.erase(event) == 1, ValueError, "SimulatedBacking::release_event: unknown event ", event);
}

void SimulatedBacking::complete_events() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  for (auto& [id, done] : state_->events) done = true;
}

// Expandable segments. A range is address space only; map() makes pages of it count against the capacity and,
// when materialised, usable (mprotect read/write on an mmap(PROT_NONE) reservation); unmap() drops the pages'
// contents (madvise DONTNEED) and makes them inaccessible again.
void* SimulatedBacking::reserve_range(int64_t nbytes) {
  EMBER_CHECK(nbytes > 0, ValueError, "SimulatedBacking::reserve_range: ", nbytes, " bytes");
  const int64_t page = page_size();
  const int64_t size = round_up(nbytes, page);
  State::Range r;
  r.size = size;
  uintptr_t base;
  if (materialize_) {
    // Over-reserve one page so that the range can start on a page-size boundary, then give back the ends.
    const int64_t total = size + page;
    void* m = mmap(nullptr, static_cast<size_t>(total), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return nullptr;  // no address space left
    const uintptr_t raw = reinterpret_cast<uintptr_t>(m);
    base = static_cast<uintptr_t>(round_up(static_cast<int64_t>(raw), page));
    const size_t head = base - raw;
    const size_t tail = static_cast<size_t>(total) - head - static_cast<size_t>(size);
    if (head > 0) munmap(m, head);
    if (tail > 0) munmap(reinterpret_cast<void*>(base + static_cast<uintptr_t>(size)), tail);
    r.mmap_base = reinterpret_cast<void*>(base);
    r.mmap_size = size;
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (!materialize_) base = state_->fake(size, page);
  r.mapped.assign(static_cast<size_t>(size / page), false);
  state_->ranges.emplace(base, std::move(r));
  return reinterpret_cast<void*>(base);
}

bool SimulatedBacking::map(void* addr, int64_t nbytes) {
  const int64_t page = page_size();
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto [base, r] = state_->find_pages(addr, nbytes, page, "map");
  const size_t first = static_cast<size_t>((reinterpret_cast<uintptr_t>(addr) - base) / static_cast<uintptr_t>(page));
  const size_t count = static_cast<size_t>(nbytes / page);
  for (size_t i = first; i < first + count; ++i)
    EMBER_CHECK(!r->mapped[i], ValueError, "SimulatedBacking::map: page at ",
                reinterpret_cast<void*>(base + i * static_cast<uintptr_t>(page)), " is already mapped");
  ++state_->device_requests;
  if (device_faults_.next()) return false;  // an injected fault: the device says it is full
  if (nbytes > capacity_ - state_->used) return false;
  if (materialize_ && nbytes > 0 && mprotect(addr, static_cast<size_t>(nbytes), PROT_READ | PROT_WRITE) != 0)
    EMBER_THROW(DeviceError, "SimulatedBacking::map: mprotect failed: ", std::strerror(errno));
  for (size_t i = first; i < first + count; ++i) r->mapped[i] = true;
  state_->used += nbytes;
  return true;
}

namespace {
void release_pages(void* addr, int64_t nbytes) {
  if (nbytes <= 0) return;
  madvise(addr, static_cast<size_t>(nbytes), MADV_DONTNEED);
  if (mprotect(addr, static_cast<size_t>(nbytes), PROT_NONE) != 0)
    EMBER_THROW(DeviceError, "SimulatedBacking::unmap: mprotect failed: ", std::strerror(errno));
}
}  // namespace

void SimulatedBacking::unmap(void* addr, int64_t nbytes) {
  const int64_t page = page_size();
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto [base, r] = state_->find_pages(addr, nbytes, page, "unmap");
  const size_t first = static_cast<size_t>((reinterpret_cast<uintptr_t>(addr) - base) / static_cast<uintptr_t>(page));
  const size_t count = static_cast<size_t>(nbytes / page);
  for (size_t i = first; i < first + count; ++i)
    EMBER_CHECK(r->mapped[i], ValueError, "SimulatedBacking::unmap: page at ",
                reinterpret_cast<void*>(base + i * static_cast<uintptr_t>(page)), " is not mapped");
  if (materialize_) release_pages(addr, nbytes);
  for (size_t i = first; i < first + count; ++i) r->mapped[i] = false;
  state_->used -= nbytes;
}

// Pages still mapped when a range is released are unmapped with it (their bytes return to the capacity).
void SimulatedBacking::release_range(void* addr, int64_t nbytes) {
  const int64_t page = page_size();
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto it = state_->ranges.find(reinterpret_cast<uintptr_t>(addr));
  EMBER_CHECK(it != state_->ranges.end(), ValueError, "SimulatedBacking::release_range: ", addr,
              " is not the start of a reserved range");
  State::Range& r = it->second;
  EMBER_CHECK(round_up(nbytes, page) == r.size, ValueError, "SimulatedBacking::release_range: the range at ", addr,
              " has ", r.size, " bytes, released as ", nbytes);
  int64_t mapped = 0;
  for (bool m : r.mapped) mapped += m ? page : 0;
  if (materialize_) munmap(r.mmap_base, static_cast<size_t>(r.mmap_size));
  state_->used -= mapped;
  state_->ranges.erase(it);
}

std::unique_ptr<SimulatedBacking> make_simulated_backing(int64_t capacity, bool materialize) {
  return std::make_unique<SimulatedBacking>(capacity, materialize);
}

}  // namespace ember::memory
