// The GEMM layer of the CUDA backend (blas.h): strided-batched row-major products through cuBLASLt, the switch to the
// hand-written tensor-core kernel, and the two small kernels gemm() needs (operand packing, the K == 0 output).
// Invariant: an operand reaches cuBLASLt in place whenever one of its strides is unit and the other a valid leading
// dimension, else as a packed copy; every scratch byte (packed operands, cuBLASLt workspace) is a tensor allocated for
// `stream`, and nothing here synchronises the host.
#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "ember/base/cuda_check.h"
#include "ember/core/tensor.h"
#include "ember/kernels/cuda/blas.h"
#include "ember/kernels/cuda/library_check.h"
#include "ember/kernels/cuda/scratch_sizes.h"
#include "ember/kernels/cuda/tensor_iter.cuh"

namespace ember::cuda {
namespace {

// Note [GEMM through cuBLASLt]
// cuBLASLt is column-major; a row-major M x N output is, read column-major, the N x M matrix out^T, and
// out^T = b^T a^T. So cuBLASLt's "A" is our b and its "B" is our a, and its D has N rows, M columns and leading
// dimension ldo. A row-major operand X (R x C, unit column stride, rows ld apart) is, read column-major, the C x R
// matrix X^T with that ld: it enters untransposed. A column-major one (unit row stride, columns ld apart) is the
// R x C matrix X itself: it enters with op = T. A size-1 dim may carry any stride (views leave them arbitrary), so it
// never disqualifies a layout and never serves as a leading dimension. An operand with neither unit stride, a leading
// dimension too small for its rows (a broadcast row), or a negative batch stride is packed into a contiguous copy
// first; a shared operand (batch stride 0) is packed once and stays shared.
// Batches of one call share a layout through CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT / STRIDED_BATCH_OFFSET. A batch
// offset of 0 on A or B (one matrix for every batch) is allowed by cuBLASLt (it is the attribute's default, and
// NVIDIA's MatX relies on it: NVIDIA/MatX#473); D's offset is never 0 when batch > 1 (checked). A call takes at
// most kMaxBatchPerCall batches (PyTorch splits cuBLAS batches the same way against grid-size limits,
// pytorch/pytorch#46001); larger batches run as several calls.
// Precision: f32 runs CUBLAS_COMPUTE_32F (never the TF32 fast path), f64 CUBLAS_COMPUTE_64F; f16/bf16 multiply with
// CUBLAS_COMPUTE_32F and f32 alpha/beta, and split-K partial sums are kept in f32 (the reduction schemes that sum in
// the 16-bit output type, INPLACE and OUTPUT_TYPE, are masked out), so the one rounding to 16 bits is the store.
// beta == 0 means C is not read (cuBLASLt follows BLAS here; the test harness poisons outputs with NaN to hold us to
// it), so out is passed as both C and D with one layout.
// Alignment: the heuristic assumes 256-byte aligned matrices unless told otherwise
// (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_* default), and views start anywhere, so every query states each matrix's real
// alignment (base address and batch step); the cached plan is keyed on it.

// Note [Bias epilogue]
// gemm(..., bias) computes out = alpha a @ b + bias with the bias broadcast over rows. In cuBLASLt's column-major
// terms the bias runs along D's rows (N of them: our columns), which is what CUBLASLT_EPILOGUE_BIAS broadcasts
// (BIAS_BATCH_STRIDE 0: one vector for every batch); the epilogue adds it in the f32 (f64) compute type before the
// one rounding to the output type, so the output is written once and never read. It is used for f32, f16 and bf16
// when K > 0 and the bias is 16-byte aligned: no preference attribute states the bias pointer's alignment (the
// heuristic reads it off the pointer, so the plan cache keys on it), and a kernel that loads the bias 16 bytes at a
// time has been reported to fault on a less aligned one (a proposed PyTorch fix, pytorch/pytorch#194497, falls back
// for the same reason). Otherwise (f64, an unaligned bias, K == 0, or no algorithm for the epilogue) out is filled
// with the bias rows and the product accumulated with beta = 1: the bias is then C's term, added in the compute type
// before the same one rounding, at the cost of one more pass over out. gemm_bias_fallbacks() counts these, so the
// tests can tell the epilogue ran (the result is the same either way).

constexpr uint64_t kWorkspaceLimit = uint64_t{32} << 20;  // bytes of cuBLASLt workspace an algorithm may ask for
constexpr int64_t kMaxBatchPerCall = ::ember::kernels::cuda::kGemmMaxBatchPerCall;  // per cublasLtMatmul call
constexpr size_t kMaxCachedPlans = 4096;         // heuristic results kept before the cache starts over

memory::StreamId stream_id(cudaStream_t s) { return static_cast<memory::StreamId>(reinterpret_cast<uintptr_t>(s)); }

std::atomic<int64_t> g_bias_fallbacks{0};  // Note [Bias epilogue]

// ---- kernels ----------------------------------------------------------------------------------------------------

// dst[i] = the i-th element (row-major order over [batch, rows, cols]) of the strided source; Word is an unsigned
// integer of the element's size, so every dtype is copied bit for bit by three instantiations.
template <class Word>
__global__ void pack_kernel(const Word* src, Word* dst, int64_t n, OffsetCalculator<1> calc) {
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) dst[i] = src[calc.get(i).v[0]];
}

// The i-th element (row-major order over [batch, rows, N]) of the strided output = row[i % N]: the bias rows (Note
// [Bias epilogue]); Word copies every dtype bit for bit, like pack_kernel.
template <class Word>
__global__ void fill_rows_kernel(const Word* row, Word* dst, int64_t n, int64_t N, OffsetCalculator<1> calc) {
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) dst[calc.get(i).v[0]] = row[i % N];
}

