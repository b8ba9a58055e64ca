// ProcessGroup's shared checks, the default group (init/finalize) and the launch environment (rank, size, local
// rank). Invariant: the default group is made at most once per process and released before MPI is finalized.
#include "ember/dist/process_group.h"

#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "ember/base/error.h"

#if defined(EMBER_WITH_MPI)
#include "ember/dist/mpi_process_group.h"
#endif
#include "ember/dist/nccl_process_group.h"

namespace ember::dist {

const char* reduce_op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "avg"; }

void ProcessGroup::check_tensor(const char* op, const Tensor& t) const {
  EMBER_CHECK(t.defined(), ValueError, "dist::", op, ": undefined tensor");
  const Device d = device();
  EMBER_CHECK(t.device().type == d.type && (!d.is_cuda() || t.device().index == d.index), DeviceError, "dist::", op,
              ": the ", backend(), " process group takes tensors on ", d.str(), ", got ", t.description());
  EMBER_CHECK(t.is_contiguous(), ValueError, "dist::", op, ": ", t.description(),
              " is not contiguous (collectives take flat, contiguous tensors)");
}

void ProcessGroup::check_same_dtype(const char* op, const Tensor& a, const Tensor& b) const {
  EMBER_CHECK(a.dtype() == b.dtype(), DTypeError, "dist::", op, ": output ", a.description(), " and input ",
              b.description(), " differ in dtype");
}

void ProcessGroup::check_root(const char* op, int root) const {
  EMBER_CHECK(root >= 0 && root < size(), ValueError, "dist::", op, ": root ", root, " outside [0, ", size(), ")");
}

namespace {
class CompletedWork : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

std::mutex& state_lock() {
  static std::mutex m;
  return m;
}
std::shared_ptr<ProcessGroup> g_default;
bool g_atexit = false;

int env_int(const char* const* names, int fallback) {
  for (const char* const* n = names; *n; ++n)
    if (const char* v = std::getenv(*n); v && *v) return std::atoi(v);
  return fallback;
}
}  // namespace

WorkPtr completed_work() { return std::make_shared<CompletedWork>(); }

// Note [NCCL without MPI]
// NCCL needs every rank to share one ncclUniqueId, which ember sends over MPI. A launch of one process needs no
// exchange: rank 0 makes the id and is the only rank. So a CUDA build that found NCCL but no MPI (the GPU machines
// this project is checked on carry no OpenMPI) still has the NCCL backend at world size 1 — a real communicator whose
// collectives run through NCCL on its own stream, which is what DDP and ZeRO-1 use over one GPU — and init(nccl) /
// new_nccl_group() refuse a larger launch with a ValueError instead of hanging. The bootstrap is then SingleProcess,
// a group of one whose only use is the id's broadcast (a no-op at size 1).
#if defined(EMBER_WITH_NCCL)
namespace {
class SingleProcess : public ProcessGroup {
 public:
  SingleProcess() : ProcessGroup(0, 1) {}
  std::string backend() const override { return "single-process"; }
  Device device() const override { return Device::cpu(); }
  WorkPtr all_reduce(const Tensor&, ReduceOp) override { return completed_work(); }
  WorkPtr reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp) override {
    Tensor(output).copy_(input);
    return completed_work();
  }
  WorkPtr all_gather(const Tensor& output, const Tensor& input) override {
    Tensor(output).copy_(input.reshape(output.sizes()));
    return completed_work();
  }
  WorkPtr broadcast(const Tensor&, int) override { return completed_work(); }
  WorkPtr barrier() override { return completed_work(); }
};

// The NCCL group, bootstrapped over `mpi` when given, else over a single process (a one-process launch only).
std::shared_ptr<ProcessGroup> make_nccl(ProcessGroup* mpi) {
  if (mpi != nullptr) return detail::make_nccl_process_group(*mpi, local_rank());
  EMBER_CHECK(world_size() == 1, ValueError, "dist: the NCCL backend without MPI serves a launch of one process, this "
              "one has ", world_size(), " (build with OpenMPI to bootstrap NCCL across processes)");
  SingleProcess bootstrap;
  return detail::make_nccl_process_group(bootstrap, local_rank());
}
}  // namespace
#endif

// Note [Work errors]
// A collective that fails while in flight (MPI returns an error from MPI_Test, or the completion's copy throws) must
// neither be reported as success to a later waiter nor polled again (the request is gone). The first failure is kept
// and the Work counts as completed: wait() rethrows it every time, including from another thread, and the
// destructor's wait swallows it. Buffers stay alive with the Work, so a failed request never writes freed memory.
bool PolledWork::is_completed() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (done_) return true;
  try {
    done_ = poll();
  } catch (...) {
    error_ = std::current_exception();
    done_ = true;
  }
  return done_;
}

