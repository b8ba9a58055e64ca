// CUDA kernel of the `reduce` stub (sum, mean, amax, amin, var, argmax, argmin over any dims of a strided input):
// __global__ kernel, launcher (kernel shape, grid math, current stream), entry point (checks). Invariant: results
// follow cpu/reduce.cpp (exact int64 integer sums, NaN propagation, first index on ties and NaNs), each written once.
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include <cub/device/device_reduce.cuh>

#include "ember/base/cuda_check.h"
#include "ember/kernels/convert.h"
#include "ember/kernels/cuda/reduce_pack_kernels.cuh"
#include "ember/kernels/cuda/reduce_plan.h"
#include "ember/kernels/cuda/stream.h"
#include "ember/kernels/cuda/tensor_iter.cuh"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cuda {
namespace {

using ::ember::cuda::device_properties;
using ::ember::cuda::DeviceGuard;
using ::ember::cuda::make_offset_calculator;
using ::ember::cuda::OffsetCalculator;

// Note [Reduction accumulator]
// f32 and f64 inputs accumulate in double, f16/bf16 in float, integers and bool in int64 (max/min values of every
// integer dtype fit it exactly). f32 takes double, not float: the results are held to 1e-5 relative / 1e-6 absolute
// of a double reference, and a float tree over a cancelling sum (partials ~10, result ~0) errs by ~1e-6 absolute.
// A reduction is memory-bound and sm_90 adds doubles at half the float rate, so the wider adds cost no time.
template <class T>
using acc_t = std::conditional_t<std::is_floating_point_v<op_math_t<T>>,
                                 std::conditional_t<std::is_same_v<op_math_t<T>, T>, double, float>, int64_t>;

// Note [Reduction state]
// What one thread (then a warp, a block, a split) knows about its share of one output's reduced elements:
//   Sum, Mean        a = the sum;
//   Max, Min         a = the best value so far (identity -inf / +inf, or the integer extremes);
//   ArgMax, ArgMin   a = the best value, k = its index in row-major order of the reduced dims (kNoIndex: none yet);
//   Var              a = the mean, b = the sum of squared deviations from it, k = the count (Welford's update per
//                    element, Chan's formula to merge two states; comparable in accuracy to the CPU's two passes).
// combine() for max/min/argmax/argmin is commutative: a NaN beats every number, equal values (or two NaNs) keep the
// smaller index. So the shape of the tree cannot change the result, which is the CPU's first-index/first-NaN rule.
// Plain data (no member initialisers), so arrays of it can live in shared memory.
template <class A>
struct State {
  A a;
  A b;
  int64_t k;
};

constexpr int64_t kNoIndex = std::numeric_limits<int64_t>::max();

// Note [Reduction shapes]
// Every thread takes an output lane and a reduction lane; a block covers out_per_block outputs (grid-stride over
// groups of them along gridDim.x) and a chunk of each output's reduced elements (gridDim.y splits the reduction).
//   warp     block 32x8: a warp per output, its lanes step through the reduced elements (consecutive lanes read
//            consecutive elements when the innermost reduced dim is contiguous); merged by shuffles. Small and
//            moderate reductions (R <= kWarpMaxR).
//   block    block 32x16: the whole block per output; shuffles, then a shared-memory tree over the 16 warps.
//   columns  block bx x by: bx consecutive outputs along x (coalesced when the innermost kept dim is the contiguous
//            one and the reduced dims are strided, as in a bias gradient's sum over the batch), by lanes of the
//            reduction along y merged by a shared-memory tree. Also taken for tiny reductions (R <= kSmallR), where
//            a warp per output would leave most lanes idle.
// A split launch (gridDim.y = S > 1: too few output blocks to fill the device, or too many elements per thread)
// writes one State per (output, split) into scratch laid out [n_out][S]; a second launch of the same kernel
// reduces those states (contiguous, never split again), finalises and stores.
// The shapes' constants and plan_reduction live in reduce_plan.h, where the dry run's replay reads them too.

struct ReduceParams {
  ReduceOp op;
  bool r_in_x;  // the reduction lanes include threadIdx.x (warp and block shapes): merged by warp shuffles
  bool r_in_y;  // the reduction lanes include threadIdx.y (block and columns shapes): merged in shared memory
  int out_per_block;
  int64_t n_out;
  int64_t r_count;              // reduced elements (or partial states) per output in this launch
  int64_t chunk;                // of them per blockIdx.y
  int64_t r_total;              // reduced elements per output of the whole reduction (mean and var denominators)
  int64_t correction;           // var
  OffsetCalculator<1> kept;     // output index -> offset of its first element (partial states: its row)
  OffsetCalculator<1> reduced;  // reduction index -> offset from there
};

// ---- element and state math -------------------------------------------------------------------------------------

template <class A>
__device__ __forceinline__ bool is_nan(A v) {
  if constexpr (std::is_floating_point_v<A>)
    return v != v;
  else
    return false;
}

template <class A>
__device__ __forceinline__ A lowest_value() {
  if constexpr (std::is_floating_point_v<A>)
    return -std::numeric_limits<A>::infinity();
  else
    return std::numeric_limits<A>::lowest();
}

template <class A>
__device__ __forceinline__ A highest_value() {
  if constexpr (std::is_floating_point_v<A>)
    return std::numeric_limits<A>::infinity();
  else
    return std::numeric_limits<A>::max();
}

template <class A>
__device__ __forceinline__ State<A> identity_state(ReduceOp op) {
  State<A> s{A(0), A(0), 0};
  if (op == ReduceOp::Max || op == ReduceOp::ArgMax) s.a = lowest_value<A>();
  if (op == ReduceOp::Min || op == ReduceOp::ArgMin) s.a = highest_value<A>();
  if (op == ReduceOp::ArgMax || op == ReduceOp::ArgMin) s.k = kNoIndex;
  return s;
}

// Merges two states of one output (Note [Reduction state]).
template <class A>
__device__ __forceinline__ State<A> combine(ReduceOp op, const State<A>& x, const State<A>& y) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean:
      return State<A>{x.a + y.a, A(0), 0};
    case ReduceOp::Max:
    case ReduceOp::Min: {
      if (is_nan(x.a)) return x;
      if (is_nan(y.a)) return y;
      return (op == ReduceOp::Max ? y.a > x.a : y.a < x.a) ? y : x;
    }
    case ReduceOp::ArgMax:
    case ReduceOp::ArgMin: {
      const bool xn = is_nan(x.a), yn = is_nan(y.a);
      bool take_y;
      if (xn || yn)
        take_y = xn && yn ? y.k < x.k : yn;
      else
        take_y = (op == ReduceOp::ArgMax ? y.a > x.a : y.a < x.a) || (y.a == x.a && y.k < x.k);
      return take_y ? y : x;
    }
    case ReduceOp::Var: {
      if constexpr (std::is_floating_point_v<A>) {
        if (y.k == 0) return x;
        if (x.k == 0) return y;
        const int64_t n = x.k + y.k;
        const A y_share = static_cast<A>(y.k) / static_cast<A>(n);
        const A delta = y.a - x.a;
        return State<A>{x.a + delta * y_share, x.b + y.b + delta * delta * static_cast<A>(x.k) * y_share, n};
      }
      break;
    }
  }
  return x;
}