// out = beta * out over the strided [batch, M, N] output (K == 0: the product term is empty); beta == 0 stores zeros
// without reading out (it may hold NaN).
template <class T>
__global__ void scale_output_kernel(T* out, double beta, int64_t n, OffsetCalculator<1> calc) {
  using acc_t = op_math_t<T>;
  const acc_t b = static_cast<acc_t>(beta);
  for (int64_t i = grid_stride_begin(); i < n; i += grid_stride_step()) {
    const int64_t off = calc.get(i).v[0];
    out[off] = beta == 0.0 ? T(acc_t(0)) : T(b * static_cast<acc_t>(out[off]));
  }
}

// ---- launchers --------------------------------------------------------------------------------------------------

template <class Word>
void launch_pack(const void* src, void* dst, int64_t n, const OffsetCalculator<1>& calc, int device,
                 cudaStream_t stream) {
  pack_kernel<Word><<<grid_for(n, device), kElementwiseThreads, 0, stream>>>(static_cast<const Word*>(src),
                                                                             static_cast<Word*>(dst), n, calc);
  EMBER_CUDA_LAUNCH_CHECK();
}

// A contiguous row-major copy [copies, rows, cols] of operand m, allocated for `stream`.
Tensor pack_operand(DType dtype, int64_t copies, int64_t rows, int64_t cols, const MatrixRef& m, int device,
                    cudaStream_t stream) {
  Tensor packed = empty_on_stream({copies, rows, cols}, TensorOptions(dtype, Device::cuda(device)), stream_id(stream));
  const Shape sizes{copies, rows, cols};
  const Shape strides{copies == 1 ? 0 : m.batch_stride, m.row_stride, m.col_stride};
  const auto calc = make_offset_calculator<1>(sizes, {&strides}, "gemm");
  const int64_t n = copies * rows * cols;
  switch (itemsize(dtype)) {
    case 2:
      launch_pack<uint16_t>(m.data, packed.raw_data(), n, calc, device, stream);
      break;
    case 4:
      launch_pack<uint32_t>(m.data, packed.raw_data(), n, calc, device, stream);
      break;
    case 8:
      launch_pack<uint64_t>(m.data, packed.raw_data(), n, calc, device, stream);
      break;
    default:
      throw_unsupported_dtype("gemm", dtype);
  }
  return packed;
}

template <class Word>
void launch_fill_rows(const void* row, void* out, int64_t n, int64_t N, const OffsetCalculator<1>& calc, int device,
                      cudaStream_t stream) {
  fill_rows_kernel<Word><<<grid_for(n, device), kElementwiseThreads, 0, stream>>>(static_cast<const Word*>(row),
                                                                                  static_cast<Word*>(out), n, N, calc);
  EMBER_CUDA_LAUNCH_CHECK();
}

