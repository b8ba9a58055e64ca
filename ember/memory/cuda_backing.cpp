// CudaBacking (cuda_backing.h): cudaMalloc segments, a reusable pool of cudaEvents, and expandable segments over
// the driver's virtual-memory API, whose entry points come from cudaGetDriverEntryPointByVersion.
// Invariant: state_ (events, reserved ranges, page handles) changes only under its mutex; a page is in a range's
// page table iff it is mapped and holds its own physical handle; an event id is either in use or on the free list.
#include "ember/memory/cuda_backing.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "ember/base/cuda_check.h"
#include "ember/memory/cuda_scoped.h"
#include "ember/base/error.h"
#include "ember/memory/alloc_config.h"
#include "ember/memory/cuda_device.h"

namespace ember::memory {

namespace {

// The driver functions expandable segments need. Looked up once through the runtime (no link-time libcuda, so the
// library loads on machines without a driver); `complete` is false when any is missing.
struct DriverApi {
  decltype(&::cuGetErrorString) cuGetErrorString = nullptr;
  decltype(&::cuDeviceGet) cuDeviceGet = nullptr;
  decltype(&::cuDeviceGetAttribute) cuDeviceGetAttribute = nullptr;
  decltype(&::cuMemGetAllocationGranularity) cuMemGetAllocationGranularity = nullptr;
  decltype(&::cuMemAddressReserve) cuMemAddressReserve = nullptr;
  decltype(&::cuMemAddressFree) cuMemAddressFree = nullptr;
  decltype(&::cuMemCreate) cuMemCreate = nullptr;
  decltype(&::cuMemRelease) cuMemRelease = nullptr;
  decltype(&::cuMemMap) cuMemMap = nullptr;
  decltype(&::cuMemUnmap) cuMemUnmap = nullptr;
  decltype(&::cuMemSetAccess) cuMemSetAccess = nullptr;
  bool complete = false;  // the functions above (expandable segments)
  decltype(&::cuDevicePrimaryCtxGetState) cuDevicePrimaryCtxGetState = nullptr;  // optional (pinning_device)
};

template <class Fn>
bool load_entry(const char* symbol, Fn& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  // 12000: the ABI of each symbol as of CUDA 12.0 (all of these date from 10.2 and kept their signatures).
  cudaError_t st = cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &found);
  if (st != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr) {
    (void)cudaGetLastError();
    return false;
  }
  fn = reinterpret_cast<Fn>(p);
  return true;
}

const DriverApi& driver_api() {
  static const DriverApi api = [] {
    DriverApi a;
    bool ok = load_entry("cuGetErrorString", a.cuGetErrorString);
    ok = load_entry("cuDeviceGet", a.cuDeviceGet) && ok;
    ok = load_entry("cuDeviceGetAttribute", a.cuDeviceGetAttribute) && ok;
    ok = load_entry("cuMemGetAllocationGranularity", a.cuMemGetAllocationGranularity) && ok;
    ok = load_entry("cuMemAddressReserve", a.cuMemAddressReserve) && ok;
    ok = load_entry("cuMemAddressFree", a.cuMemAddressFree) && ok;
    ok = load_entry("cuMemCreate", a.cuMemCreate) && ok;
    ok = load_entry("cuMemRelease", a.cuMemRelease) && ok;
    ok = load_entry("cuMemMap", a.cuMemMap) && ok;
    ok = load_entry("cuMemUnmap", a.cuMemUnmap) && ok;
    ok = load_entry("cuMemSetAccess", a.cuMemSetAccess) && ok;
    a.complete = ok;
    if (!load_entry("cuDevicePrimaryCtxGetState", a.cuDevicePrimaryCtxGetState)) a.cuDevicePrimaryCtxGetState = nullptr;
    return a;
  }();
  return api;
}

[[noreturn]] void throw_cu_error(const char* expr, CUresult status, const char* file, int line) {
  const char* text = nullptr;
  const DriverApi& api = driver_api();
  if (api.cuGetErrorString == nullptr || api.cuGetErrorString(status, &text) != CUDA_SUCCESS || text == nullptr)
    text = "unknown CUresult";
  const std::string status_text = detail::concat(text, " (", static_cast<int>(status), ")");
  detail::throw_backend_error("CUDA driver", expr, status_text.c_str(), file, line);
}

}  // namespace

}  // namespace ember::memory