template <class T, class A>
__device__ __forceinline__ A load_element(const T* in, int64_t off) {
  return static_cast<A>(static_cast<op_math_t<T>>(in[off]));
}

// One thread's share of output `base`'s reduced elements r = r, r + step, ... < r_end, in increasing r (so strict
// comparisons keep the first index and the first NaN, as the CPU loop does).
template <class T, class A>
__device__ State<A> thread_elements(ReduceOp op, const T* in, int64_t base, const OffsetCalculator<1>& red, int64_t r,
                                    int64_t r_end, int64_t step) {
  State<A> s = identity_state<A>(op);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean: {
      A acc = A(0);
      for (; r < r_end; r += step) acc += load_element<T, A>(in, base + red.get(r).v[0]);
      s.a = acc;
      break;
    }
    case ReduceOp::Max:
    case ReduceOp::Min: {
      const bool is_max = op == ReduceOp::Max;
      A best = s.a;
      for (; r < r_end; r += step) {
        const A v = load_element<T, A>(in, base + red.get(r).v[0]);
        if (is_nan(v) || (is_max ? v > best : v < best)) best = v;
        if (is_nan(best)) break;  // NaN is final
      }
      s.a = best;
      break;
    }
    case ReduceOp::ArgMax:
    case ReduceOp::ArgMin: {
      const bool is_max = op == ReduceOp::ArgMax;
      for (; r < r_end; r += step) {
        const A v = load_element<T, A>(in, base + red.get(r).v[0]);
        if (s.k == kNoIndex || is_nan(v) || (is_max ? v > s.a : v < s.a)) {
          s.a = v;
          s.k = r;
        }
        if (is_nan(s.a)) break;  // the first NaN is final
      }
      break;
    }
    case ReduceOp::Var: {
      if constexpr (std::is_floating_point_v<A>) {
        A mean = A(0), m2 = A(0);
        int64_t n = 0;
        for (; r < r_end; r += step) {
          const A v = load_element<T, A>(in, base + red.get(r).v[0]);
          ++n;
          const A delta = v - mean;
          mean += delta / static_cast<A>(n);
          m2 += delta * (v - mean);
        }
        s = State<A>{mean, m2, n};
      }
      break;
    }
  }
  return s;
}