// Every row of the strided [batch, M, N] output = the N elements at `row` (the bias rows, Note [Bias epilogue]).
void fill_rows(DType dtype, int64_t batch, int64_t M, int64_t N, const void* row, void* out, int64_t out_batch_stride,
               int64_t ldo, int device, cudaStream_t stream) {
  const Shape sizes{batch, M, N};
  const Shape strides{out_batch_stride, ldo, 1};
  const auto calc = make_offset_calculator<1>(sizes, {&strides}, "gemm");
  const int64_t n = batch * M * N;
  switch (itemsize(dtype)) {
    case 2:
      launch_fill_rows<uint16_t>(row, out, n, N, calc, device, stream);
      break;
    case 4:
      launch_fill_rows<uint32_t>(row, out, n, N, calc, device, stream);
      break;
    case 8:
      launch_fill_rows<uint64_t>(row, out, n, N, calc, device, stream);
      break;
    default:
      throw_unsupported_dtype("gemm", dtype);
  }
}

// out = beta * out for K == 0 (zeros when beta == 0).
void scale_output(DType dtype, int64_t batch, int64_t M, int64_t N, void* out, int64_t out_batch_stride, int64_t ldo,
                  double beta, int device, cudaStream_t stream) {
  const Shape sizes{batch, M, N};
  const Shape strides{out_batch_stride, ldo, 1};
  const auto calc = make_offset_calculator<1>(sizes, {&strides}, "gemm");
  const int64_t n = batch * M * N;
  EMBER_DISPATCH_FLOAT(dtype, "gemm", [&] {
    scale_output_kernel<scalar_t>
        <<<grid_for(n, device), kElementwiseThreads, 0, stream>>>(static_cast<scalar_t*>(out), beta, n, calc);
    EMBER_CUDA_LAUNCH_CHECK();
  });
}

// ---- cuBLASLt handle and descriptors ----------------------------------------------------------------------------

// Note [Leaked cuBLASLt handles]
// One handle per device, created on first use under a mutex and never destroyed: a static destructor would run
// cublasLtDestroy after the CUDA driver may already have unloaded at process exit, which crashes. The handles (and
// the vector and mutex holding them) are deliberately leaked; the driver reclaims everything at exit. cuBLASLt takes
// the stream and workspace per call, so one handle serves every thread.
cublasLtHandle_t lt_handle(int device) {
  static auto* mu = new std::mutex;                            // Note [Leaked cuBLASLt handles]
  static auto* handles = new std::vector<cublasLtHandle_t>();  // Note [Leaked cuBLASLt handles]
  EMBER_CHECK(device >= 0, DeviceError, "gemm: invalid CUDA device index ", device);
  std::lock_guard<std::mutex> lock(*mu);
  if (handles->size() <= static_cast<size_t>(device)) handles->resize(static_cast<size_t>(device) + 1, nullptr);
  cublasLtHandle_t& h = (*handles)[static_cast<size_t>(device)];
  if (h == nullptr) EMBER_CUBLAS_CHECK(cublasLtCreate(&h));
  return h;
}

struct LayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* p) const { cublasLtMatrixLayoutDestroy(p); }
};
struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* p) const { cublasLtMatmulDescDestroy(p); }
};
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>;
using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PreferenceDeleter>;

// A column-major rows x cols layout with leading dimension ld, `batch` matrices `batch_stride` elements apart.
Layout make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int32_t batch, int64_t batch_stride) {
  cublasLtMatrixLayout_t raw = nullptr;
  EMBER_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&raw, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  Layout layout(raw);
  EMBER_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
  EMBER_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride,
                                                      sizeof(batch_stride)));
  return layout;
}

cudaDataType_t cuda_data_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f64:
      return CUDA_R_64F;
    case DType::f16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      throw_unsupported_dtype("gemm", dtype);
  }
}

// The largest power of two (at most 256, cuBLASLt's default assumption) dividing the address and the batch step in
// bytes: the alignment every matrix of the batch has.
uint32_t alignment_bytes(const void* p, int64_t batch_stride_bytes) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(p) | static_cast<uintptr_t>(batch_stride_bytes);
  uint32_t a = 1;
  while (a < 256 && (bits & a) == 0) a <<= 1;
  return a;
}

