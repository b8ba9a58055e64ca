// Front ends of the pruning and sparse ops (ops_sparse.h): bit-packed masks and CSR conversion, validation and
// products. Invariant: a kernel is reached with contiguous operands of checked shapes, dtypes and device; the CSR
// structure (row_ptr, column indices) is trusted by the products and checked by validate() where it comes from outside.
#include "ember/kernels/ops_sparse.h"

#include <bit>
#include <limits>
#include <vector>

#include "ember/core/grad_mode.h"
#include "ember/kernels/convert.h"
#include "ember/kernels/ops.h"

namespace ember {

EMBER_DEFINE_STUB(pack_mask, PackMaskFn);
EMBER_DEFINE_STUB(unpack_mask, UnpackMaskFn);
EMBER_DEFINE_STUB(masked_zero, MaskedZeroFn);
EMBER_DEFINE_STUB(csr_linear, CsrLinearFn);
EMBER_DEFINE_STUB(csr_matmul, CsrMatmulFn);

int64_t CsrMatrix::nbytes() const {
  int64_t n = 0;
  for (const Tensor* t : {&values, &col_indices, &row_ptr})
    if (t->defined()) n += t->nbytes();
  return n;
}

namespace ops {

namespace {

int64_t packed_size(int64_t n) { return (n + 7) / 8; }

void check_packed(const char* op, const Tensor& packed, int64_t n) {
  EMBER_CHECK(packed.defined(), ValueError, op, ": the packed mask is an undefined tensor");
  EMBER_CHECK(packed.dtype() == DType::u8, DTypeError, op, ": a packed mask is u8, got ", packed.description());
  EMBER_CHECK(packed.dim() == 1 && packed.numel() == packed_size(n), ShapeError, op, ": a packed mask of ", n,
              " elements is u8[", packed_size(n), "], got ", packed.description());
}

// The structure checks that read no data: dtypes, ranks, lengths, devices. Returns the common device.
Device check_structure(const char* op, const CsrMatrix& m) {
  EMBER_CHECK(m.values.defined() && m.col_indices.defined() && m.row_ptr.defined(), ValueError, op,
              ": a CSR matrix needs values, col_indices and row_ptr (one is undefined)");
  const Device dev = common_device(op, {&m.values, &m.col_indices, &m.row_ptr});
  check_floating(op, m.values);
  EMBER_CHECK(m.col_indices.dtype() == DType::i16 || m.col_indices.dtype() == DType::i32, DTypeError, op,
              ": CSR column indices are i16 or i32, got ", m.col_indices.description());
  EMBER_CHECK(m.row_ptr.dtype() == DType::i32 || m.row_ptr.dtype() == DType::i64, DTypeError, op,
              ": CSR row_ptr is i32 or i64, got ", m.row_ptr.description());
  EMBER_CHECK(m.rows >= 0 && m.cols >= 0, ValueError, op, ": CSR sizes must be non-negative, got [", m.rows, ", ",
              m.cols, "]");
  EMBER_CHECK(m.values.dim() == 1 && m.col_indices.dim() == 1 && m.row_ptr.dim() == 1, ShapeError, op,
              ": CSR tensors are 1-d, got values ", m.values.description(), ", col_indices ",
              m.col_indices.description(), ", row_ptr ", m.row_ptr.description());
  EMBER_CHECK(m.col_indices.numel() == m.values.numel(), ShapeError, op, ": CSR col_indices ",
              m.col_indices.description(), " must have one entry per value (", m.values.numel(), ")");
  EMBER_CHECK(m.row_ptr.numel() == m.rows + 1, ShapeError, op, ": CSR row_ptr of a matrix with ", m.rows,
              " rows has ", m.rows + 1, " entries, got ", m.row_ptr.description());
  EMBER_CHECK(m.col_indices.dtype() != DType::i16 || m.cols <= 32768, ValueError, op,
              ": i16 column indices hold at most 32768 columns, the matrix has ", m.cols);
  return dev;
}

}  // namespace

// ---- bit-packed masks -------------------------------------------------------------------------------------------

Tensor pack_mask(const Tensor& mask) {
  const char* op = "pack_mask";
  EMBER_CHECK(mask.defined(), ValueError, op, ": mask is an undefined tensor");
  EMBER_CHECK(mask.dtype() == DType::b8, DTypeError, op, ": expects a bool mask, got ", mask.description());
  const int64_t n = mask.numel();
  Tensor out = empty({packed_size(n)}, {DType::u8, mask.device()});
  if (n > 0) run_kernel(pack_mask_stub, mask.device(), mask.contiguous().reshape({n}), out);
  return out;
}

Tensor unpack_mask(const Tensor& packed, const Shape& shape) {
  const char* op = "unpack_mask";
  const int64_t n = numel_of(shape);
  check_packed(op, packed, n);
  Tensor out = empty(shape, {DType::b8, packed.device()});
  if (n > 0) run_kernel(unpack_mask_stub, packed.device(), packed.contiguous(), out.view({n}));
  return out;
}

void masked_zero_(const Tensor& t, const Tensor& packed) {
  const char* op = "masked_zero_";
  EMBER_CHECK(t.defined(), ValueError, op, ": tensor is an undefined tensor");
  check_floating(op, t);
  check_packed(op, packed, t.numel());
  const Device dev = common_device(op, {&t, &packed});
  EMBER_CHECK(t.is_contiguous(), ValueError, op, ": the tensor must be contiguous, got ", t.description(),
              " with strides ", shape_str(t.strides()));
  EMBER_CHECK(!(GradMode::is_enabled() && t.requires_grad()), ValueError, op, ": in-place write into ",
              t.description(), ", which requires grad, while grad mode is on; run it under NoGradGuard");
  t.bump_version();
  if (t.numel() > 0) run_kernel(masked_zero_stub, dev, t, packed.contiguous());
}

int64_t mask_count(const Tensor& packed, int64_t n) {
  check_packed("mask_count", packed, n);
  const Tensor host = packed.cpu().contiguous();
  const uint8_t* p = static_cast<const uint8_t*>(host.raw_data());
  int64_t count = 0;
  for (int64_t i = 0; i < n / 8; ++i) count += std::popcount(static_cast<unsigned>(p[i]));
  if (n % 8 != 0) count += std::popcount(static_cast<unsigned>(p[n / 8] & ((1u << (n % 8)) - 1u)));
  return count;
}

// ---- CSR ----------------------------------------------------------------------------------------------------------

CsrMatrix dense_to_csr(const Tensor& dense2d, std::optional<DType> index_dtype) {
  const char* op = "dense_to_csr";
  EMBER_CHECK(dense2d.defined(), ValueError, op, ": the tensor is undefined");
  EMBER_CHECK(dense2d.dim() == 2, ShapeError, op, ": expects a 2-d tensor, got ", dense2d.description());
  check_floating(op, dense2d);
  const int64_t rows = dense2d.size(0), cols = dense2d.size(1);
  const DType idx = index_dtype.value_or(cols <= 32768 ? DType::i16 : DType::i32);
  EMBER_CHECK(idx == DType::i16 || idx == DType::i32, DTypeError, op, ": column indices are i16 or i32, got ",
              dtype_name(idx));
  EMBER_CHECK(idx != DType::i16 || cols <= 32768, ValueError, op, ": i16 column indices hold at most 32768 "
              "columns, the tensor ", dense2d.description(), " has ", cols, "; use i32");
  EMBER_CHECK(cols - 1 <= std::numeric_limits<int32_t>::max(), ValueError, op, ": ", cols,
              " columns do not fit i32 column indices");
  const Tensor host = dense2d.cpu().contiguous();
  CsrMatrix m;
  m.rows = rows;
  m.cols = cols;
  EMBER_DISPATCH_FLOAT(host.dtype(), op, [&] {
    const scalar_t* src = static_cast<const scalar_t*>(host.raw_data());
    const int64_t total = rows * cols;
    int64_t nnz = 0;
    for (int64_t i = 0; i < total; ++i) nnz += kernels::convert<bool>(src[i]);  // x != 0; NaN counts (Note [Casts])
    const DType rp = nnz <= std::numeric_limits<int32_t>::max() ? DType::i32 : DType::i64;
    m.values = empty({nnz}, {host.dtype(), Device::cpu()});
    m.col_indices = empty({nnz}, {idx, Device::cpu()});
    m.row_ptr = empty({rows + 1}, {rp, Device::cpu()});
    scalar_t* vals = static_cast<scalar_t*>(m.values.raw_data());
    EMBER_DISPATCH_INDEX(rp, op, [&] {
      using P = scalar_t;
      P* rptr = static_cast<P*>(m.row_ptr.raw_data());
      auto fill = [&](auto* colp) {
        using I = std::remove_pointer_t<decltype(colp)>;
        int64_t k = 0;
        rptr[0] = 0;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            const auto v = src[r * cols + c];
            if (!kernels::convert<bool>(v)) continue;
            vals[k] = v;
            colp[k] = static_cast<I>(c);
            ++k;
          }
          rptr[r + 1] = static_cast<P>(k);
        }
      };
      if (idx == DType::i16)
        fill(static_cast<int16_t*>(m.col_indices.raw_data()));
      else
        fill(static_cast<int32_t*>(m.col_indices.raw_data()));
    });
  });
  if (!dense2d.device().is_cpu()) {
    m.values = m.values.to(dense2d.device());
    m.col_indices = m.col_indices.to(dense2d.device());
    m.row_ptr = m.row_ptr.to(dense2d.device());
  }
  return m;
}