// The same over partial states of a split launch.
template <class A>
__device__ State<A> thread_partials(ReduceOp op, const State<A>* partials, int64_t base, const OffsetCalculator<1>& red,
                                    int64_t r, int64_t r_end, int64_t step) {
  State<A> s = identity_state<A>(op);
  for (; r < r_end; r += step) s = combine(op, s, partials[base + red.get(r).v[0]]);
  return s;
}

template <class A>
__device__ __forceinline__ A shfl_down(A v, int delta) {
  if constexpr (std::is_same_v<A, int64_t>)
    return static_cast<int64_t>(__shfl_down_sync(0xffffffffu, static_cast<long long>(v), delta));
  else
    return __shfl_down_sync(0xffffffffu, v, delta);
}

// Lane 0 ends with the merge of all 32 lanes' states. Called by every lane of the warp (full mask).
template <class A>
__device__ __forceinline__ State<A> warp_combine(ReduceOp op, State<A> s) {
  for (int delta = 16; delta > 0; delta >>= 1) {
    State<A> other;
    other.a = shfl_down(s.a, delta);
    other.b = shfl_down(s.b, delta);
    other.k = shfl_down(s.k, delta);
    s = combine(op, s, other);
  }
  return s;
}

// Writes the finished result of output o: T, or int64 for integer sums and arg reductions (the entry point checked
// that out has that dtype).
template <class T, class A>
__device__ __forceinline__ void store_result(const ReduceParams& p, const State<A>& s, void* out, int64_t o) {
  switch (p.op) {
    case ReduceOp::Sum:
      if constexpr (std::is_floating_point_v<A>)
        static_cast<T*>(out)[o] = convert<T>(s.a);
      else
        static_cast<int64_t*>(out)[o] = s.a;
      break;
    case ReduceOp::Mean:
      if constexpr (std::is_floating_point_v<A>)
        static_cast<T*>(out)[o] = convert<T>(static_cast<double>(s.a) / static_cast<double>(p.r_total));
      break;
    case ReduceOp::Var:
      if constexpr (std::is_floating_point_v<A>) {
        const double d = static_cast<double>(p.r_total - p.correction);
        static_cast<T*>(out)[o] = convert<T>(static_cast<double>(s.b) / (d > 0.0 ? d : 0.0));
      }
      break;
    case ReduceOp::Max:
    case ReduceOp::Min:
      static_cast<T*>(out)[o] = convert<T>(s.a);
      break;
    case ReduceOp::ArgMax:
    case ReduceOp::ArgMin:
      static_cast<int64_t*>(out)[o] = s.k;
      break;
  }
}

// ---- kernel -----------------------------------------------------------------------------------------------------