// ---- operands ---------------------------------------------------------------------------------------------------

// One operand as cuBLASLt reads it (Note [GEMM through cuBLASLt]).
struct Operand {
  const void* data = nullptr;
  bool col_major = false;  // stored column-major: enters with op = T
  int64_t ld = 1;
  int64_t batch_stride = 0;
};

// Operand m (rows x cols per batch) in place when its strides allow it, else packed into `keep`.
Operand prepare_operand(DType dtype, int64_t batch, int64_t rows, int64_t cols, const MatrixRef& m, int device,
                        cudaStream_t stream, Tensor& keep) {
  const int64_t bs = batch == 1 ? 0 : m.batch_stride;
  if (bs >= 0) {
    if ((cols == 1 || m.col_stride == 1) && (rows == 1 || m.row_stride >= cols))
      return {m.data, false, rows == 1 ? cols : m.row_stride, bs};
    if ((rows == 1 || m.row_stride == 1) && (cols == 1 || m.col_stride >= rows))
      return {m.data, true, cols == 1 ? rows : m.col_stride, bs};
  }
  const int64_t copies = bs == 0 ? 1 : batch;
  keep = pack_operand(dtype, copies, rows, cols, m, device, stream);
  return {keep.raw_data(), false, cols, copies == 1 ? 0 : rows * cols};
}

// ---- heuristic cache --------------------------------------------------------------------------------------------

// Everything cublasLtMatmulAlgoGetHeuristic sees for one call (in cuBLASLt's terms: A is our b, B is our a).
struct PlanKey {
  int device = 0;
  int dtype = 0;
  int64_t batch = 0, m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0, ldd = 0;
  int64_t stride_a = 0, stride_b = 0, stride_d = 0;
  uint32_t align_a = 0, align_b = 0, align_d = 0;
  bool bias = false;        // CUBLASLT_EPILOGUE_BIAS (Note [Bias epilogue])
  uint32_t align_bias = 0;  // the bias pointer's alignment, which the heuristic reads off the pointer
  auto operator<=>(const PlanKey&) const = default;
};

struct Plan {
  cublasLtMatmulAlgo_t algo;
  size_t workspace = 0;
  bool found = true;  // false: no algorithm for a bias epilogue (cached too; the caller falls back)
};

std::mutex& plan_mutex() {
  static auto* mu = new std::mutex;  // leaked with the cache: gemm may run while static destructors do
  return *mu;
}
std::map<PlanKey, Plan>& plan_cache() {
  static auto* cache = new std::map<PlanKey, Plan>();
  return *cache;
}

// The heuristic's first choice for `key`, queried once and then served from the cache.
Plan find_plan(const PlanKey& key, cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
               cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d, bool half_output) {
  {
    std::lock_guard<std::mutex> lock(plan_mutex());
    const auto it = plan_cache().find(key);
    if (it != plan_cache().end()) return it->second;
  }
  cublasLtMatmulPreference_t raw = nullptr;
  EMBER_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw));
  const Preference pref(raw);
  const uint64_t ws = kWorkspaceLimit;
  EMBER_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t align_c = key.align_d;
  EMBER_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_a,
                                                          sizeof(key.align_a)));
  EMBER_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_b,
                                                          sizeof(key.align_b)));
  EMBER_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c)));
  EMBER_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_d,
                                                          sizeof(key.align_d)));
  if (half_output) {  // Note [GEMM through cuBLASLt]: split-K partial sums stay in f32
    const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    EMBER_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(raw, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask)));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, d, d, raw, 1, &result, &count);
  const bool found = status == CUBLAS_STATUS_SUCCESS && count >= 1 && result.state == CUBLAS_STATUS_SUCCESS;
  // Note [Bias epilogue]: the caller fills the bias rows and accumulates instead — when the heuristic has nothing for
  // the epilogue (NOT_SUPPORTED, or no result); any other status is an error in the call and raised below.
  const bool unsupported = status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && count < 1) ||
                           (status == CUBLAS_STATUS_SUCCESS && result.state == CUBLAS_STATUS_NOT_SUPPORTED);
  if (!found && key.bias && unsupported) {
    Plan none{};
    none.found = false;
    std::lock_guard<std::mutex> lock(plan_mutex());
    if (plan_cache().size() >= kMaxCachedPlans) plan_cache().clear();
    plan_cache().emplace(key, none);
    return none;
  }
  if (!found) {
    EMBER_THROW(BackendError, "gemm: cuBLASLt has no algorithm for ", dtype_name(static_cast<DType>(key.dtype)),
                " batch ", key.batch, " (m, n, k) = (", key.m, ", ", key.n, ", ", key.k, "), op(A) ",
                key.trans_a ? "T" : "N", " lda ", key.lda, ", op(B) ", key.trans_b ? "T" : "N", " ldb ", key.ldb,
                ", ldd ", key.ldd, " (cublasLtMatmulAlgoGetHeuristic: ",
                status != CUBLAS_STATUS_SUCCESS ? ::ember::detail::cublas_status_text(status)
                : count < 1                     ? std::string("no result")
                                                : ::ember::detail::cublas_status_text(result.state),
                ")");
  }
  const Plan plan{result.algo, result.workspaceSize};
  std::lock_guard<std::mutex> lock(plan_mutex());
  if (plan_cache().size() >= kMaxCachedPlans) plan_cache().clear();
  plan_cache().emplace(key, plan);
  return plan;
}