// The checked-call macro for the CUDA driver API (the CUresult member of the EMBER_CUDA_CHECK family).
#define EMBER_CU_CHECK(expr)                                                                     \
  do {                                                                                           \
    CUresult ember_cu_status_ = (expr);                                                          \
    if (ember_cu_status_ != CUDA_SUCCESS)                                                        \
      ::ember::memory::throw_cu_error(#expr, ember_cu_status_, __FILE__, __LINE__);              \
  } while (0)

namespace ember::memory {

namespace {

using cuda::ScopedDevice;
using cuda::to_stream;


int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

}  // namespace

struct CudaBacking::State {
  // A reserved virtual range: its size and the physical handle of every mapped page (page address -> handle).
  struct Range {
    int64_t size = 0;
    std::map<uintptr_t, CUmemGenericAllocationHandle> pages;
  };

  mutable std::mutex mutex;
  int64_t total = 0;
  CUdevice cu_device = 0;
  bool expandable = false;
  int64_t page = 2 * kMiB;
  CUmemAllocationProp prop{};
  CUmemAccessDesc access{};
  std::vector<cudaEvent_t> events;  // EventId k is events[k - 1]
  std::vector<char> in_use;          // in_use[k - 1]: EventId k is handed out (not on free_events)
  std::vector<EventId> free_events;
  std::map<uintptr_t, Range> ranges;  // base address -> range
  int64_t mapped_pages = 0;

  // The range that holds [addr, addr + nbytes); ValueError naming `op` otherwise.
  std::map<uintptr_t, Range>::iterator range_of(uintptr_t addr, int64_t nbytes, const char* op) {
    auto it = ranges.upper_bound(addr);
    EMBER_CHECK(it != ranges.begin(), ValueError, "CudaBacking::", op, ": ", reinterpret_cast<void*>(addr),
                " is not inside a reserved range");
    --it;
    EMBER_CHECK(addr + static_cast<uintptr_t>(nbytes) <= it->first + static_cast<uintptr_t>(it->second.size),
                ValueError, "CudaBacking::", op, ": [", reinterpret_cast<void*>(addr), ", +", nbytes,
                ") runs past the reserved range at ", reinterpret_cast<void*>(it->first));
    return it;
  }

  cudaEvent_t event(EventId id, const char* op) const {
    EMBER_CHECK(id >= 1 && id <= events.size(), ValueError, "CudaBacking::", op, ": unknown event id ", id);
    return events[id - 1];
  }

  // Unmaps and releases the pages in [addr, addr + nbytes) of `range` that are mapped. The caller has synchronised.
  void unmap_pages(Range& range, uintptr_t addr, int64_t nbytes) {
    const DriverApi& api = driver_api();
    auto it = range.pages.lower_bound(addr);
    while (it != range.pages.end() && it->first < addr + static_cast<uintptr_t>(nbytes)) {
      EMBER_CU_CHECK(api.cuMemUnmap(static_cast<CUdeviceptr>(it->first), static_cast<size_t>(page)));
      EMBER_CU_CHECK(api.cuMemRelease(it->second));
      it = range.pages.erase(it);
      --mapped_pages;
    }
  }
};

CudaBacking::CudaBacking(int device) : device_(device), state_(std::make_unique<State>()) {
  ScopedDevice scoped(device_);
  size_t free_b = 0, total_b = 0;
  EMBER_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  state_->total = static_cast<int64_t>(total_b);

  const DriverApi& api = driver_api();
  if (!api.complete) return;  // an old driver: fixed segments only
  // A device whose virtual-memory support cannot be queried gets fixed segments too, rather than no allocator.
  int vmm = 0;
  if (api.cuDeviceGet(&state_->cu_device, device_) != CUDA_SUCCESS ||
      api.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, state_->cu_device) !=
          CUDA_SUCCESS ||
      vmm == 0)
    return;
  CUmemAllocationProp& prop = state_->prop;
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = state_->cu_device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  state_->access.location = prop.location;
  state_->access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  size_t granularity = 0;
  if (api.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) return;
  const int64_t g = std::max<int64_t>(static_cast<int64_t>(granularity), 1);
  state_->page = round_up(2 * kMiB, g);
  state_->expandable = true;
}

CudaBacking::~CudaBacking() {
  // Best effort and silent: at process exit the runtime may already be unloading.
  std::lock_guard<std::mutex> lock(state_->mutex);
  int previous = 0;
  const bool have_previous = cudaGetDevice(&previous) == cudaSuccess;
  (void)cudaSetDevice(device_);
  const DriverApi& api = driver_api();
  if (!state_->ranges.empty()) {
    (void)cudaDeviceSynchronize();
    for (auto& [base, range] : state_->ranges) {
      for (auto& [addr, handle] : range.pages) {
        (void)api.cuMemUnmap(static_cast<CUdeviceptr>(addr), static_cast<size_t>(state_->page));
        (void)api.cuMemRelease(handle);
      }
      (void)api.cuMemAddressFree(static_cast<CUdeviceptr>(base), static_cast<size_t>(range.size));
    }
  }
  for (cudaEvent_t e : state_->events) (void)cudaEventDestroy(e);
  if (have_previous) (void)cudaSetDevice(previous);
  (void)cudaGetLastError();
}

std::string CudaBacking::name() const { return detail::concat("cuda:", device_); }

void* CudaBacking::malloc(int64_t nbytes) {
  EMBER_CHECK(nbytes > 0, ValueError, "CudaBacking::malloc: size must be positive, got ", nbytes);
  ScopedDevice scoped(device_);
  void* p = nullptr;
  cudaError_t st = cudaMalloc(&p, static_cast<size_t>(nbytes));
  if (st == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky, but clear it so later checks do not see it
    return nullptr;
  }
  EMBER_CUDA_CHECK(st);
  return p;
}

void CudaBacking::free(void* ptr, int64_t) {
  if (ptr == nullptr) return;
  ScopedDevice scoped(device_);
  EMBER_CUDA_CHECK(cudaFree(ptr));
}

int64_t CudaBacking::capacity() const { return state_->total; }

int64_t CudaBacking::available() const {
  ScopedDevice scoped(device_);
  size_t free_b = 0, total_b = 0;
  EMBER_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<int64_t>(free_b);
}

EventId CudaBacking::record_event(StreamId stream) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  ScopedDevice scoped(device_);
  EventId id = 0;
  if (!state_->free_events.empty()) {
    id = state_->free_events.back();
    state_->free_events.pop_back();
  } else {
    cudaEvent_t e = nullptr;
    EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    try {
      state_->events.push_back(e);
      state_->in_use.push_back(0);
    } catch (...) {
      if (state_->events.size() > state_->in_use.size()) state_->events.pop_back();
      (void)cudaEventDestroy(e);
      throw;
    }
    id = state_->events.size();
  }
  cudaError_t st = cudaEventRecord(state_->events[id - 1], to_stream(stream));
  if (st != cudaSuccess) state_->free_events.push_back(id);  // the event stays pooled
  EMBER_CUDA_CHECK(st);
  state_->in_use[id - 1] = 1;
  return id;
}