// Reduces elements of `in` (partial_in == nullptr) or partial states, per Note [Reduction shapes]; stores results
// into `out` (partial_out == nullptr) or one state per (output, blockIdx.y) into partial_out. Every thread runs every
// group iteration (the loop bound is uniform per block), so the shuffles see 32 active lanes and __syncthreads is
// reached by the whole block; threads past n_out carry identity states.
template <class T>
__global__ void __launch_bounds__(kMaxThreads)
    reduce_kernel(ReduceParams p, const T* in, const State<acc_t<T>>* partial_in, void* out,
                  State<acc_t<T>>* partial_out) {
  using A = acc_t<T>;
  __shared__ State<A> smem[kMaxThreads];
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int bx = static_cast<int>(blockDim.x), by = static_cast<int>(blockDim.y);
  int o_lane, r_lane, r_lanes;
  if (p.r_in_x && p.r_in_y) {  // block
    o_lane = 0;
    r_lane = ty * bx + tx;
    r_lanes = bx * by;
  } else if (p.r_in_x) {  // warp
    o_lane = ty;
    r_lane = tx;
    r_lanes = bx;
  } else {  // columns (by == 1 when !r_in_y)
    o_lane = tx;
    r_lane = ty;
    r_lanes = by;
  }
  const int64_t r_begin = static_cast<int64_t>(blockIdx.y) * p.chunk;
  const int64_t r_end = r_begin + p.chunk < p.r_count ? r_begin + p.chunk : p.r_count;
  for (int64_t group = blockIdx.x; group * p.out_per_block < p.n_out; group += gridDim.x) {
    const int64_t o = group * p.out_per_block + o_lane;
    State<A> s = identity_state<A>(p.op);
    if (o < p.n_out) {
      const int64_t base = p.kept.get(o).v[0];
      s = partial_in != nullptr
              ? thread_partials<A>(p.op, partial_in, base, p.reduced, r_begin + r_lane, r_end, r_lanes)
              : thread_elements<T, A>(p.op, in, base, p.reduced, r_begin + r_lane, r_end, r_lanes);
    }
    if (p.r_in_x) s = warp_combine(p.op, s);
    if (p.r_in_y) {
      smem[ty * bx + tx] = s;
      __syncthreads();
      for (int h = by / 2; h > 0; h >>= 1) {  // by is a power of two; row ty merges row ty + h
        if (ty < h) smem[ty * bx + tx] = combine(p.op, smem[ty * bx + tx], smem[(ty + h) * bx + tx]);
        __syncthreads();
      }
      s = smem[tx];
      __syncthreads();  // everyone has read row 0 before the next group writes it
    }
    const bool holder = (!p.r_in_x || tx == 0) && (!p.r_in_y || ty == 0);
    if (holder && o < p.n_out) {
      if (partial_out != nullptr)
        partial_out[o * static_cast<int64_t>(gridDim.y) + blockIdx.y] = s;
      else
        store_result<T, A>(p, s, out, o);
    }
  }
}

// ---- launcher ---------------------------------------------------------------------------------------------------

memory::StreamId stream_id(cudaStream_t s) { return static_cast<memory::StreamId>(reinterpret_cast<uintptr_t>(s)); }

// Note [Whole-tensor sums through CUB]
// The sum or mean of every element of a contiguous floating tensor (a loss, the squares of a gradient norm) is one
// output of R elements, where the library's device-wide reduction fits: cub::DeviceReduce::Reduce reads T (vectorised
// for f32/f64; ember's f16/bf16 types are not CUB primitives and load one at a time) and adds in acc_t<T> (Note
// [Reduction accumulator]: double for f32) into one accumulator in scratch, which a one-thread kernel stores as the
// other paths do (store_result: the mean's division, the rounding to T). CUB's temporary storage is sized by its query call and taken, with the accumulator, from the caching
// allocator on the reduction's stream. CUB's sums are run-to-run deterministic on one device (its tiling follows the
// architecture); smaller reductions stay on the warp and block kernels, which need one launch.
// CUB before 2.1.0 takes num_items as int: with it, larger reductions stay on the kernels below.
#if CUB_VERSION >= 200100
constexpr int64_t kCubMaxR = std::numeric_limits<int64_t>::max();
#else
constexpr int64_t kCubMaxR = std::numeric_limits<int>::max();
#endif

// Adds in A whatever CUB pairs up (accumulators and loaded elements), so its accumulator type is A.
template <class A>
struct AccSum {
  template <class U, class V>
  __host__ __device__ __forceinline__ A operator()(const U& a, const V& b) const {
    return static_cast<A>(a) + static_cast<A>(b);
  }
};

template <class T, class A>
__global__ void store_sum_kernel(ReduceParams p, const A* acc, void* out) {
  store_result<T, A>(p, State<A>{*acc, A(0), 0}, out, 0);
}

