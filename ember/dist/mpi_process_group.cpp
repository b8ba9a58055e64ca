// The MPI ProcessGroup: non-blocking MPI collectives (MPI_Iallreduce, MPI_Ireduce_scatter_block, MPI_Iallgather,
// MPI_Ibcast, MPI_Ibarrier) over CPU tensors, f16/bf16 reduced through fp32 copies, averaging after the sum.
// Invariant: every MPI call holds mpi_lock() (Note [MPI threading]); a Work keeps every buffer of its request alive.
#include "ember/dist/mpi_process_group.h"

// Only the C API: without these, OpenMPI's and MPICH's mpi.h pull in the deprecated C++ bindings.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "ember/base/error.h"
#include "ember/core/grad_mode.h"

namespace ember::dist::detail {
namespace {

// Note [MPI threading]
// Backward runs on the thread that calls it (autograd/engine.h), and DDP launches its bucket all-reduces from the
// post-accumulate-grad hooks there, while wait() may be called from any thread. MPI_THREAD_SERIALIZED is enough when
// no two threads are inside MPI at once, which one process-wide mutex guarantees; it is cheaper than
// MPI_THREAD_MULTIPLE in OpenMPI. Waiting polls MPI_Test under the lock and yields between polls, so a thread that
// waits never keeps another from launching (a blocking MPI_Wait under the lock would). Lock order: a Work's own mutex
// (PolledWork) may be held while taking mpi_lock(), never the reverse.
std::mutex& mpi_lock() {
  static std::mutex m;
  return m;
}

bool g_owned = false;      // mpi_init_once called MPI_Init_thread
bool g_finalized = false;  // mpi_finalize_if_owned ran

#define EMBER_MPI_CHECK(expr)                                                                     \
  do {                                                                                            \
    int ember_mpi_rc_ = (expr);                                                                   \
    if (ember_mpi_rc_ != MPI_SUCCESS) {                                                           \
      char ember_mpi_msg_[MPI_MAX_ERROR_STRING];                                                  \
      int ember_mpi_len_ = 0;                                                                     \
      MPI_Error_string(ember_mpi_rc_, ember_mpi_msg_, &ember_mpi_len_);                           \
      throw BackendError(::ember::detail::concat("MPI call failed: ", #expr, " returned ",        \
                                                 std::string(ember_mpi_msg_, ember_mpi_len_), " at ", \
                                                 __FILE__, ":", __LINE__));                       \
    }                                                                                             \
  } while (0)

MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::i8: return MPI_INT8_T;
    case DType::i16: return MPI_INT16_T;
    default: return MPI_DATATYPE_NULL;
  }
}

int checked_count(const char* op, int64_t n) {
  EMBER_CHECK(n <= INT_MAX, ValueError, "dist::", op, ": ", n, " elements exceed MPI's int count; split the tensor");
  return static_cast<int>(n);
}

// Divides a contiguous f32/f64 tensor by n in place (ReduceOp::Avg after the sum).
void divide_(const Tensor& t, int n) {
  if (t.dtype() == DType::f32) {
    float* p = t.data<float>();
    for (int64_t i = 0, e = t.numel(); i < e; ++i) p[i] /= static_cast<float>(n);
  } else {
    double* p = t.data<double>();
    for (int64_t i = 0, e = t.numel(); i < e; ++i) p[i] /= static_cast<double>(n);
  }
}

// A non-blocking MPI collective: its request, the tensors it reads and writes (alive until it completed, also when it
// failed: Note [Work errors]) and the completion that runs once it finished (averaging, the copy out of an fp32
// staging buffer). Completion and errors: PolledWork.
class MpiWork : public PolledWork {
 public:
  MpiWork(std::vector<Tensor> keep, std::function<void()> finish)
      : keep_(std::move(keep)), finish_(std::move(finish)) {}
  ~MpiWork() override {
    try {
      wait();
    } catch (...) {  // a destructor must not throw; the error was the caller's to see through wait()
    }
  }
  MPI_Request* request() { return &request_; }
  // Called once the MPI call returned MPI_SUCCESS: a Work whose launch failed completes without its completion.
  void started() { started_ = true; }

