// The NCCL ProcessGroup: ncclAllReduce / ncclReduceScatter / ncclAllGather / ncclBroadcast on the group's own
// non-blocking stream, ordered after the default stream by an event, with tensors recorded on that stream for the
// caching allocator. Invariant: every NCCL and CUDA call is checked (BackendError carrying the expression).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ember/base/cuda_check.h"
#include "ember/base/error.h"
#include "ember/dist/nccl_process_group.h"
#include "ember/memory/cuda_backing.h"
#include "ember/memory/cuda_device.h"

#define EMBER_NCCL_CHECK(expr)                                                                                    \
  do {                                                                                                            \
    ncclResult_t ember_nccl_status_ = (expr);                                                                     \
    if (ember_nccl_status_ != ncclSuccess)                                                                        \
      ::ember::detail::throw_backend_error("NCCL", #expr, ncclGetErrorString(ember_nccl_status_), __FILE__,       \
                                           __LINE__);                                                             \
  } while (0)

namespace ember::dist::detail {
namespace {

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::f32: return ncclFloat32;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::f64: return ncclFloat64;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
    case DType::i8: return ncclInt8;
    default: return ncclUint8;
  }
}

// Restores the caller's current device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    EMBER_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) EMBER_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() {  // not back to a device without a context: cudaSetDevice would create one (memory/cuda_scoped.h)
    if (memory::primary_context_active(previous_)) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
};

// Completion is an event recorded on the group's stream after the collective. wait() makes the legacy default
// stream (where ember's kernels run) wait for it, as torch's Work.wait() does for the current stream, and blocks the
// host until it fired, so host reads after wait() see the result too.
class NcclWork : public Work {
 public:
  NcclWork(int device, cudaEvent_t done, std::vector<Tensor> keep)
      : device_(device), done_(done), keep_(std::move(keep)) {}
  ~NcclWork() override {
    try {
      wait();
    } catch (...) {
    }
    cudaEventDestroy(done_);
  }
  void wait() override {
    if (finished_) return;
    DeviceScope scope(device_);
    EMBER_CUDA_CHECK(cudaStreamWaitEvent(nullptr, done_, 0));
    EMBER_CUDA_CHECK(cudaEventSynchronize(done_));
    finished_ = true;
    keep_.clear();
  }
  bool is_completed() override {
    if (finished_) return true;
    const cudaError_t s = cudaEventQuery(done_);
    if (s == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: clear it so the next kernel launch check does not report it
      return false;
    }
    EMBER_CUDA_CHECK(s);
    wait();
    return true;
  }

 private:
  int device_;
  cudaEvent_t done_;
  std::vector<Tensor> keep_;
  bool finished_ = false;
};

class NcclProcessGroup : public ProcessGroup {
 public:
  NcclProcessGroup(ProcessGroup& bootstrap, int device)
      : ProcessGroup(bootstrap.rank(), bootstrap.size()), device_(device) {
    ncclUniqueId id;
    if (rank() == 0) EMBER_NCCL_CHECK(ncclGetUniqueId(&id));
    Tensor bytes = empty({static_cast<int64_t>(sizeof(id))}, {DType::u8, Device::cpu()});
    if (rank() == 0) std::memcpy(bytes.raw_data(), &id, sizeof(id));
    bootstrap.broadcast(bytes, 0)->wait();
    std::memcpy(&id, bytes.raw_data(), sizeof(id));
    DeviceScope scope(device_);
    EMBER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    EMBER_NCCL_CHECK(ncclCommInitRank(&comm_, size(), id, rank()));
  }
  ~NcclProcessGroup() override {
    try {
      DeviceScope scope(device_);
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
      cudaStreamDestroy(stream_);
    } catch (...) {
      // A destructor cannot throw; a failing cudaGetDevice/cudaSetDevice means the runtime is already gone (exit).
    }
  }
  std::string backend() const override { return "nccl"; }
  Device device() const override { return Device::cuda(device_); }

  WorkPtr all_reduce(const Tensor& tensor, ReduceOp op) override {
    check_tensor("all_reduce", tensor);
    check_reducible("all_reduce", tensor.dtype(), op);
    return launch({tensor}, [&] {
      EMBER_NCCL_CHECK(ncclAllReduce(tensor.raw_data(), tensor.raw_data(), static_cast<size_t>(tensor.numel()),
                                     nccl_type(tensor.dtype()), nccl_op(op), comm_, stream_));
    });
  }

