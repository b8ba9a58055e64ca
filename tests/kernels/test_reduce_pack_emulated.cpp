// The packed sum kernels (ember/kernels/cuda/reduce_pack_kernels.cuh, Note [Packed sums] in reduce.cu) run on the CPU
// under the SIMT emulator (tests/harness/simt_emulator.h) against float64: column sums and means over row groups
// (stored whole, or as partial sums that sum_groups_kernel adds), and row sums and means with a warp per row over a
// grid smaller than the rows. f32 accumulates in double, bf16 in float (Note [Reduction accumulator]). Outputs are
// NaN-poisoned first. ReduceTest.PackedSumsMatchReference checks the launcher on a GPU.
#include <cmath>
#include <limits>
#include <vector>

#include "tests/harness/simt_emulator.h"
// The emulator's definitions of the CUDA names come first.
#include "ember/kernels/cuda/reduce_pack_kernels.cuh"
#include "tests/harness/op_harness.h"
#include "tests/kernels/emulated_buffers.h"

namespace ember::testing {
namespace {

namespace rp = ::ember::kernels::cuda::reduce_pack;

template <class T>
using Acc = std::conditional_t<std::is_same_v<T, float>, double, float>;

template <class T>
T nan_of() {
  return T(std::numeric_limits<float>::quiet_NaN());
}

// n elements of T in [-2, 2) (draws whose sums cancel), 16-byte aligned.
template <class T>
AlignedBuffer<T> operand(int64_t n, uint32_t seed) {
  AlignedBuffer<T> b(n);
  fill_uniform(b, n, seed, -2.0, 2.0);
  return b;
}

// f32 in double: the output's one rounding; bf16 in float: the output's rounding (2^-9) and float additions.
template <class T>
double tolerance() {
  return std::is_same_v<T, float> ? 1e-6 : 4e-3;
}

template <class T>
void check_columns(int64_t rows, int64_t cols, int64_t groups, bool mean, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << (std::is_same_v<T, float> ? "f32" : "bf16") << " rows " << rows << " cols "
                                    << cols << " groups " << groups << (mean ? " mean" : " sum"));
  using A = Acc<T>;
  constexpr int V = ::ember::cuda::Pack<T>::kSize;
  ASSERT_EQ(cols % V, 0);
  const AlignedBuffer<T> in = operand<T>(rows * cols, seed);
  std::vector<T> out(static_cast<size_t>(cols), nan_of<T>());
  std::vector<A> partial(static_cast<size_t>(groups * cols), std::numeric_limits<A>::quiet_NaN());
  const int64_t rows_per_group = (rows + groups - 1) / groups;
  const simt::Dim3 grid{static_cast<unsigned>((cols / V + rp::kPackColumns - 1) / rp::kPackColumns),
                        static_cast<unsigned>(groups), 1};
  void* sums = groups == 1 ? static_cast<void*>(out.data()) : static_cast<void*>(partial.data());
  simt::launch(grid, rp::kPackColumns * rp::kRowThreads,
               [&] { rp::column_sum_pack_kernel<T, A>(in.data, rows, cols, rows_per_group, sums, groups == 1, mean); });
  if (groups > 1)
    simt::launch(simt::Dim3{2, 1, 1}, 64, [&] {  // fewer threads than columns: the grid-stride loop
      rp::sum_groups_kernel<A, T>(partial.data(), groups, cols, rows, mean, out.data());
    });
  std::vector<double> want(static_cast<size_t>(cols), 0.0), got(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) want[static_cast<size_t>(j)] += in.at(r * cols + j);
  for (int64_t j = 0; j < cols; ++j) {
    if (mean) want[static_cast<size_t>(j)] /= static_cast<double>(rows);
    got[static_cast<size_t>(j)] = static_cast<float>(out[static_cast<size_t>(j)]);
  }
  EXPECT_LE(normalised_error(got, want), tolerance<T>());
}

template <class T>
void check_rows(int64_t rows, int64_t n, unsigned blocks, bool mean, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << (std::is_same_v<T, float> ? "f32" : "bf16") << " rows " << rows << " n " << n
                                    << " blocks " << blocks << (mean ? " mean" : " sum"));
  using A = Acc<T>;
  ASSERT_EQ(n % ::ember::cuda::Pack<T>::kSize, 0);
  const AlignedBuffer<T> in = operand<T>(rows * n, seed);
  std::vector<T> out(static_cast<size_t>(rows), nan_of<T>());
  simt::launch(simt::Dim3{blocks, 1, 1}, rp::kRowBlockWarps * 32,
               [&] { rp::row_sum_pack_kernel<T, A>(in.data, rows, n, mean, out.data()); });
  std::vector<double> want(static_cast<size_t>(rows), 0.0), got(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < n; ++k) want[static_cast<size_t>(r)] += in.at(r * n + k);
    if (mean) want[static_cast<size_t>(r)] /= static_cast<double>(n);
    got[static_cast<size_t>(r)] = static_cast<float>(out[static_cast<size_t>(r)]);
  }
  EXPECT_LE(normalised_error(got, want), tolerance<T>());
}

TEST(ReducePackEmulatedTest, ColumnSumsMatchFloat64) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the emulator's fibers switch stacks, which ThreadSanitizer is not told about";
#endif
  check_columns<float>(70, 136, 1, false, 1u);     // 34 packs: a second, partial block of columns; stored whole
  check_columns<float>(300, 8, 3, false, 2u);      // three row groups, the last partial: partial sums
  check_columns<float>(129, 264, 2, true, 3u);     // a mean over groups of 65 and 64 rows
  check_columns<BFloat16>(45, 264, 1, false, 4u);  // 33 packs of 8
  check_columns<BFloat16>(200, 520, 4, true, 5u);  // 65 packs over three column blocks, four groups
  check_columns<float>(10, 8, 6, false, 10u);       // groups of 2 rows, the last one empty (as past kPackMaxGroups)
}

TEST(ReducePackEmulatedTest, RowSumsMatchFloat64) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the emulator's fibers switch stacks, which ThreadSanitizer is not told about";
#endif
  check_rows<float>(19, 128, 1, false, 6u);        // one pack per lane; 19 rows over 8 warps: a grid-stride loop
  check_rows<float>(10, 4 * 70, 2, true, 7u);      // 70 packs: lanes 0-5 take a third pack
  check_rows<BFloat16>(17, 8 * 33, 1, false, 8u);  // 33 packs of 8
  check_rows<BFloat16>(9, 8 * 96, 3, true, 9u);    // more warps than rows: idle warps
}

}  // namespace
}  // namespace ember::testing