 protected:
  bool poll() override {
    if (!started_) {
      keep_.clear();
      finish_ = nullptr;
      return true;
    }
    int flag = 0;
    {
      std::lock_guard<std::mutex> lock(mpi_lock());
      // A request still pending when MPI was finalized (a Work kept past dist::finalize()) can never complete.
      int fin = 0;
      MPI_Finalized(&fin);
      EMBER_CHECK(!fin, BackendError, "dist: a collective was still pending when MPI was finalized "
                  "(dist::finalize() needs every Work waited)");
      EMBER_MPI_CHECK(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE));
    }
    if (!flag) return false;
    if (finish_) {
      NoGradGuard no_grad;
      finish_();
    }
    keep_.clear();
    finish_ = nullptr;
    return true;
  }

 private:
  MPI_Request request_ = MPI_REQUEST_NULL;
  bool started_ = false;
  std::vector<Tensor> keep_;
  std::function<void()> finish_;
};

class MpiProcessGroup : public ProcessGroup {
 public:
  MpiProcessGroup(MPI_Comm comm, int rank, int size) : ProcessGroup(rank, size), comm_(comm) {}
  ~MpiProcessGroup() override {
    if (mpi_is_initialized()) {
      std::lock_guard<std::mutex> lock(mpi_lock());
      MPI_Comm_free(&comm_);
    }
  }
  std::string backend() const override { return "mpi"; }
  Device device() const override { return Device::cpu(); }

  WorkPtr all_reduce(const Tensor& tensor, ReduceOp op) override {
    check_tensor("all_reduce", tensor);
    check_reducible("all_reduce", tensor.dtype(), op);
    const int count = checked_count("all_reduce", tensor.numel());
    Tensor buf = is_reduced_float(tensor.dtype()) ? tensor.to(DType::f32) : tensor;
    const int n = size();
    auto finish = [dst = Tensor(tensor), buf, op, n]() mutable {
      if (op == ReduceOp::Avg) divide_(buf, n);
      if (!buf.is_same(dst)) dst.copy_(buf);
    };
    auto work = std::make_shared<MpiWork>(std::vector<Tensor>{tensor, buf}, std::move(finish));
    std::lock_guard<std::mutex> lock(mpi_lock());
    EMBER_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf.raw_data(), count, mpi_type(buf.dtype()), MPI_SUM, comm_,
                                   work->request()));
    work->started();
    return work;
  }

  WorkPtr reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) override {
    check_tensor("reduce_scatter", output);
    check_tensor("reduce_scatter", input);
    check_same_dtype("reduce_scatter", output, input);
    check_reducible("reduce_scatter", input.dtype(), op);
    EMBER_CHECK(input.numel() == output.numel() * size(), ShapeError, "dist::reduce_scatter: input ",
                input.description(), " must hold size() = ", size(), " chunks of output ", output.description());
    checked_count("reduce_scatter", input.numel());
    Tensor in = is_reduced_float(input.dtype()) ? input.to(DType::f32) : input;
    Tensor out = is_reduced_float(output.dtype()) ? empty({output.numel()}, {DType::f32, Device::cpu()}) : output;
    const int n = size();
    auto finish = [dst = Tensor(output), out, op, n]() mutable {
      if (op == ReduceOp::Avg) divide_(out, n);
      if (!out.is_same(dst)) dst.copy_(out.view(dst.sizes()));
    };
    auto work = std::make_shared<MpiWork>(std::vector<Tensor>{output, input, in, out}, std::move(finish));
    std::lock_guard<std::mutex> lock(mpi_lock());
    EMBER_MPI_CHECK(MPI_Ireduce_scatter_block(in.raw_data(), out.raw_data(), static_cast<int>(output.numel()),
                                              mpi_type(in.dtype()), MPI_SUM, comm_, work->request()));
    work->started();
    return work;
  }

  WorkPtr all_gather(const Tensor& output, const Tensor& input) override {
    check_tensor("all_gather", output);
    check_tensor("all_gather", input);
    check_same_dtype("all_gather", output, input);
    EMBER_CHECK(output.numel() == input.numel() * size(), ShapeError, "dist::all_gather: output ",
                output.description(), " must hold size() = ", size(), " times input ", input.description());
    checked_count("all_gather", output.nbytes());
    auto work = std::make_shared<MpiWork>(std::vector<Tensor>{output, input}, nullptr);
    std::lock_guard<std::mutex> lock(mpi_lock());
    EMBER_MPI_CHECK(MPI_Iallgather(input.raw_data(), static_cast<int>(input.nbytes()), MPI_BYTE, output.raw_data(),
                                   static_cast<int>(input.nbytes()), MPI_BYTE, comm_, work->request()));
    work->started();
    return work;
  }

  WorkPtr broadcast(const Tensor& tensor, int root) override {
    check_tensor("broadcast", tensor);
    check_root("broadcast", root);
    const int bytes = checked_count("broadcast", tensor.nbytes());
    auto work = std::make_shared<MpiWork>(std::vector<Tensor>{tensor}, nullptr);
    std::lock_guard<std::mutex> lock(mpi_lock());
    EMBER_MPI_CHECK(MPI_Ibcast(tensor.raw_data(), bytes, MPI_BYTE, root, comm_, work->request()));
    work->started();
    return work;
  }

  WorkPtr barrier() override {
    auto work = std::make_shared<MpiWork>(std::vector<Tensor>{}, nullptr);
    std::lock_guard<std::mutex> lock(mpi_lock());
    EMBER_MPI_CHECK(MPI_Ibarrier(comm_, work->request()));
    work->started();
    return work;
  }

 private:
  static void check_reducible(const char* op, DType d, ReduceOp rop) {
    const bool floating = is_floating(d);
    const bool integer = d == DType::i32 || d == DType::i64;
    EMBER_CHECK(floating || integer, DTypeError, "dist::", op, ": the MPI backend reduces f32, f64, f16, bf16, i32 "
                "and i64 tensors, not ", dtype_name(d));
    EMBER_CHECK(floating || rop == ReduceOp::Sum, DTypeError, "dist::", op, ": ", reduce_op_name(rop),
                " needs a floating dtype, not ", dtype_name(d));
  }

  MPI_Comm comm_;
};

}  // namespace