// ---- the cuBLASLt product ---------------------------------------------------------------------------------------

// One cublasLtMatmul over `batch` (<= kMaxBatchPerCall) batches: out = alpha * a @ b + beta * out, operands prepared,
// plus the bias rows through the epilogue when bias is given (Note [Bias epilogue]). Returns false, having enqueued
// nothing, when cuBLASLt has no algorithm for the bias epilogue.
bool lt_matmul(DType dtype, int32_t batch, int64_t M, int64_t N, int64_t K, const Operand& a, const Operand& b,
               void* out, int64_t out_batch_stride, int64_t ldo, double alpha, double beta, int device,
               cudaStream_t stream, const void* bias) {
  const cudaDataType_t type = cuda_data_type(dtype);
  const bool f64 = dtype == DType::f64;
  const bool half = is_reduced_float(dtype);
  const int64_t item = itemsize(dtype);

  cublasLtMatmulDesc_t raw_desc = nullptr;
  EMBER_CUBLAS_CHECK(cublasLtMatmulDescCreate(&raw_desc, f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F,
                                              f64 ? CUDA_R_64F : CUDA_R_32F));
  const MatmulDesc desc(raw_desc);
  // cuBLASLt's A is our b (op(A): N x K), its B is our a (op(B): K x M); Note [GEMM through cuBLASLt].
  const cublasOperation_t trans_a = b.col_major ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t trans_b = a.col_major ? CUBLAS_OP_T : CUBLAS_OP_N;
  EMBER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  EMBER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  if (bias != nullptr) {  // Note [Bias epilogue]: along D's N rows, one vector for every batch, in D's dtype
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const int64_t bias_batch_stride = 0;
    const int32_t bias_type = type;
    EMBER_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    EMBER_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    EMBER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
                                                      &bias_batch_stride, sizeof(bias_batch_stride)));
    EMBER_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  }

  const Layout la = b.col_major ? make_layout(type, K, N, b.ld, batch, b.batch_stride)
                                : make_layout(type, N, K, b.ld, batch, b.batch_stride);
  const Layout lb = a.col_major ? make_layout(type, M, K, a.ld, batch, a.batch_stride)
                                : make_layout(type, K, M, a.ld, batch, a.batch_stride);
  const Layout ld = make_layout(type, N, M, ldo, batch, out_batch_stride);

  PlanKey key;
  key.device = device;
  key.dtype = static_cast<int>(dtype);
  key.batch = batch;
  key.m = N;
  key.n = M;
  key.k = K;
  key.trans_a = b.col_major;
  key.trans_b = a.col_major;
  key.lda = b.ld;
  key.ldb = a.ld;
  key.ldd = ldo;
  key.stride_a = b.batch_stride;
  key.stride_b = a.batch_stride;
  key.stride_d = out_batch_stride;
  key.align_a = alignment_bytes(b.data, b.batch_stride * item);
  key.align_b = alignment_bytes(a.data, a.batch_stride * item);
  key.align_d = alignment_bytes(out, out_batch_stride * item);
  key.bias = bias != nullptr;
  key.align_bias = bias != nullptr ? alignment_bytes(bias, 0) : 0;
  const cublasLtHandle_t handle = lt_handle(device);
  const Plan plan = find_plan(key, handle, raw_desc, la.get(), lb.get(), ld.get(), half);
  if (!plan.found) return false;

  // The workspace returns to the allocator's pool for `stream` when this function ends; work queued later on the
  // same stream runs after this product, so the bytes are not reused under it.
  Tensor workspace;
  void* ws_ptr = nullptr;
  if (plan.workspace > 0) {
    workspace = empty_on_stream({static_cast<int64_t>(plan.workspace)}, TensorOptions(DType::u8, Device::cuda(device)),
                                stream_id(stream));
    ws_ptr = workspace.raw_data();
  }
  const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
  const void* alpha_p = f64 ? static_cast<const void*>(&alpha) : static_cast<const void*>(&alpha_f);
  const void* beta_p = f64 ? static_cast<const void*>(&beta) : static_cast<const void*>(&beta_f);
  EMBER_CUBLAS_CHECK(cublasLtMatmul(handle, raw_desc, alpha_p, b.data, la.get(), a.data, lb.get(), beta_p, out,
                                    ld.get(), out, ld.get(), &plan.algo, ws_ptr, plan.workspace, stream));
  return true;
}