bool CudaBacking::event_completed(EventId event) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  cudaEvent_t e = state_->event(event, "event_completed");
  cudaError_t st = cudaEventQuery(e);
  if (st == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  EMBER_CUDA_CHECK(st);
  return true;
}

void CudaBacking::release_event(EventId event) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  (void)state_->event(event, "release_event");
  EMBER_CHECK(state_->in_use[event - 1] != 0, ValueError, "CudaBacking::release_event: event ", event,
              " released twice");
  state_->free_events.push_back(event);
  state_->in_use[event - 1] = 0;
}

void CudaBacking::synchronize() {
  ScopedDevice scoped(device_);
  EMBER_CUDA_CHECK(cudaDeviceSynchronize());
}

void CudaBacking::fill(void* ptr, int64_t nbytes, unsigned char byte, StreamId stream) {
  ScopedDevice scoped(device_);
  EMBER_CUDA_CHECK(cudaMemsetAsync(ptr, byte, static_cast<size_t>(nbytes), to_stream(stream)));
}

bool CudaBacking::supports_expandable() const { return state_->expandable; }

int64_t CudaBacking::page_size() const { return state_->page; }

void* CudaBacking::reserve_range(int64_t nbytes) {
  EMBER_CHECK(state_->expandable, DeviceError, "CudaBacking::reserve_range: cuda:", device_,
              " does not support expandable segments (the driver's virtual-memory API is unavailable)");
  EMBER_CHECK(nbytes > 0, ValueError, "CudaBacking::reserve_range: size must be positive, got ", nbytes);
  const int64_t size = round_up(nbytes, state_->page);
  const DriverApi& api = driver_api();
  std::lock_guard<std::mutex> lock(state_->mutex);
  ScopedDevice scoped(device_);
  CUdeviceptr base = 0;
  CUresult st = api.cuMemAddressReserve(&base, static_cast<size_t>(size), static_cast<size_t>(state_->page), 0, 0);
  if (st == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;  // virtual address space exhausted
  EMBER_CU_CHECK(st);
  state_->ranges[static_cast<uintptr_t>(base)].size = size;
  return reinterpret_cast<void*>(static_cast<uintptr_t>(base));
}

bool CudaBacking::map(void* addr, int64_t nbytes) {
  const int64_t page = state_->page;
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  EMBER_CHECK(nbytes > 0 && nbytes % page == 0 && a % static_cast<uintptr_t>(page) == 0, ValueError,
              "CudaBacking::map: [", addr, ", +", nbytes, ") is not a whole number of ", page, "-byte pages");
  const DriverApi& api = driver_api();
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto& range = state_->range_of(a, nbytes, "map")->second;
  auto first = range.pages.lower_bound(a);
  EMBER_CHECK(first == range.pages.end() || first->first >= a + static_cast<uintptr_t>(nbytes), ValueError,
              "CudaBacking::map: page ", reinterpret_cast<void*>(first->first), " is already mapped");
  ScopedDevice scoped(device_);

  // Pages mapped by this call, undone if a later page fails so that a failed map leaves nothing behind.
  std::vector<std::pair<uintptr_t, CUmemGenericAllocationHandle>> done;
  auto roll_back = [&] {
    for (auto& [p, h] : done) {
      (void)api.cuMemUnmap(static_cast<CUdeviceptr>(p), static_cast<size_t>(page));
      (void)api.cuMemRelease(h);
    }
  };
  try {
    for (uintptr_t p = a; p < a + static_cast<uintptr_t>(nbytes); p += static_cast<uintptr_t>(page)) {
      CUmemGenericAllocationHandle h = 0;
      CUresult st = api.cuMemCreate(&h, static_cast<size_t>(page), &state_->prop, 0);
      if (st == CUDA_ERROR_OUT_OF_MEMORY) {
        roll_back();
        return false;
      }
      EMBER_CU_CHECK(st);
      st = api.cuMemMap(static_cast<CUdeviceptr>(p), static_cast<size_t>(page), 0, h, 0);
      if (st != CUDA_SUCCESS) (void)api.cuMemRelease(h);
      EMBER_CU_CHECK(st);
      done.emplace_back(p, h);
    }
    EMBER_CU_CHECK(api.cuMemSetAccess(static_cast<CUdeviceptr>(a), static_cast<size_t>(nbytes), &state_->access, 1));
  } catch (...) {
    roll_back();
    throw;
  }
  for (auto& [p, h] : done) range.pages.emplace(p, h);
  state_->mapped_pages += static_cast<int64_t>(done.size());
  return true;
}

void CudaBacking::unmap(void* addr, int64_t nbytes) {
  const int64_t page = state_->page;
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  EMBER_CHECK(nbytes > 0 && nbytes % page == 0 && a % static_cast<uintptr_t>(page) == 0, ValueError,
              "CudaBacking::unmap: [", addr, ", +", nbytes, ") is not a whole number of ", page, "-byte pages");
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto& range = state_->range_of(a, nbytes, "unmap")->second;
  ScopedDevice scoped(device_);
  // Unlike cudaFree, cuMemUnmap does not wait for queued work that may still touch the pages.
  EMBER_CUDA_CHECK(cudaDeviceSynchronize());
  state_->unmap_pages(range, a, nbytes);
}

void CudaBacking::release_range(void* addr, int64_t) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto it = state_->ranges.find(a);
  EMBER_CHECK(it != state_->ranges.end(), ValueError, "CudaBacking::release_range: ", addr,
              " is not the start of a reserved range");
  ScopedDevice scoped(device_);
  if (!it->second.pages.empty()) {
    EMBER_CUDA_CHECK(cudaDeviceSynchronize());
    state_->unmap_pages(it->second, a, it->second.size);
  }
  EMBER_CU_CHECK(driver_api().cuMemAddressFree(static_cast<CUdeviceptr>(a), static_cast<size_t>(it->second.size)));
  state_->ranges.erase(it);
}

