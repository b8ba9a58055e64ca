// One GEMM shape run many times: c [M, N] = a [M, K] @ b [K, N] (or c += a @ b) for f32/f64 through Eigen's blocked
// GEMM, with every workspace byte (packed operands, Eigen's panels) taken from the host allocator when the object
// is made (Note [Kernel workspace] in conv_pool.cpp). run() allocates nothing, so kernels call it inside parallel
// chunks. Invariant: each element of c is summed in the same order however the product is split over the CPU
// threads (Note [Parallel GEMM] in gemm.cpp), so results never depend on the thread count.
#pragma once

#include <cstdint>
#include <memory>

#include "ember/core/dtype.h"

namespace ember::kernels::cpu {

class MetaWorkspace;

template <class T>  // float or double
class Gemm {
 public:
  // Operand element strides: a's (rows, cols) = (a_rs, a_cs), b's = (b_rs, b_cs); a unit stride in either direction
  // is used in place, otherwise run() packs the operand into workspace first. With split, a large product runs over
  // the CPU threads in row or column blocks (each with its own workspace), when run() is called outside a parallel
  // chunk; without it run() is serial.
  Gemm(int64_t M, int64_t K, int64_t N, int64_t a_rs, int64_t a_cs, int64_t b_rs, int64_t b_cs, bool split);
  ~Gemm();
  Gemm(Gemm&&) noexcept;
  Gemm& operator=(Gemm&&) noexcept;

  // c (row-major, row stride ldc) = a @ b, or c += a @ b when accumulate.
  void run(const T* a, const T* b, T* c, int64_t ldc, bool accumulate = false);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// What Gemm<T>'s constructor takes, T = f32 or f64 by dtype, into ws on meta (Note [Meta kernels] in kernels/stubs.h).
void take_gemm_workspace(MetaWorkspace& ws, DType dtype, int64_t M, int64_t K, int64_t N, int64_t a_rs, int64_t a_cs,
                         int64_t b_rs, int64_t b_cs, bool split);

// How many chunks a batch of B products [M, K] x [K, N] is split into over the CPU threads (1: run the batches
// one after another, each product possibly split itself). Depends only on the sizes and the thread count.
int64_t gemm_batch_chunks(int64_t B, int64_t M, int64_t K, int64_t N);

}  // namespace ember::kernels::cpu