template <class T>
void cub_sum(const ReduceParams& p, const T* src, int64_t R, void* out, Device device, cudaStream_t stream) {
  using A = acc_t<T>;
  size_t temp_bytes = 0;
  EMBER_CUDA_CHECK(
      cub::DeviceReduce::Reduce(nullptr, temp_bytes, src, static_cast<A*>(nullptr), R, AccSum<A>{}, A(0), stream));
  Tensor scratch;
  {
    memory::PhaseScope workspace(memory::Phase::Workspace);
    scratch = empty_on_stream({kCubScratchAlign + static_cast<int64_t>(temp_bytes)}, TensorOptions(DType::u8, device),
                              stream_id(stream));
  }
  auto* base = static_cast<unsigned char*>(scratch.raw_data());
  A* acc = reinterpret_cast<A*>(base);
  EMBER_CUDA_CHECK(
      cub::DeviceReduce::Reduce(base + kCubScratchAlign, temp_bytes, src, acc, R, AccSum<A>{}, A(0), stream));
  store_sum_kernel<T, A><<<1, 1, 0, stream>>>(p, acc, out);
  EMBER_CUDA_LAUNCH_CHECK();
}

// Note [Packed sums]
// A sum or mean of a contiguous floating tensor over its leading dims (a bias gradient: [rows, cols] summed down the
// columns) or its trailing dims (row sums) reads 16-byte packs (reduce_pack_kernels.cuh), where reduce_kernel reads
// one element per thread and access and computes its offset through the dims' calculator. Dims of size 1 count as
// either kind. Taken when:
//   columns  cols (the kept elements) a whole number of packs, the input 16-byte aligned, and blocks of 32 packs x
//            row groups enough for two on every SM (16 warps, each thread with 4 loads in flight). The rows split into
//            `groups` of ceil(rows / groups) rows: R / kPackGroupRows groups, at most kPackMaxGroups, or past that as
//            many as two blocks a SM need (then the last groups may be empty: they store zeros). Each group's column
//            sums go to scratch [groups, cols] in acc_t, added in group order by a second kernel (one group: stored
//            directly).
//   rows     the row length n a whole number of packs, at least one per lane, the input aligned, and rows enough
//            for kPackMinRowWarps warps per SM: a warp per row.
// The additions keep acc_t (Note [Reduction accumulator]) in an order fixed by the sizes and the SM count (which picks
// the kernel and, past kPackMaxGroups, the groups); the result may differ from reduce_kernel's, or between GPUs of
// other SM counts, in the last bits (another summation order), never in accuracy class.

static_assert(kPackColumnsPerBlock == reduce_pack::kPackColumns, "reduce_plan.h's column blocks are the kernel's");

template <class T>
bool launch_packed_sum(ReduceOp op, const Tensor& in, const Tensor& out, const std::vector<int64_t>& dims, int64_t R,
                       Device device, cudaStream_t stream) {
  using A = acc_t<T>;
  namespace rp = reduce_pack;
  constexpr int V = ::ember::cuda::Pack<T>::kSize;
  const int64_t n_out = out.numel();
  if ((op != ReduceOp::Sum && op != ReduceOp::Mean) || n_out < 2 || R < 2 || !in.is_contiguous() ||
      !::ember::cuda::pack_aligned(in.raw_data()))
    return false;
  const bool mean = op == ReduceOp::Mean;
  const int64_t sm_count = device_properties(device.index).sm_count;
  const T* src = static_cast<const T*>(in.raw_data());
  T* dst = static_cast<T*>(out.raw_data());
  if (n_out % V == 0 && reduced_dims_are(in, dims, /*leading=*/true)) {
    const int64_t cols = n_out, col_blocks = packed_column_blocks(cols, V);
    const int64_t groups = packed_column_groups(cols, R, V, sm_count);
    if (groups == 0) return false;
    const int64_t rows_per_group = (R + groups - 1) / groups;
    const dim3 grid(static_cast<unsigned int>(col_blocks), static_cast<unsigned int>(groups));
    const unsigned int threads = rp::kPackColumns * rp::kRowThreads;
    if (groups == 1) {
      rp::column_sum_pack_kernel<T, A><<<grid, threads, 0, stream>>>(src, R, cols, rows_per_group, dst, true, mean);
      EMBER_CUDA_LAUNCH_CHECK();
      return true;
    }
    Tensor scratch;  // stream-ordered on `stream`, as the split path's
    {
      memory::PhaseScope workspace(memory::Phase::Workspace);
      scratch = empty_on_stream({groups * cols * static_cast<int64_t>(sizeof(A))}, TensorOptions(DType::u8, device),
                                stream_id(stream));
    }
    A* partial = static_cast<A*>(scratch.raw_data());
    rp::column_sum_pack_kernel<T, A><<<grid, threads, 0, stream>>>(src, R, cols, rows_per_group, partial, false, mean);
    EMBER_CUDA_LAUNCH_CHECK();
    rp::sum_groups_kernel<A, T><<<::ember::cuda::grid_for(cols, device.index), ::ember::cuda::kElementwiseThreads, 0,
                                  stream>>>(partial, groups, cols, R, mean, dst);
    EMBER_CUDA_LAUNCH_CHECK();
    return true;
  }
  if (packed_row_sum_takes(n_out, R, V, sm_count) && reduced_dims_are(in, dims, /*leading=*/false)) {
    const int64_t blocks = std::min((n_out + rp::kRowBlockWarps - 1) / rp::kRowBlockWarps, sm_count * 8);
    rp::row_sum_pack_kernel<T, A>
        <<<static_cast<unsigned int>(blocks), rp::kRowBlockWarps * 32, 0, stream>>>(src, n_out, R, mean, dst);
    EMBER_CUDA_LAUNCH_CHECK();
    return true;
  }
  return false;
}