void validate(const CsrMatrix& m) {
  const char* op = "validate(CsrMatrix)";
  check_structure(op, m);
  const std::vector<int64_t> rp = m.row_ptr.to_vector<int64_t>();
  const std::vector<int64_t> ci = m.col_indices.to_vector<int64_t>();
  const int64_t nnz = m.nnz();
  EMBER_CHECK(rp[0] == 0, ValueError, op, ": row_ptr[0] must be 0, got ", rp[0]);
  EMBER_CHECK(rp[m.rows] == nnz, ValueError, op, ": row_ptr[", m.rows, "] must equal nnz = ", nnz, ", got ",
              rp[m.rows]);
  for (int64_t r = 0; r < m.rows; ++r) {
    EMBER_CHECK(rp[r] <= rp[r + 1], ValueError, op, ": row_ptr must be non-decreasing, got row_ptr[", r, "] = ",
                rp[r], " > row_ptr[", r + 1, "] = ", rp[r + 1]);
    for (int64_t k = rp[r]; k < rp[r + 1]; ++k) {
      EMBER_CHECK(ci[k] >= 0 && ci[k] < m.cols, IndexError, op, ": column index ", ci[k], " at position ", k,
                  " (row ", r, ") is out of range [0, ", m.cols, ")");
      EMBER_CHECK(k == rp[r] || ci[k - 1] < ci[k], ValueError, op, ": column indices of row ", r,
                  " must be strictly ascending, got ", ci[k - 1], " then ", ci[k], " at position ", k);
    }
  }
}