// Operand m of `rows` x `cols` per batch is a dense contiguous [batch, rows, cols] tensor (size-1 dims take any
// stride; the batch stride matters only when batch > 1).
bool dense_row_major(const MatrixRef& m, int64_t batch, int64_t rows, int64_t cols) {
  return (cols == 1 || m.col_stride == 1) && (rows == 1 || m.row_stride == cols) &&
         (batch == 1 || m.batch_stride == rows * cols);
}

// Whether m is dense as stored: row-major [batch, rows, cols] (*transposed false) or its transpose, [batch, cols, rows]
// row-major (*transposed true).
bool dense_storage(const MatrixRef& m, int64_t batch, int64_t rows, int64_t cols, bool* transposed) {
  *transposed = false;
  if (dense_row_major(m, batch, rows, cols)) return true;
  *transposed = (rows == 1 || m.row_stride == 1) && (cols == 1 || m.col_stride == rows) &&
                (batch == 1 || m.batch_stride == rows * cols);
  return *transposed;
}

// ---- strategy ---------------------------------------------------------------------------------------------------

std::atomic<int> g_strategy{-1};  // -1: not yet read from EMBER_GEMM

GemmStrategy strategy_from_env() {
  const char* env = std::getenv("EMBER_GEMM");
  if (env == nullptr || *env == '\0') return GemmStrategy::CublasLt;
  std::string v(env);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (v == "cublaslt") return GemmStrategy::CublasLt;
  if (v == "tensorcore") return GemmStrategy::TensorCore;
  EMBER_THROW(ConfigError, "EMBER_GEMM: expected 'cublaslt' or 'tensorcore', got '", env, "'");
}

}  // namespace

GemmStrategy gemm_strategy() {
  int s = g_strategy.load(std::memory_order_acquire);
  if (s < 0) {
    int expected = -1;  // a concurrent set_gemm_strategy wins over the environment
    g_strategy.compare_exchange_strong(expected, static_cast<int>(strategy_from_env()), std::memory_order_acq_rel);
    s = g_strategy.load(std::memory_order_acquire);
  }
  return static_cast<GemmStrategy>(s);
}

void set_gemm_strategy(GemmStrategy s) { g_strategy.store(static_cast<int>(s), std::memory_order_release); }

int64_t gemm_bias_fallbacks() { return g_bias_fallbacks.load(std::memory_order_relaxed); }