template <class T>
void launch_one(const ReduceParams& p, const Plan& pl, const T* in, const State<acc_t<T>>* partial_in, void* out,
                State<acc_t<T>>* partial_out, cudaStream_t stream) {
  const dim3 block(static_cast<unsigned int>(pl.bx), static_cast<unsigned int>(pl.by));
  const dim3 grid(pl.grid_x, static_cast<unsigned int>(pl.splits));
  reduce_kernel<T><<<grid, block, 0, stream>>>(p, in, partial_in, out, partial_out);
  EMBER_CUDA_LAUNCH_CHECK();
}

template <class T>
void launch_reduce(ReduceOp op, const Tensor& in, const Tensor& out, const std::vector<int64_t>& dims,
                   int64_t correction, const char* name, cudaStream_t stream) {
  using A = acc_t<T>;
  const Device device = out.device();
  // Kept dims index the (contiguous, row-major) output; reduced dims index the reduction in row-major order, which
  // is the order of the CPU kernel's argmax/argmin indices.
  Shape kept_sizes = in.sizes(), red_sizes(in.sizes().size(), 1);
  int64_t R = 1;
  for (int64_t d : dims) {
    kept_sizes[static_cast<size_t>(d)] = 1;
    red_sizes[static_cast<size_t>(d)] = in.size(d);
    R *= in.size(d);
  }
  ReduceParams p;
  p.op = op;
  p.n_out = out.numel();
  p.r_count = R;
  p.r_total = R;
  p.correction = correction;
  p.kept = make_offset_calculator<1>(kept_sizes, std::array<const Shape*, 1>{&in.strides()}, name);
  p.reduced = make_offset_calculator<1>(red_sizes, std::array<const Shape*, 1>{&in.strides()}, name);
  if constexpr (std::is_floating_point_v<op_math_t<T>>) {
    if ((op == ReduceOp::Sum || op == ReduceOp::Mean) && p.n_out == 1 && R >= kCubMinR && R <= kCubMaxR &&
        in.is_contiguous()) {
      cub_sum<T>(p, static_cast<const T*>(in.raw_data()), R, out.raw_data(), device, stream);  // Note above
      return;
    }
    if (launch_packed_sum<T>(op, in, out, dims, R, device, stream)) return;  // Note [Packed sums]
  }
  const int sm_count = device_properties(device.index).sm_count;
  const Plan pl = plan_reduction(p.n_out, R, p.kept, p.reduced, sm_count, /*allow_split=*/true);
  p.r_in_x = pl.r_in_x;
  p.r_in_y = pl.r_in_y;
  p.out_per_block = pl.out_per_block;
  p.chunk = pl.chunk;
  // An empty reduction (sum/mean only) reads nothing: the input may have no storage.
  const T* src = R == 0 ? nullptr : static_cast<const T*>(in.raw_data());
  if (pl.splits == 1) {
    launch_one<T>(p, pl, src, nullptr, out.raw_data(), nullptr, stream);
    return;
  }
  // Split: partial states [n_out][S] in scratch from the caching allocator (stream-ordered on `stream`, so freeing
  // it at scope exit is safe while the launches are queued), then one unsplit pass over them.
  const int64_t S = pl.splits;
  Tensor scratch;
  {
    memory::PhaseScope workspace(memory::Phase::Workspace);
    scratch = empty_on_stream({p.n_out * S * static_cast<int64_t>(sizeof(State<A>))}, TensorOptions(DType::u8, device),
                              stream_id(stream));
  }
  auto* partials = static_cast<State<A>*>(scratch.raw_data());
  launch_one<T>(p, pl, src, nullptr, nullptr, partials, stream);

  ReduceParams q = p;
  q.r_count = S;
  const Shape row_sizes{p.n_out}, row_strides{S}, split_sizes{S}, split_strides{1};
  q.kept = make_offset_calculator<1>(row_sizes, std::array<const Shape*, 1>{&row_strides}, name);
  q.reduced = make_offset_calculator<1>(split_sizes, std::array<const Shape*, 1>{&split_strides}, name);
  const Plan ql = plan_reduction(q.n_out, S, q.kept, q.reduced, sm_count, /*allow_split=*/false);
  q.r_in_x = ql.r_in_x;
  q.r_in_y = ql.r_in_y;
  q.out_per_block = ql.out_per_block;
  q.chunk = ql.chunk;
  launch_one<T>(q, ql, nullptr, partials, out.raw_data(), nullptr, stream);
}

