// Shared by the dist tests: the process group (MPI, initialised once per process; the tests skip on every rank when
// ember was built without MPI; NCCL over CUDA tensors for the tests that run on both backends), a group that records
// what is launched and waited, and small helpers. Run under `mpirun -np N` or alone (world size 1).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "ember/dist/process_group.h"
#include "ember/memory/cuda_device.h"

namespace ember::testing {

inline std::shared_ptr<dist::ProcessGroup> dist_group() {
  if (!dist::is_available()) return nullptr;
  return dist::init();
}

// The backends a test runs over: MPI with CPU tensors, NCCL with CUDA tensors.
enum class DistBackend { Mpi, Nccl };
inline const char* backend_name(DistBackend b) { return b == DistBackend::Mpi ? "mpi" : "nccl"; }
inline void PrintTo(DistBackend b, std::ostream* os) { *os << backend_name(b); }  // GoogleTest's parameter names

// Why `backend` cannot run here ("" when it can): not built in, or for NCCL no GPU for every rank.
inline std::string dist_unavailable(DistBackend backend) {
  if (backend == DistBackend::Mpi)
    return dist::is_available() ? "" : "ember was built without MPI (dist::is_available)";
  if (!dist::is_nccl_available()) return "ember was built without NCCL (dist::is_nccl_available)";
  if (!memory::cuda::is_available()) return "no CUDA device on this machine";
  if (!dist::is_available() && dist::world_size() > 1) return "NCCL without MPI serves a launch of one process";
  if (dist::world_size() > memory::cuda::device_count()) return "NCCL needs a GPU per rank (on one host)";
  return "";
}

// The group of `backend`: MPI's default group, or one NCCL group per process, made on first use (bootstrapped over the
// MPI default group where ember has MPI, else a one-process communicator: Note [NCCL without MPI]).
inline std::shared_ptr<dist::ProcessGroup> dist_group(DistBackend backend) {
  if (!dist_unavailable(backend).empty()) return nullptr;
  if (backend == DistBackend::Mpi) return dist::init();
  static std::shared_ptr<dist::ProcessGroup> nccl = [] {
    if (dist::is_available()) dist::init();
    return dist::new_nccl_group();
  }();
  return nccl;
}

// Forwards every collective to `inner` and logs it: "launch all_reduce <numel>" when launched, "wait <k>" when the
// k-th launched Work (0-based) is first waited, "drop <k>" when it is destroyed unwaited; `on_launch` runs at each
// launch.
class RecordingGroup : public dist::ProcessGroup {
 public:
  explicit RecordingGroup(std::shared_ptr<dist::ProcessGroup> inner)
      : ProcessGroup(inner->rank(), inner->size()), inner_(std::move(inner)) {}
  std::string backend() const override { return inner_->backend(); }
  Device device() const override { return inner_->device(); }
  dist::WorkPtr all_reduce(const Tensor& t, dist::ReduceOp op) override {
    return record("all_reduce " + std::to_string(t.numel()), inner_->all_reduce(t, op));
  }
  dist::WorkPtr reduce_scatter(const Tensor& out, const Tensor& in, dist::ReduceOp op) override {
    return record("reduce_scatter", inner_->reduce_scatter(out, in, op));
  }
  dist::WorkPtr all_gather(const Tensor& out, const Tensor& in) override {
    return record("all_gather", inner_->all_gather(out, in));
  }
  dist::WorkPtr broadcast(const Tensor& t, int root) override { return record("broadcast", inner_->broadcast(t, root)); }
  dist::WorkPtr barrier() override { return record("barrier", inner_->barrier()); }

  std::vector<std::string> events() {
    std::lock_guard<std::mutex> lock(mutex_);
    return events_;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.clear();
    launched_ = 0;
  }
  std::function<void()> on_launch;

 private:
  class Recorded : public dist::Work {
   public:
    Recorded(RecordingGroup* g, int k, dist::WorkPtr w) : group_(g), k_(k), inner_(std::move(w)) {}
    ~Recorded() override {  // "drop <k>": destroyed without a wait (the backend's destructor still waits)
      if (noted_) return;
      std::lock_guard<std::mutex> lock(group_->mutex_);
      group_->events_.push_back("drop " + std::to_string(k_));
    }
    void wait() override {
      note();
      inner_->wait();
    }
    bool is_completed() override { return inner_->is_completed(); }

   private:
    void note() {
      if (noted_) return;
      noted_ = true;
      std::lock_guard<std::mutex> lock(group_->mutex_);
      group_->events_.push_back("wait " + std::to_string(k_));
    }
    RecordingGroup* group_;
    int k_;
    dist::WorkPtr inner_;
    bool noted_ = false;
  };

  dist::WorkPtr record(std::string what, dist::WorkPtr w) {
    int k;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      events_.push_back("launch " + what);
      k = launched_++;
    }
    if (on_launch) on_launch();
    return std::make_shared<Recorded>(this, k, std::move(w));
  }

  std::shared_ptr<dist::ProcessGroup> inner_;
  std::mutex mutex_;
  std::vector<std::string> events_;
  int launched_ = 0;
};

}  // namespace ember::testing

// Declares `pg` (ProcessGroup&), or skips the test on every rank when there is no MPI backend.
#define EMBER_DIST_GROUP(pg)                                                       \
  auto pg##_ptr = ::ember::testing::dist_group();                                  \
  if (!pg##_ptr) GTEST_SKIP() << "ember was built without MPI (dist::is_available)"; \
  ::ember::dist::ProcessGroup& pg = *pg##_ptr

// Declares `pg` (ProcessGroup&) of `backend` (DistBackend) and `dev`, the device of its tensors, or skips the test on
// every rank when the backend cannot run here.
#define EMBER_DIST_GROUP_OF(pg, dev, backend)                                                    \
  if (const std::string why = ::ember::testing::dist_unavailable(backend); !why.empty())        \
    GTEST_SKIP() << ::ember::testing::backend_name(backend) << ": " << why;                      \
  auto pg##_ptr = ::ember::testing::dist_group(backend);                                         \
  ::ember::dist::ProcessGroup& pg = *pg##_ptr;                                                   \
  const ::ember::Device dev = pg.device()