int64_t CudaBacking::mapped_pages() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->mapped_pages;
}

int64_t CudaBacking::pooled_events() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return static_cast<int64_t>(state_->events.size());
}

// cuda_backing.h. When the driver cannot say, callers behave as before: as if the context were active.
bool primary_context_active(int device) noexcept {
  const DriverApi& api = driver_api();
  if (api.cuDeviceGet == nullptr || api.cuDevicePrimaryCtxGetState == nullptr) return true;
  CUdevice dev = 0;
  unsigned int flags = 0;
  int active = 0;
  if (api.cuDeviceGet(&dev, device) != CUDA_SUCCESS ||
      api.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS)
    return true;
  return active != 0;
}

int pinning_device() {
  int current = 0;
  if (cudaGetDevice(&current) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (primary_context_active(current)) return current;
  for (int d = 0; d < cuda::device_count(); ++d)
    if (primary_context_active(d)) return d;
  return current;
}

std::unique_ptr<Backing> make_cuda_backing(int device) {
  const int n = cuda::device_count();
  EMBER_CHECK(device >= 0 && device < n, DeviceError, "make_cuda_backing: cuda:", device, " is not available (", n,
              " CUDA device(s) visible)");
  return std::make_unique<CudaBacking>(device);
}

}  // namespace ember::memory
