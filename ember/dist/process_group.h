// ProcessGroup: the collective-communication interface of dist/ (torch.distributed's ProcessGroup) with asynchronous
// Work handles, and the entry points that make the default group from the MPI environment (dist::init).
// Invariant: every rank issues the same collectives in the same order; a collective's tensors stay alive and unread
// (outputs) / unwritten (inputs) until its Work completed — the Work keeps them alive itself.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ember/core/tensor.h"

namespace ember::dist {

enum class ReduceOp : int8_t { Sum, Avg };
const char* reduce_op_name(ReduceOp op);  // "sum", "avg"

// The handle of one launched collective. wait() blocks until it completed and its results are in the output tensors
// (CPU/MPI: the host data is final; CUDA/NCCL: later work on the default stream is ordered after it); it is
// idempotent. is_completed() never blocks. A Work destroyed before wait() waits in its destructor (buffers that a
// collective still writes are never freed under it).
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

// A Work completed by polling (the MPI backend's): poll() tests the operation once and returns true when it finished
// (having run its completion, e.g. the copy out of a staging buffer). Thread-safe: polls are serialised per Work, so
// the completion runs once however many threads wait. An exception from poll() completes the Work with that error:
// is_completed() is then true and every wait() rethrows it (Note [Work errors]).
class PolledWork : public Work {
 public:
  void wait() final;
  bool is_completed() final;

 protected:
  virtual bool poll() = 0;

 private:
  std::mutex mutex_;
  bool done_ = false;
  std::exception_ptr error_;
};

// Collectives over flat (contiguous) tensors; typed errors before anything is launched: DeviceError for a tensor on a
// device the backend does not serve, DTypeError for a dtype it cannot reduce or for mismatched dtypes, ShapeError for
// sizes that do not fit (all_gather: output.numel() == size() * input.numel()), ValueError for a non-contiguous
// tensor or a root outside [0, size()).
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend() const = 0;  // "mpi", "nccl"
  virtual Device device() const = 0;        // the device whose tensors it takes (cpu for MPI)

  // In place: every rank's `tensor` becomes the sum (or mean) over ranks.
  virtual WorkPtr all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum) = 0;
  // input holds size() equal chunks; rank r's output becomes the reduction over ranks of chunk r.
  virtual WorkPtr reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::Sum) = 0;
  // output becomes the concatenation of every rank's input, in rank order.
  virtual WorkPtr all_gather(const Tensor& output, const Tensor& input) = 0;
  // In place: every rank's `tensor` becomes root's.
  virtual WorkPtr broadcast(const Tensor& tensor, int root = 0) = 0;
  virtual WorkPtr barrier() = 0;

 protected:
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}
  // The checks every backend shares (the error kinds above); `op` names the collective in messages.
  void check_tensor(const char* op, const Tensor& t) const;
  void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) const;
  void check_root(const char* op, int root) const;

 private:
  int rank_, size_;
};

// A Work that is already complete (world size 1 fast paths, empty tensors).
WorkPtr completed_work();

// --- the default group ------------------------------------------------------------------------------------------
// is_available: ember was built with MPI (the multi-process backend for CPU tensors and the bootstrap of NCCL).
// is_nccl_available: a CUDA build found NCCL; without MPI it serves world size 1 only (Note [NCCL without MPI]).
bool is_available();
bool is_nccl_available();

enum class Backend : int8_t { Mpi, Nccl };
// Initialises MPI once (when the program did not itself; Note [MPI threading] in mpi_process_group.cpp) and makes the
// default group: MPI over CPU tensors, or NCCL over this rank's GPU (cuda:local_rank % device count) bootstrapped
// over MPI. Returns the default group; a second call returns the existing one (ValueError if it asks for another
// backend). ValueError when the backend was not built in (is_available()/is_nccl_available()), or for NCCL without
// MPI when the launch has more than one process.
std::shared_ptr<ProcessGroup> init(Backend backend = Backend::Mpi);
// A new NCCL group beside the default one (e.g. NCCL for the CUDA tensors of a program whose default group is MPI),
// on cuda:(local_rank() % device count). Collective: every rank calls it, in the same order. The ncclUniqueId goes
// over the default group when it is MPI (init(Backend::Mpi) first); without MPI (or before init) only a launch of
// one process is served (Note [NCCL without MPI]). ValueError when NCCL was not built in or cannot be bootstrapped.
std::shared_ptr<ProcessGroup> new_nccl_group();
bool is_initialized();
// The group init() made; ValueError before init().
ProcessGroup& default_group();
std::shared_ptr<ProcessGroup> default_group_ptr();
// Drops the default group and finalizes MPI when init() initialised it (also run at exit). No collective may be
// pending; after it, init() cannot be called again (MPI cannot be re-initialised).
void finalize();

// The calling process in the launch (from MPI after init; before it, from the launcher's environment —
// OMPI_COMM_WORLD_*, PMI_*, or 0/1 when launched without mpirun).
int world_rank();
int world_size();
int local_rank();  // index among the ranks on this host (one rank per GPU uses cuda:local_rank)

}  // namespace ember::dist