bool mpi_is_initialized() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

void mpi_init_once() {
  std::lock_guard<std::mutex> lock(mpi_lock());
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  EMBER_CHECK(!fin, ValueError, "dist::init: MPI was finalized already and cannot be initialised again");
  int provided = 0;
  if (!init) {
    EMBER_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
    g_owned = true;
  } else {
    EMBER_MPI_CHECK(MPI_Query_thread(&provided));
  }
  EMBER_CHECK(provided >= MPI_THREAD_SERIALIZED, BackendError, "dist::init: MPI gives thread level ", provided,
              ", ember needs MPI_THREAD_SERIALIZED (Note [MPI threading])");
}

void mpi_finalize_if_owned() {
  std::lock_guard<std::mutex> lock(mpi_lock());
  if (!g_owned || g_finalized) return;
  g_finalized = true;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

int mpi_world_rank() {
  std::lock_guard<std::mutex> lock(mpi_lock());
  int r = 0;
  EMBER_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &r));
  return r;
}

int mpi_world_size() {
  std::lock_guard<std::mutex> lock(mpi_lock());
  int s = 1;
  EMBER_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &s));
  return s;
}

int mpi_local_rank() {
  std::lock_guard<std::mutex> lock(mpi_lock());
  MPI_Comm local;
  EMBER_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local));
  int r = 0;
  MPI_Comm_rank(local, &r);
  MPI_Comm_free(&local);
  return r;
}

std::shared_ptr<ProcessGroup> make_mpi_process_group() {
  MPI_Comm comm;
  int rank = 0, size = 1;
  {
    std::lock_guard<std::mutex> lock(mpi_lock());
    EMBER_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
    // Errors come back as codes, which EMBER_MPI_CHECK turns into BackendError (the default aborts the job).
    EMBER_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
  }
  return std::make_shared<MpiProcessGroup>(comm, rank, size);
}

}  // namespace ember::dist::detail