Tensor csr_to_dense(const CsrMatrix& m) {
  const char* op = "csr_to_dense";
  validate(m);
  const std::vector<int64_t> rp = m.row_ptr.to_vector<int64_t>();
  const std::vector<int64_t> ci = m.col_indices.to_vector<int64_t>();
  const Tensor vals = m.values.cpu().contiguous();
  Tensor out = zeros({m.rows, m.cols}, {m.values.dtype(), Device::cpu()});
  EMBER_DISPATCH_FLOAT(vals.dtype(), op, [&] {
    const scalar_t* v = static_cast<const scalar_t*>(vals.raw_data());
    scalar_t* o = static_cast<scalar_t*>(out.raw_data());
    for (int64_t r = 0; r < m.rows; ++r)
      for (int64_t k = rp[r]; k < rp[r + 1]; ++k) o[r * m.cols + ci[k]] = v[k];
  });
  return out.to(m.values.device());
}

Tensor csr_linear(const Tensor& x, const CsrMatrix& w, const Tensor& bias) {
  const char* op = "csr_linear";
  check_structure(op, w);
  EMBER_CHECK(x.defined(), ValueError, op, ": x is an undefined tensor");
  const Device dev = common_device(op, {&x, &w.values, &bias});
  EMBER_CHECK(x.dim() >= 1 && x.size(-1) == w.cols, ShapeError, op, ": input ", x.description(),
              " does not end in in_features ", w.cols, " of the CSR weight [", w.rows, ", ", w.cols, "]");
  EMBER_CHECK(x.dtype() == w.values.dtype(), DTypeError, op, ": input and CSR values must have one dtype, got ",
              x.description(), " and values ", w.values.description());
  if (bias.defined()) {
    EMBER_CHECK(bias.dim() == 1 && bias.size(0) == w.rows, ShapeError, op, ": bias must be [", w.rows, "], got ",
                bias.description());
    EMBER_CHECK(bias.dtype() == x.dtype(), DTypeError, op, ": bias dtype must match the input, got ",
                bias.description(), " and ", x.description());
  }
  const int64_t K = w.cols, N = w.rows;
  const int64_t B = K > 0 ? x.numel() / K : numel_of(Shape(x.sizes().begin(), x.sizes().end() - 1));
  Shape out_shape(x.sizes().begin(), x.sizes().end() - 1);
  out_shape.push_back(N);
  Tensor out = empty({B, N}, {x.dtype(), dev});
  if (B > 0 && N > 0)
    run_kernel(csr_linear_stub, dev, x.reshape({B, K}).contiguous(), w.values.contiguous(),
               w.col_indices.contiguous(), w.row_ptr.contiguous(), bias.defined() ? bias.contiguous() : Tensor(),
               out);
  return out.view(out_shape);
}

Tensor csr_matmul(const CsrMatrix& a, const Tensor& dense) {
  const char* op = "csr_matmul";
  check_structure(op, a);
  EMBER_CHECK(dense.defined(), ValueError, op, ": the dense operand is an undefined tensor");
  const Device dev = common_device(op, {&dense, &a.values});
  EMBER_CHECK(dense.dim() == 2 && dense.size(0) == a.cols, ShapeError, op, ": CSR [", a.rows, ", ", a.cols,
              "] @ dense needs a dense operand of shape [", a.cols, ", N], got ", dense.description());
  EMBER_CHECK(dense.dtype() == a.values.dtype(), DTypeError, op, ": dense operand and CSR values must have one "
              "dtype, got ", dense.description(), " and values ", a.values.description());
  const int64_t M = a.rows, N = dense.size(1);
  Tensor out = empty({M, N}, {dense.dtype(), dev});
  if (M > 0 && N > 0)
    run_kernel(csr_matmul_stub, dev, a.values.contiguous(), a.col_indices.contiguous(), a.row_ptr.contiguous(),
               dense.contiguous(), out);
  return out;
}

}  // namespace ops
}  // namespace ember