void PolledWork::wait() {
  while (!is_completed()) std::this_thread::yield();
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_) std::rethrow_exception(error_);
}

bool is_available() {
#if defined(EMBER_WITH_MPI)
  return true;
#else
  return false;
#endif
}

bool is_nccl_available() {
#if defined(EMBER_WITH_NCCL)
  return true;
#else
  return false;
#endif
}

std::shared_ptr<ProcessGroup> init(Backend backend) {
  std::lock_guard<std::mutex> lock(state_lock());
  const char* wanted = backend == Backend::Mpi ? "mpi" : "nccl";
  if (g_default) {
    EMBER_CHECK(g_default->backend() == wanted, ValueError, "dist::init(", wanted, "): the default group is ",
                g_default->backend(), " already");
    return g_default;
  }
#if defined(EMBER_WITH_NCCL) && !defined(EMBER_WITH_MPI)
  if (backend == Backend::Nccl) {  // Note [NCCL without MPI]
    g_default = make_nccl(nullptr);
    if (!g_atexit) {  // the communicator goes while the CUDA runtime is still there
      std::atexit([] { finalize(); });
      g_atexit = true;
    }
    return g_default;
  }
#endif
  EMBER_CHECK(is_available(), ValueError,
              "dist::init: ember was built without MPI (install OpenMPI, e.g. scripts/setup-deps, and reconfigure)");
#if defined(EMBER_WITH_MPI)
  detail::mpi_init_once();
  if (!g_atexit) {
    std::atexit([] { finalize(); });
    g_atexit = true;
  }
  if (backend == Backend::Mpi) {
    g_default = detail::make_mpi_process_group();
  } else {
    EMBER_CHECK(is_nccl_available(), ValueError, "dist::init(nccl): ember was built without NCCL (a CUDA build "
                "finds it beside the CUDA toolkit)");
#if defined(EMBER_WITH_NCCL)
    auto bootstrap = detail::make_mpi_process_group();
    g_default = detail::make_nccl_process_group(*bootstrap, detail::mpi_local_rank());
#endif
  }
#endif
  return g_default;
}

std::shared_ptr<ProcessGroup> new_nccl_group() {
  EMBER_CHECK(is_nccl_available(), ValueError, "dist::new_nccl_group: ember was built without NCCL (a CUDA build "
              "finds it beside the CUDA toolkit, or through NCCL_ROOT)");
#if defined(EMBER_WITH_NCCL)
  std::shared_ptr<ProcessGroup> mpi;
  {
    std::lock_guard<std::mutex> lock(state_lock());
    if (g_default && g_default->backend() == "mpi") mpi = g_default;
  }
  EMBER_CHECK(mpi != nullptr || world_size() == 1, ValueError, "dist::new_nccl_group: a launch of ", world_size(),
              " processes bootstraps NCCL over MPI: call dist::init() (the MPI default group) first");
  return make_nccl(mpi.get());
#else
  return nullptr;
#endif
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(state_lock());
  return g_default != nullptr;
}

std::shared_ptr<ProcessGroup> default_group_ptr() {
  std::lock_guard<std::mutex> lock(state_lock());
  EMBER_CHECK(g_default != nullptr, ValueError, "dist: no default process group; call dist::init() first");
  return g_default;
}

ProcessGroup& default_group() { return *default_group_ptr(); }

void finalize() {
  std::shared_ptr<ProcessGroup> group;
  {
    std::lock_guard<std::mutex> lock(state_lock());
    group = std::move(g_default);
    g_default.reset();
  }
  group.reset();
#if defined(EMBER_WITH_MPI)
  detail::mpi_finalize_if_owned();
#endif
}

int world_rank() {
#if defined(EMBER_WITH_MPI)
  if (detail::mpi_is_initialized()) return detail::mpi_world_rank();
#endif
  static const char* const names[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", nullptr};
  return env_int(names, 0);
}

int world_size() {
#if defined(EMBER_WITH_MPI)
  if (detail::mpi_is_initialized()) return detail::mpi_world_size();
#endif
  static const char* const names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", nullptr};
  return env_int(names, 1);
}

int local_rank() {
  static const char* const names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK",
                                      nullptr};
  const int from_env = env_int(names, -1);
  if (from_env >= 0) return from_env;
#if defined(EMBER_WITH_MPI)
  if (detail::mpi_is_initialized()) return detail::mpi_local_rank();
#endif
  return 0;
}

#if !defined(EMBER_WITH_NCCL)
namespace detail {
std::string nccl_version() { return ""; }
}  // namespace detail
#endif

}  // namespace ember::dist