void gemm(DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K, const MatrixRef& a, const MatrixRef& b,
          void* out, int64_t out_batch_stride, int64_t ldo, double alpha, double beta, int device, cudaStream_t stream,
          const void* bias) {
  EMBER_CHECK(is_floating(dtype), DTypeError, "gemm: expects f32, f64, f16 or bf16, got ", dtype_name(dtype));
  EMBER_CHECK(batch >= 0 && M >= 0 && N >= 0 && K >= 0, ShapeError, "gemm: negative size in batch ", batch,
              " (M, N, K) = (", M, ", ", N, ", ", K, ")");
  if (batch == 0 || M == 0 || N == 0) return;
  if (M == 1) ldo = N;  // a single row: its leading dimension is never used
  if (batch == 1) out_batch_stride = 0;
  EMBER_CHECK(ldo >= N, ValueError, "gemm: output leading dimension ", ldo, " is smaller than N = ", N);
  EMBER_CHECK(batch == 1 || out_batch_stride >= (M - 1) * ldo + N, ValueError, "gemm: output batch stride ",
              out_batch_stride, " makes the ", batch, " outputs of ", M, " x ", N, " (ldo ", ldo, ") overlap");
  EMBER_CHECK(bias == nullptr || beta == 0.0, ValueError, "gemm: a bias requires beta == 0, got beta ", beta);
  // Note [Bias epilogue]: where the epilogue does not apply, out starts as the bias rows and accumulates (beta 1).
  const bool bias_epilogue = bias != nullptr && K > 0 && dtype != DType::f64 && alignment_bytes(bias, 0) >= 16;
  if (bias != nullptr && !bias_epilogue) {
    g_bias_fallbacks.fetch_add(1, std::memory_order_relaxed);
    fill_rows(dtype, batch, M, N, bias, out, out_batch_stride, ldo, device, stream);
    bias = nullptr;
    beta = 1.0;
  }
  if (K == 0) {  // an empty sum: out = beta * out (zeros when beta == 0, untouched when beta == 1)
    if (beta != 1.0) scale_output(dtype, batch, M, N, out, out_batch_stride, ldo, beta, device, stream);
    return;
  }
  // The hand-written kernels take dense operands in either storage order (a weight W read as W^T, a gradient's x^T)
  // and the bias into a dense output, where tensor_core_gemm_takes says one of them applies.
  if (gemm_strategy() == GemmStrategy::TensorCore && is_reduced_float(dtype) && alpha == 1.0 && beta == 0.0 &&
      ldo == N && (batch == 1 || out_batch_stride == M * N)) {
    TcGemmOperands ops;
    ops.a = a.data;
    ops.b = b.data;
    ops.bias = bias;
    if (dense_storage(a, batch, M, K, &ops.a_transposed) && dense_storage(b, batch, K, N, &ops.b_transposed) &&
        tensor_core_gemm_takes(dtype, M, N, K, ops, device)) {
      tensor_core_gemm(dtype, batch, M, N, K, ops, out, stream);
      return;
    }
  }
  // Packed copies (if any) live until every product that reads them is enqueued; like the workspace, they go back
  // to the pool for `stream`, behind the products.
  Tensor a_keep, b_keep;
  const Operand pa = prepare_operand(dtype, batch, M, K, a, device, stream, a_keep);
  const Operand pb = prepare_operand(dtype, batch, K, N, b, device, stream, b_keep);
  const int64_t item = itemsize(dtype);
  for (int64_t b0 = 0; b0 < batch; b0 += kMaxBatchPerCall) {
    const int64_t n = std::min(kMaxBatchPerCall, batch - b0);
    Operand ca = pa, cb = pb;
    ca.data = static_cast<const char*>(pa.data) + b0 * pa.batch_stride * item;
    cb.data = static_cast<const char*>(pb.data) + b0 * pb.batch_stride * item;
    void* co = static_cast<char*>(out) + b0 * out_batch_stride * item;
    if (!lt_matmul(dtype, static_cast<int32_t>(n), M, N, K, ca, cb, co, out_batch_stride, ldo, alpha, beta, device,
                   stream, bias)) {
      // No algorithm for the bias epilogue (nothing enqueued for this call yet): the bias rows, then accumulate.
      g_bias_fallbacks.fetch_add(1, std::memory_order_relaxed);
      fill_rows(dtype, n, M, N, bias, co, out_batch_stride, ldo, device, stream);
      lt_matmul(dtype, static_cast<int32_t>(n), M, N, K, ca, cb, co, out_batch_stride, ldo, alpha, 1.0, device, stream,
                nullptr);
    }
  }
}

}  // namespace ember::cuda
