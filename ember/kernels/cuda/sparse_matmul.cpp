// CUDA kernels of the CSR products (ops_sparse.h), csr_linear and csr_matmul in f32/f64, through cuSPARSE's SpMM.
// Invariant: cuSPARSE sees row offsets and column indices of one index type, a per-device handle bound to the current
// stream under that device's lock, and an allocator workspace; nnz == 0 never reaches cuSPARSE.
#if defined(EMBER_WITH_CUSPARSE)  // ember/CMakeLists.txt: set when the toolkit has cuSPARSE
#include <cusparse.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ember/base/cuda_check.h"
#include "ember/core/core_stubs.h"
#include "ember/kernels/cuda/library_check.h"
#include "ember/kernels/cuda/stream.h"
#include "ember/kernels/ops_sparse.h"

namespace ember::kernels::cuda {
namespace {

using ::ember::cuda::DeviceGuard;

// ---- handle -------------------------------------------------------------------------------------------------------

// Note [Leaked cuSPARSE handles]
// One handle per device, created on first use and never destroyed, for the reason of Note [Leaked cuBLASLt handles]
// in blas.cu (a static destructor may run after the driver has unloaded). Unlike cuBLASLt, cuSPARSE keeps the stream
// in the handle (cusparseSetStream), so a call binds the current stream and enqueues its SpMM while holding the
// device's lock: two threads never interleave one's cusparseSetStream with the other's SpMM. The lock covers only
// host-side enqueueing (SpMM is asynchronous).
struct SparseHandle {
  std::mutex mu;
  cusparseHandle_t handle = nullptr;
};

// The handle of `device` (current), created on first use.
SparseHandle& sparse_handle(int device) {
  static auto* mu = new std::mutex;                       // Note [Leaked cuSPARSE handles]
  static auto* handles = new std::vector<SparseHandle*>;  // Note [Leaked cuSPARSE handles]
  EMBER_CHECK(device >= 0, DeviceError, "cuSPARSE: invalid CUDA device index ", device);
  std::lock_guard<std::mutex> lock(*mu);
  if (handles->size() <= static_cast<size_t>(device)) handles->resize(static_cast<size_t>(device) + 1, nullptr);
  SparseHandle*& h = (*handles)[static_cast<size_t>(device)];
  if (h == nullptr) {
    auto fresh = std::make_unique<SparseHandle>();
    EMBER_CUSPARSE_CHECK(cusparseCreate(&fresh->handle));
    h = fresh.release();  // Note [Leaked cuSPARSE handles]
  }
  return *h;
}

struct SpMatDeleter {
  void operator()(const cusparseSpMatDescr* p) const { cusparseDestroySpMat(p); }
};
struct DnMatDeleter {
  void operator()(const cusparseDnMatDescr* p) const { cusparseDestroyDnMat(p); }
};
using SpMat = std::unique_ptr<const cusparseSpMatDescr, SpMatDeleter>;
using DnMat = std::unique_ptr<const cusparseDnMatDescr, DnMatDeleter>;

// ---- operands -------------------------------------------------------------------------------------------------------

// The layout of a dense matrix as cuSPARSE describes it: rows x cols in `order` with leading dimension ld.
struct DenseLayout {
  int64_t rows, cols, ld;
  cusparseOrder_t order;
};

// Note [cuSPARSE index types]
// cuSPARSE takes CSR row offsets and column indices of one index type, i32 or i64; ember stores column indices as
// i16 (compact) or i32 and row_ptr as i32 or i64. The call uses i64 when row_ptr is i64 (or a dimension does not fit
// i32) and i32 otherwise; an index tensor of another dtype is converted for the call into a transient tensor of the
// common type, by the CUDA copy kernel (the one behind Tensor::to(dtype)), on the current stream, so it is ready
// before the SpMM that reads it; like the workspace it is allocated for that stream and goes back to the allocator's
// pool for it when the call returns, behind the SpMM (stream-ordered reuse).
struct CsrIndices {
  Tensor row_ptr, col_indices;
  cusparseIndexType_t type;
};

memory::StreamId stream_id(cudaStream_t s) { return static_cast<memory::StreamId>(reinterpret_cast<uintptr_t>(s)); }

Tensor as_index_dtype(const Tensor& t, DType dtype, cudaStream_t stream) {
  if (t.dtype() == dtype) return t;
  Tensor out = empty_on_stream(t.sizes(), TensorOptions(dtype, t.device()), stream_id(stream));
  copy_stub.get(DeviceType::CUDA)(t, out);  // Note [cuSPARSE index types]
  return out;
}

CsrIndices cusparse_indices(const Tensor& col_indices, const Tensor& row_ptr, int64_t rows, int64_t cols,
                            cudaStream_t stream) {
  constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();
  const bool wide = row_ptr.dtype() == DType::i64 || rows >= kI32Max || cols >= kI32Max;
  const DType idx = wide ? DType::i64 : DType::i32;
  return {as_index_dtype(row_ptr, idx, stream), as_index_dtype(col_indices, idx, stream),
          wide ? CUSPARSE_INDEX_64I : CUSPARSE_INDEX_32I};
}

// C = alpha * A @ B + beta * C, A the CSR matrix [rows, cols] (nnz > 0), through cusparseSpMM with
// CUSPARSE_SPMM_ALG_DEFAULT, the compute type the values' (f32 or f64). C may be read (beta != 0): the caller filled
// it. The workspace is an allocator tensor for `stream` (Note [cuSPARSE index types]).
void spmm(int device, cudaStream_t stream, const Tensor& values, const Tensor& col_indices, const Tensor& row_ptr,
          int64_t rows, int64_t cols, const void* b, const DenseLayout& lb, void* c, const DenseLayout& lc,
          double beta) {
  const bool f64 = values.dtype() == DType::f64;
  const cudaDataType value_type = f64 ? CUDA_R_64F : CUDA_R_32F;
  const CsrIndices idx = cusparse_indices(col_indices, row_ptr, rows, cols, stream);

  cusparseConstSpMatDescr_t raw_a = nullptr;
  EMBER_CUSPARSE_CHECK(cusparseCreateConstCsr(&raw_a, rows, cols, values.numel(), idx.row_ptr.raw_data(),
                                              idx.col_indices.raw_data(), values.raw_data(), idx.type, idx.type,
                                              CUSPARSE_INDEX_BASE_ZERO, value_type));
  const SpMat mat_a(raw_a);
  cusparseConstDnMatDescr_t raw_b = nullptr;
  EMBER_CUSPARSE_CHECK(cusparseCreateConstDnMat(&raw_b, lb.rows, lb.cols, lb.ld, b, value_type, lb.order));
  const DnMat mat_b(raw_b);
  cusparseDnMatDescr_t raw_c = nullptr;
  EMBER_CUSPARSE_CHECK(cusparseCreateDnMat(&raw_c, lc.rows, lc.cols, lc.ld, c, value_type, lc.order));
  const DnMat mat_c(raw_c);

  const double alpha_d = 1.0, beta_d = beta;
  const float alpha_f = 1.0f, beta_f = static_cast<float>(beta);
  const void* alpha_p = f64 ? static_cast<const void*>(&alpha_d) : static_cast<const void*>(&alpha_f);
  const void* beta_p = f64 ? static_cast<const void*>(&beta_d) : static_cast<const void*>(&beta_f);
  const cusparseOperation_t no_t = CUSPARSE_OPERATION_NON_TRANSPOSE;

  SparseHandle& h = sparse_handle(device);
  std::lock_guard<std::mutex> lock(h.mu);  // Note [Leaked cuSPARSE handles]
  EMBER_CUSPARSE_CHECK(cusparseSetStream(h.handle, stream));
  size_t bytes = 0;
  EMBER_CUSPARSE_CHECK(cusparseSpMM_bufferSize(h.handle, no_t, no_t, alpha_p, mat_a.get(), mat_b.get(), beta_p, raw_c,
                                               value_type, CUSPARSE_SPMM_ALG_DEFAULT, &bytes));
  Tensor workspace;
  void* ws = nullptr;
  if (bytes > 0) {
    workspace = empty_on_stream({static_cast<int64_t>(bytes)}, TensorOptions(DType::u8, Device::cuda(device)),
                                stream_id(stream));
    ws = workspace.raw_data();
  }
  EMBER_CUSPARSE_CHECK(cusparseSpMM(h.handle, no_t, no_t, alpha_p, mat_a.get(), mat_b.get(), beta_p, raw_c, value_type,
                                    CUSPARSE_SPMM_ALG_DEFAULT, ws));
}

// ---- entry points ---------------------------------------------------------------------------------------------------

void check_cuda_operands(const char* op, std::initializer_list<const Tensor*> ts, Device device) {
  EMBER_CHECK(device.is_cuda(), DeviceError, op, ": the CUDA kernel got a tensor on ", device.str());
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    EMBER_CHECK(t->device() == device, DeviceError, op, ": ", t->description(), " is not on ", device.str());
    EMBER_CHECK(t->is_contiguous(), ValueError, op, ": the CUDA kernel needs contiguous operands, got ",
                t->description());
  }
}

void check_value_dtype(const char* op, const Tensor& values) {
  EMBER_CHECK(values.dtype() == DType::f32 || values.dtype() == DType::f64, DTypeError, op,
              ": the CUDA kernel takes f32 or f64 values, got ", values.description(),
              "; convert the CSR values and the input with .to(f32)");
}

// out [B, N] = x [B, K] W^T + bias. Read column-major, out is out^T [N, B] (ld N) and x is x^T [K, B] (ld K), so
// cuSPARSE computes out^T = W @ x^T + out^T with W [N, K] in CSR, out first filled with the bias rows (or zeros).
// nnz == 0 (which includes K == 0): out is the bias rows, or zeros.
void csr_linear_cuda(const Tensor& x, const Tensor& values, const Tensor& col_indices, const Tensor& row_ptr,
                     const Tensor& bias, const Tensor& out) {
  const char* op = "csr_linear";
  const Device device = out.device();
  check_cuda_operands(op, {&x, &values, &col_indices, &row_ptr, &bias, &out}, device);
  check_value_dtype(op, values);
  const int64_t B = x.size(0), K = x.size(1), N = out.size(1), nnz = values.numel();
  if (B == 0 || N == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  // out[b, :] = bias, or 0: C is read with beta 1 either way (cuSPARSE's documentation does not promise that beta 0
  // leaves an uninitialised C unread, and a NaN there would survive 0 * NaN).
  if (bias.defined())
    copy_stub.get(DeviceType::CUDA)(bias.view({1, N}).expand({B, N}), out);
  else
    fill_stub.get(DeviceType::CUDA)(out, 0);
  if (nnz == 0) return;
  const DenseLayout xt{K, B, K, CUSPARSE_ORDER_COL};
  const DenseLayout outt{N, B, N, CUSPARSE_ORDER_COL};
  spmm(device.index, stream, values, col_indices, row_ptr, N, K, x.raw_data(), xt, out.raw_data(), outt, 1.0);
}

// out [M, N] = A [M, K] (CSR) @ dense [K, N], row-major dense operands (CUSPARSE_ORDER_ROW, ld N), accumulated into
// zeros. nnz == 0: zeros.
void csr_matmul_cuda(const Tensor& values, const Tensor& col_indices, const Tensor& row_ptr, const Tensor& dense,
                     const Tensor& out) {
  const char* op = "csr_matmul";
  const Device device = out.device();
  check_cuda_operands(op, {&values, &col_indices, &row_ptr, &dense, &out}, device);
  check_value_dtype(op, values);
  const int64_t M = out.size(0), N = out.size(1), K = dense.size(0), nnz = values.numel();
  if (M == 0 || N == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  fill_stub.get(DeviceType::CUDA)(out, 0);  // read with beta 1, as csr_linear's
  if (nnz == 0) return;
  const DenseLayout d{K, N, N, CUSPARSE_ORDER_ROW};
  const DenseLayout o{M, N, N, CUSPARSE_ORDER_ROW};
  spmm(device.index, stream, values, col_indices, row_ptr, M, K, dense.raw_data(), d, out.raw_data(), o, 1.0);
}

}  // namespace

EMBER_REGISTER_KERNEL(csr_linear, DeviceType::CUDA, csr_linear_cuda);
EMBER_REGISTER_KERNEL(csr_matmul, DeviceType::CUDA, csr_matmul_cuda);

}  // namespace ember::kernels::cuda

#endif  // EMBER_WITH_CUSPARSE