  WorkPtr reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) override {
    check_tensor("reduce_scatter", output);
    check_tensor("reduce_scatter", input);
    check_same_dtype("reduce_scatter", output, input);
    check_reducible("reduce_scatter", input.dtype(), op);
    EMBER_CHECK(input.numel() == output.numel() * size(), ShapeError, "dist::reduce_scatter: input ",
                input.description(), " must hold size() = ", size(), " chunks of output ", output.description());
    return launch({output, input}, [&] {
      EMBER_NCCL_CHECK(ncclReduceScatter(input.raw_data(), output.raw_data(), static_cast<size_t>(output.numel()),
                                         nccl_type(input.dtype()), nccl_op(op), comm_, stream_));
    });
  }

  WorkPtr all_gather(const Tensor& output, const Tensor& input) override {
    check_tensor("all_gather", output);
    check_tensor("all_gather", input);
    check_same_dtype("all_gather", output, input);
    EMBER_CHECK(output.numel() == input.numel() * size(), ShapeError, "dist::all_gather: output ",
                output.description(), " must hold size() = ", size(), " times input ", input.description());
    return launch({output, input}, [&] {
      EMBER_NCCL_CHECK(ncclAllGather(input.raw_data(), output.raw_data(), static_cast<size_t>(input.nbytes()),
                                     ncclUint8, comm_, stream_));
    });
  }

  WorkPtr broadcast(const Tensor& tensor, int root) override {
    check_tensor("broadcast", tensor);
    check_root("broadcast", root);
    return launch({tensor}, [&] {
      EMBER_NCCL_CHECK(ncclBroadcast(tensor.raw_data(), tensor.raw_data(), static_cast<size_t>(tensor.nbytes()),
                                     ncclUint8, root, comm_, stream_));
    });
  }

  // NCCL has no barrier: an all-reduce of one element, waited on the host.
  WorkPtr barrier() override {
    Tensor one = zeros({1}, {DType::f32, device()});
    auto work = all_reduce(one, ReduceOp::Sum);
    work->wait();
    return work;
  }

 private:
  // The average over one rank is its sum, and NCCL's single-rank path is only trusted with ncclSum: NCCL 2.28.9 on one
  // H100 left a reduce-scatter's output unwritten for ncclAvg at 1,863,690 f32 (3 and 1000 elements came out right,
  // ncclSum at every size), which turned ZeRO-1's gradient shard into stale memory.
  ncclRedOp_t nccl_op(ReduceOp op) const { return op == ReduceOp::Sum || size() == 1 ? ncclSum : ncclAvg; }
  static void check_reducible(const char* op, DType d, ReduceOp rop) {
    EMBER_CHECK(d != DType::b8 && d != DType::u8 && d != DType::i16, DTypeError, "dist::", op, ": NCCL does not reduce ",
                dtype_name(d));
    EMBER_CHECK(is_floating(d) || rop == ReduceOp::Sum, DTypeError, "dist::", op, ": ", reduce_op_name(rop),
                " needs a floating dtype, not ", dtype_name(d));
  }

  // Orders the collective after the default stream's queued work, runs it on the group's stream, records the
  // tensors' use of that stream for the allocator, and returns a Work over a completion event.
  template <class Collective>
  WorkPtr launch(std::vector<Tensor> tensors, Collective&& collective) {
    DeviceScope scope(device_);
    cudaEvent_t ready, done;
    EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    EMBER_CUDA_CHECK(cudaEventRecord(ready, nullptr));
    EMBER_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
    EMBER_CUDA_CHECK(cudaEventDestroy(ready));
    collective();
    for (const Tensor& t : tensors) t.record_stream(reinterpret_cast<memory::StreamId>(stream_));
    EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    EMBER_CUDA_CHECK(cudaEventRecord(done, stream_));
    return std::make_shared<NcclWork>(device_, done, std::move(tensors));
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_nccl_process_group(ProcessGroup& bootstrap, int local_rank) {
  const int n = memory::cuda::device_count();
  EMBER_CHECK(n > 0, DeviceError, "dist::init(nccl): no CUDA device is visible");
  return std::make_shared<NcclProcessGroup>(bootstrap, local_rank % n);
}

std::string nccl_version() {
  try {
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
    // NCCL_VERSION(X, Y, Z): 10000 X + 100 Y + Z since 2.9, 1000 X + 100 Y + Z before.
    const int major = v >= 20900 ? v / 10000 : v / 1000, rest = v >= 20900 ? v % 10000 : v % 1000;
    return std::to_string(major) + "." + std::to_string(rest / 100) + "." + std::to_string(rest % 100);
  } catch (const Error& e) {
    return std::string("unavailable (") + e.what() + ")";
  }
}

}  // namespace ember::dist::detail
