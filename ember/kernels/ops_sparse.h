// The ops of pruning and sparse storage: bit-packed masks (pack, unpack, zero where a bit is 0) and CSR matrices
// with sparse x dense products. Invariants: a packed mask is a contiguous u8 tensor of ceil(n/8) bytes, bit i of
// element i at byte i/8, bit i%8 (LSB first), padding bits 0; a CsrMatrix that validate() accepts is safe to read.
#pragma once

#include <cstdint>
#include <optional>

#include "ember/core/tensor.h"
#include "ember/kernels/stubs.h"

namespace ember {

// ---- stubs (kernels in kernels/cpu/bit_mask.cpp and kernels/cpu/sparse_matmul.cpp) ---------------------------------
// out (u8 [ceil(n/8)], contiguous) = the bits of mask (bool [n], contiguous), LSB first, padding bits 0.
using PackMaskFn = void (*)(const Tensor& mask, const Tensor& out);
// out (bool [n], contiguous) = the first n bits of packed (u8, contiguous).
using UnpackMaskFn = void (*)(const Tensor& packed, const Tensor& out);
// t (floating, contiguous, n elements) = 0 where bit i of packed is 0; kept elements are not touched.
using MaskedZeroFn = void (*)(const Tensor& t, const Tensor& packed);
// out [B, N] = x [B, K] W^T (+ bias [N] when defined); W [N, K] in CSR (values, col_indices, row_ptr), all
// contiguous; values, x, bias and out share a floating dtype; indices i16/i32, row_ptr i32/i64; out is fresh.
using CsrLinearFn = void (*)(const Tensor& x, const Tensor& values, const Tensor& col_indices, const Tensor& row_ptr,
                             const Tensor& bias, const Tensor& out);
// out [M, N] = A [M, K] (CSR) @ dense [K, N]; dense and out contiguous, one floating dtype with values.
using CsrMatmulFn = void (*)(const Tensor& values, const Tensor& col_indices, const Tensor& row_ptr,
                             const Tensor& dense, const Tensor& out);

EMBER_DECLARE_STUB(pack_mask, PackMaskFn);
EMBER_DECLARE_STUB(unpack_mask, UnpackMaskFn);
EMBER_DECLARE_STUB(masked_zero, MaskedZeroFn);
EMBER_DECLARE_STUB(csr_linear, CsrLinearFn);
EMBER_DECLARE_STUB(csr_matmul, CsrMatmulFn);

// A sparse matrix [rows, cols] in compressed sparse row form: the nonzeros of row r are values[row_ptr[r] ..
// row_ptr[r+1]) at columns col_indices[same range], strictly ascending within a row (no duplicates: dense_to_csr
// writes them so and validate() requires it, so a matrix has one dense form).
struct CsrMatrix {
  Tensor values;       // [nnz], floating (f32 on the CPU path; f64 too)
  Tensor col_indices;  // [nnz], i16 or i32
  Tensor row_ptr;      // [rows + 1], i32 or i64; row_ptr[0] = 0, non-decreasing, row_ptr[rows] = nnz
  int64_t rows = 0, cols = 0;

  int64_t nnz() const { return values.defined() ? values.numel() : 0; }
  // Bytes of the three tensors (what the storage costs): nnz * (value + index size) + (rows + 1) * row_ptr size.
  int64_t nbytes() const;
  Device device() const { return values.device(); }
};

namespace ops {

// ---- bit-packed masks -----------------------------------------------------------------------------------------
// mask: bool of any shape (read in row-major order) -> u8 [ceil(numel/8)] on mask's device.
Tensor pack_mask(const Tensor& mask);
// packed: u8 [>= ceil(numel(shape)/8)] -> bool of `shape` (ShapeError when packed is too short or too long).
Tensor unpack_mask(const Tensor& packed, const Shape& shape);
// Zeroes, in place, the elements of t (floating, contiguous; any shape) whose bit is 0. Bumps t's version. ValueError
// when t requires grad while grad mode is on (run it under NoGradGuard), DeviceError when the devices differ.
void masked_zero_(const Tensor& t, const Tensor& packed);
// The number of 1 bits among the first n bits of packed (kept elements); on the host (a CPU copy is made if needed).
int64_t mask_count(const Tensor& packed, int64_t n);

// ---- CSR ---------------------------------------------------------------------------------------------------------
// The exact nonzeros of a 2-d floating tensor (NaN counts as nonzero; -0.0 as zero). index_dtype: i16 or i32 for the
// column indices (default: i16 when cols <= 32768, else i32); row_ptr i32 when nnz < 2^31, else i64. Built on the
// host and moved to dense2d's device.
CsrMatrix dense_to_csr(const Tensor& dense2d, std::optional<DType> index_dtype = std::nullopt);
// The dense [rows, cols] tensor of a (valid) CSR matrix, in values' dtype, on its device.
Tensor csr_to_dense(const CsrMatrix& m);
// Checks a CSR matrix built by hand or loaded from a file: dtypes (DTypeError), 1-d tensors of consistent lengths
// (ShapeError), one device (DeviceError), row_ptr[0] == 0, non-decreasing, last == nnz (ValueError), column indices
// in [0, cols) (IndexError) and ascending within each row (ValueError). Reads the indices on the host.
void validate(const CsrMatrix& m);
// y [..., N] = x [..., K] W^T + bias, W [N, K] in CSR (nn.Linear convention); bias [N] or undefined. x, values and
// bias share a dtype (f32 or f64 on CPU: DTypeError otherwise).
Tensor csr_linear(const Tensor& x, const CsrMatrix& w, const Tensor& bias = Tensor());
// [M, N] = A [M, K] (CSR) @ dense [K, N].
Tensor csr_matmul(const CsrMatrix& a, const Tensor& dense);

}  // namespace ops
}  // namespace ember