// ---- entry point ------------------------------------------------------------------------------------------------

const char* reduce_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Mean:
      return "mean";
    case ReduceOp::Max:
      return "amax";
    case ReduceOp::Min:
      return "amin";
    case ReduceOp::Var:
      return "var";
    case ReduceOp::ArgMax:
      return "argmax";
    case ReduceOp::ArgMin:
      return "argmin";
  }
  return "reduce";
}

void reduce_cuda(ReduceOp op, const Tensor& in, const Tensor& out, const std::vector<int64_t>& dims,
                 int64_t correction) {
  const char* name = reduce_name(op);
  const Device device = out.device();
  EMBER_CHECK(device.is_cuda(), DeviceError, name, ": the CUDA kernel got ", out.description());
  EMBER_CHECK(in.device() == device, DeviceError, name, ": the CUDA kernel got ", in.description(), " (expected ",
              device.str(), ")");
  EMBER_CHECK(!dims.empty(), ValueError, name, ": the CUDA kernel needs at least one dim to reduce");
  for (size_t i = 0; i < dims.size(); ++i)
    EMBER_CHECK(dims[i] >= 0 && dims[i] < in.dim() && (i == 0 || dims[i] > dims[i - 1]), IndexError, name, ": dims ",
                shape_str(dims), " are not sorted, unique dims of ", in.description());
  Shape expected = in.sizes();
  int64_t R = 1;
  for (int64_t d : dims) {
    expected[static_cast<size_t>(d)] = 1;
    R *= in.size(d);
  }
  EMBER_CHECK(out.sizes() == expected && out.is_contiguous(), ShapeError, name, ": output ", out.description(),
              " should be contiguous with shape ", shape_str(expected), " for ", in.description());
  const bool floating = is_floating(in.dtype());
  EMBER_CHECK(floating || (op != ReduceOp::Mean && op != ReduceOp::Var), DTypeError, name, ": dtype ",
              dtype_name(in.dtype()), " is not supported (needs a floating tensor)");
  const bool i64_out = op == ReduceOp::ArgMax || op == ReduceOp::ArgMin || (op == ReduceOp::Sum && !floating);
  const DType out_dtype = i64_out ? DType::i64 : in.dtype();
  EMBER_CHECK(out.dtype() == out_dtype, DTypeError, name, ": output ", out.description(), " should be ",
              dtype_name(out_dtype), " for input ", in.description());
  EMBER_CHECK(R > 0 || op == ReduceOp::Sum || op == ReduceOp::Mean, ValueError, name,
              ": cannot reduce over an empty set of elements (", in.description(), ", dims ", shape_str(dims), ")");
  if (out.numel() == 0) return;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = ::ember::cuda::current_stream(device.index).get();
  EMBER_DISPATCH_ALL(in.dtype(), name, [&] { launch_reduce<scalar_t>(op, in, out, dims, correction, name, stream); });
}

}  // namespace

EMBER_REGISTER_KERNEL(reduce, DeviceType::CUDA, reduce_cuda);

}  // namespace ember::kernels::cuda
