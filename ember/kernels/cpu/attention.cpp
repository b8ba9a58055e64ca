// CPU fused multi-head attention over the packed projection qkv [B, T, 3 C] (f32/f64; f16/bf16 through f32 copies),
// forward and backward, and their workspace replayed on meta.
// Note [Fused attention]
// The composed path (scaled_dot_product_attention over q, k, v slices of qkv) copies the strided heads before each
// batched product, materialises the scaled scores, the mask and the masked scores, copies the output heads back side
// by side, and in backward builds a zero-filled qkv-sized gradient for each of the three slices and adds them. Here
// each (batch, head) pair is one item, claimed by a CPU thread when free (parallel::for_each_claimed): the products
// read q, k, v in place from qkv (row stride 3 C), the scores are scaled, masked and normalised row by row in a
// per-thread [T, T] buffer, and the head's output is written straight into its columns of out [B, T, C].
// Backward writes dq, dk, dv straight into their columns of grad_qkv, so every element is written once and nothing
// is zero-filled. Per thread: the forward's two Gemm shapes per row block (Note [Causal attention by row blocks])
// and one [T, T] buffer, backward's five per block and two buffers.
// Results do not depend on the thread count: each item is computed whole by one thread with serial products.
//
// Note [Attention saves lse]
// The forward keeps one log-sum-exp per query row (lse [B, H, T]) instead of the [B, H, T, T] weights, and backward
// recomputes the weights as e^(s_ij - lse_i) from one more q k^T product: the bytes held between forward and backward
// are T times fewer (GPT-2 124M at T = 1024: 48 KiB instead of 48 MiB per layer and batch row), for one extra
// [T, hd] x [hd, T] product per item in backward (5 products instead of 4).
//
// Note [Causal attention by row blocks]
// Causal rows i < i1 attend to keys j < i1 only, so the query rows go in blocks [i0, i1) and each block's products
// stop at column (or inner index) i1: its scores q[i0:i1] k[0:i1]^T, its output p[i0:i1, 0:i1] v[0:i1], and in
// backward its d probs and dq likewise; dv and dk go by key blocks [j0, j1) of the same partition, over the query
// rows j0..T that see them (dv[j0:j1] = p[j0:T, j0:j1]^T dout[j0:T]). Every entry a product reads beyond a row's own
// keys lies inside the row's block and is zeroed, so the sums are the full products' minus their zero terms. With
// nb blocks a product costs (nb + 1) / (2 nb) of the full one: 3/4 at the gpt config's T = 64 (two blocks of 32),
// 9/16 at T = 1024 (eight of 128). Blocks have kMinBlockRows rows or more, but the last holds what is left (smaller
// products lose more to Eigen's per-call packing than they save), and there are at most kMaxBlocks (each block has
// its own Gemm shapes, so its own panels); T <= kMinBlockRows, or no mask, is one block: the full products.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "ember/core/parallel.h"
#include "ember/kernels/cpu/gemm.h"
#include "ember/kernels/cpu/meta_workspace.h"
#include "ember/kernels/cpu/softmax_row.h"
#include "ember/kernels/stubs.h"

namespace ember::kernels::cpu {
namespace {

// Sizes of one call; element strides of the heads inside qkv (row: 3 C) and out / grad_out (row: C).
struct AttentionGeometry {
  int64_t B, T, C, H, hd;
  int64_t items() const { return B * H; }
  // Offset of item (b, h)'s q in qkv (k is + C, v + 2 C) and of its columns in out.
  int64_t qkv_offset(int64_t item) const { return (item / H) * T * 3 * C + (item % H) * hd; }
  int64_t out_offset(int64_t item) const { return (item / H) * T * C + (item % H) * hd; }
};

AttentionGeometry geometry(const Tensor& qkv, int64_t n_head) {
  const int64_t C = qkv.size(2) / 3;
  return {qkv.size(0), qkv.size(1), C, n_head, C / n_head};
}

// The valid (unmasked) length of score row i.
inline int64_t row_length(const AttentionGeometry& g, int64_t i, bool causal) { return causal ? i + 1 : g.T; }

// The query-row blocks of Note [Causal attention by row blocks]: block b is rows [begin(b), end(b)).
constexpr int64_t kMinBlockRows = 32;
constexpr int64_t kMaxBlocks = 8;
struct RowBlocks {
  int64_t T, rows, count;
  int64_t begin(int64_t b) const { return b * rows; }
  int64_t end(int64_t b) const { return std::min(T, (b + 1) * rows); }
};

RowBlocks row_blocks(const AttentionGeometry& g, bool causal) {
  if (!causal || g.T <= kMinBlockRows) return {g.T, g.T, 1};
  int64_t rows = std::max(kMinBlockRows, (g.T + kMaxBlocks - 1) / kMaxBlocks);
  rows = (rows + 7) / 8 * 8;
  return {g.T, rows, (g.T + rows - 1) / rows};
}

// One Gemm's sizes and operand strides (gemm.h).
struct GemmShape {
  int64_t M, K, N, a_rs, a_cs, b_rs, b_cs;
};

// The forward's Gemm shapes, two per block, in the order a thread's workspace is taken: block [i0, i1)'s scores =
// q[i0:i1] k[0:i1]^T [m, hd] x [hd, i1], then its out = p[i0:i1, 0:i1] v[0:i1] [m, i1] x [i1, hd].
constexpr size_t kForwardGemms = 2;
std::vector<GemmShape> forward_shapes(const AttentionGeometry& g, const RowBlocks& rb) {
  const int64_t r = 3 * g.C;
  std::vector<GemmShape> out;
  for (int64_t b = 0; b < rb.count; ++b) {
    const int64_t m = rb.end(b) - rb.begin(b), n = rb.end(b);
    out.push_back({m, g.hd, n, r, 1, 1, r});
    out.push_back({m, n, g.hd, g.T, 1, r, 1});
  }
  return out;
}

// Backward's, five per block: block [i0, i1)'s scores (recomputed, as the forward's) and d probs = dout[i0:i1]
// v[0:i1]^T [m, hd] x [hd, i1]; key block [j0, j1)'s dv = p[j0:T, j0:j1]^T dout[j0:T] [m, T - j0] x [T - j0, hd];
// dq = d scores[i0:i1, 0:i1] k[0:i1] [m, i1] x [i1, hd]; dk = d scores[j0:T, j0:j1]^T q[j0:T], as dv.
constexpr size_t kBackwardGemms = 5;
std::vector<GemmShape> backward_shapes(const AttentionGeometry& g, const RowBlocks& rb) {
  const int64_t r = 3 * g.C;
  std::vector<GemmShape> out;
  for (int64_t b = 0; b < rb.count; ++b) {
    const int64_t lo = rb.begin(b), m = rb.end(b) - lo, n = rb.end(b);
    out.push_back({m, g.hd, n, r, 1, 1, r});
    out.push_back({m, g.hd, n, g.C, 1, 1, r});
    out.push_back({m, g.T - lo, g.hd, 1, g.T, g.C, 1});
    out.push_back({m, n, g.hd, g.T, 1, r, 1});
    out.push_back({m, g.T - lo, g.hd, 1, g.T, r, 1});
  }
  return out;
}

template <class T>
std::vector<Gemm<T>> make_gemms(const std::vector<GemmShape>& shapes) {
  std::vector<Gemm<T>> out;
  out.reserve(shapes.size());
  for (const auto& s : shapes) out.emplace_back(s.M, s.K, s.N, s.a_rs, s.a_cs, s.b_rs, s.b_cs, /*split=*/false);
  return out;
}

// x[j] = e^x[j] for j < n: exp_vec for f32 (Note [Vectorisable float math] in vec_math.h), std::exp for f64.
template <class T>
void exp_row(T* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    if constexpr (std::is_same_v<T, float>)
      x[j] = exp_vec(x[j]);
    else
      x[j] = std::exp(x[j]);
  }
}

// A thread's forward state: the Gemms and the [T, T] weights buffer.
template <class T>
struct ForwardWorker {
  Tensor probs;
  std::vector<Gemm<T>> gemm;
};

template <class T>
void attention_typed(const Tensor& qkv, int64_t n_head, bool causal, const Tensor& out, const Tensor& lse) {
  const AttentionGeometry g = geometry(qkv, n_head);
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(g.hd)));
  const T* pq = static_cast<const T*>(qkv.raw_data());
  T* po = static_cast<T*>(out.raw_data());
  T* pl = static_cast<T*>(lse.raw_data());
  const RowBlocks rb = row_blocks(g, causal);
  const int64_t slots = parallel::chunk_count(g.items(), 1);
  std::vector<ForwardWorker<T>> workers;
  workers.reserve(static_cast<size_t>(slots));
  for (int64_t s = 0; s < slots; ++s) {
    Tensor probs = empty({g.T * g.T}, TensorOptions(dtype_of_v<T>, Device::cpu()));
    workers.push_back({std::move(probs), make_gemms<T>(forward_shapes(g, rb))});
  }
  parallel::for_each_claimed(g.items(), slots, [&](int64_t slot, int64_t item) {
    ForwardWorker<T>& w = workers[static_cast<size_t>(slot)];
    const T* q = pq + g.qkv_offset(item);
    T* p = static_cast<T*>(w.probs.raw_data());
    for (int64_t b = 0; b < rb.count; ++b) {  // Note [Causal attention by row blocks]
      const int64_t i0 = rb.begin(b), i1 = rb.end(b);
      Gemm<T>* gemm = &w.gemm[static_cast<size_t>(b) * kForwardGemms];
      gemm[0].run(q + i0 * 3 * g.C, q + g.C, p + i0 * g.T, g.T);  // scores
      for (int64_t i = i0; i < i1; ++i) {
        T* row = p + i * g.T;
        const int64_t n = row_length(g, i, causal);
        for (int64_t j = 0; j < n; ++j) row[j] *= scale;
        pl[item * g.T + i] = static_cast<T>(softmax_row<T>(row, 1, row, 1, n, /*log=*/false));
        for (int64_t j = n; j < i1; ++j) row[j] = T(0);
      }
      gemm[1].run(p + i0 * g.T, q + 2 * g.C, po + g.out_offset(item) + i0 * g.C, g.C);
    }
  });
}

template <class T>
void attention_backward_typed(const Tensor& grad_out, const Tensor& qkv, const Tensor& lse, int64_t n_head,
                              bool causal, const Tensor& grad_qkv) {
  const AttentionGeometry g = geometry(qkv, n_head);
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(g.hd)));
  const T* pq = static_cast<const T*>(qkv.raw_data());
  const T* pl = static_cast<const T*>(lse.raw_data());
  const T* pgo = static_cast<const T*>(grad_out.raw_data());
  T* pg = static_cast<T*>(grad_qkv.raw_data());
  const RowBlocks rb = row_blocks(g, causal);
  const int64_t slots = parallel::chunk_count(g.items(), 1);
  struct Worker {
    Tensor probs, dprobs;
    std::vector<Gemm<T>> gemm;
  };
  std::vector<Worker> workers;
  workers.reserve(static_cast<size_t>(slots));
  for (int64_t s = 0; s < slots; ++s) {
    Tensor probs = empty({g.T * g.T}, TensorOptions(dtype_of_v<T>, Device::cpu()));
    Tensor dprobs = empty({g.T * g.T}, TensorOptions(dtype_of_v<T>, Device::cpu()));
    workers.push_back({std::move(probs), std::move(dprobs), make_gemms<T>(backward_shapes(g, rb))});
  }
  const int64_t r = 3 * g.C;
  parallel::for_each_claimed(g.items(), slots, [&](int64_t slot, int64_t item) {
    Worker& w = workers[static_cast<size_t>(slot)];
    T* p = static_cast<T*>(w.probs.raw_data());
    T* ds = static_cast<T*>(w.dprobs.raw_data());
    const T* q = pq + g.qkv_offset(item);
    const T* go = pgo + g.out_offset(item);
    T* gq = pg + g.qkv_offset(item);
    auto gemms = [&](int64_t b) { return &w.gemm[static_cast<size_t>(b) * kBackwardGemms]; };
    for (int64_t b = 0; b < rb.count; ++b) {  // Note [Causal attention by row blocks]: query blocks
      const int64_t i0 = rb.begin(b), i1 = rb.end(b);
      Gemm<T>* gemm = gemms(b);
      // The weights again (Note [Attention saves lse]): e^(s_ij - lse_i) on the unmasked entries, 0 on the rest.
      gemm[0].run(q + i0 * r, q + g.C, p + i0 * g.T, g.T);
      for (int64_t i = i0; i < i1; ++i) {
        T* row = p + i * g.T;
        const int64_t n = row_length(g, i, causal);
        const T l = pl[item * g.T + i];
        for (int64_t j = 0; j < n; ++j) row[j] = row[j] * scale - l;
        exp_row(row, n);
        for (int64_t j = n; j < i1; ++j) row[j] = T(0);
      }
      gemm[1].run(go + i0 * g.C, q + 2 * g.C, ds + i0 * g.T, g.T);  // d probs
      // Softmax backward, masked entries (p = 0) included, and the scale: d scores = p (d probs - <d probs, p>) s.
      for (int64_t i = i0; i < i1; ++i) {
        T* d = ds + i * g.T;
        const T* pr = p + i * g.T;
        const int64_t n = row_length(g, i, causal);
        double dot = 0.0;
        for (int64_t j = 0; j < n; ++j) dot += static_cast<double>(d[j]) * static_cast<double>(pr[j]);
        const T dt = static_cast<T>(dot);
        for (int64_t j = 0; j < n; ++j) d[j] = pr[j] * (d[j] - dt) * scale;
        for (int64_t j = n; j < i1; ++j) d[j] = T(0);
      }
      gemm[3].run(ds + i0 * g.T, q + g.C, gq + i0 * r, r);  // dq
    }
    for (int64_t b = 0; b < rb.count; ++b) {  // key blocks: over the query rows j0..T, all computed above
      const int64_t j0 = rb.begin(b);
      Gemm<T>* gemm = gemms(b);
      gemm[2].run(p + j0 * g.T + j0, go + j0 * g.C, gq + 2 * g.C + j0 * r, r);  // dv
      gemm[4].run(ds + j0 * g.T + j0, q + j0 * r, gq + g.C + j0 * r, r);        // dk
    }
  });
}

// Note [16-bit attention on the CPU]
// f16/bf16 qkv (autocast's products) run the f32 kernel on an f32 copy of qkv (and of grad_out) into f32 results that
// are rounded once into out (grad_qkv); lse is f32 (attention_lse_dtype). So the scores, weights and every sum stay
// in f32 — as the f32 accumulation of a 16-bit GEMM would keep them — and the output is rounded once, where the tiled
// CUDA path also rounds its scores and weights to 16 bits between its products (Note [Attention precision] in
// cuda/attention.cu). The copies are workspace of the call: 2 (forward) or 3 (backward) f32 tensors the size of the
// 16-bit operands, taken before the per-thread buffers and replayed on meta in that order.

Tensor f32_copy(const Tensor& t) {
  Tensor c = empty(t.sizes(), TensorOptions(DType::f32, Device::cpu()));
  copy_stub.get(DeviceType::CPU)(t, c);
  return c;
}

void attention_kernel(const Tensor& qkv, int64_t n_head, bool causal, const Tensor& out, const Tensor& lse) {
  switch (qkv.dtype()) {
    case DType::f32:
      return attention_typed<float>(qkv, n_head, causal, out, lse);
    case DType::f64:
      return attention_typed<double>(qkv, n_head, causal, out, lse);
    case DType::f16:
    case DType::bf16: {  // Note [16-bit attention on the CPU]
      const Tensor q32 = f32_copy(qkv);
      const Tensor o32 = empty(out.sizes(), TensorOptions(DType::f32, Device::cpu()));
      attention_typed<float>(q32, n_head, causal, o32, lse);
      copy_stub.get(DeviceType::CPU)(o32, out);
      return;
    }
    default:
      throw_unsupported_dtype("attention_qkv", qkv.dtype());
  }
}

void attention_backward_kernel(const Tensor& grad_out, const Tensor& qkv, const Tensor& /*out*/, const Tensor& lse,
                               int64_t n_head, bool causal, const Tensor& grad_qkv) {
  switch (qkv.dtype()) {
    case DType::f32:
      return attention_backward_typed<float>(grad_out, qkv, lse, n_head, causal, grad_qkv);
    case DType::f64:
      return attention_backward_typed<double>(grad_out, qkv, lse, n_head, causal, grad_qkv);
    case DType::f16:
    case DType::bf16: {  // Note [16-bit attention on the CPU]
      const Tensor q32 = f32_copy(qkv), g32 = f32_copy(grad_out);
      const Tensor gq32 = empty(grad_qkv.sizes(), TensorOptions(DType::f32, Device::cpu()));
      attention_backward_typed<float>(g32, q32, lse, n_head, causal, gq32);
      copy_stub.get(DeviceType::CPU)(gq32, grad_qkv);
      return;
    }
    default:
      throw_unsupported_dtype("attention_qkv_backward", qkv.dtype());
  }
}

// ---- the same workspace on meta (Note [Meta kernels]) -----------------------------------------------------------

void check_meta_dtype(const char* op, DType dtype) {
  if (!is_floating(dtype)) throw_unsupported_dtype(op, dtype);
}

void take_gemms(MetaWorkspace& ws, DType dtype, const std::vector<GemmShape>& shapes) {
  for (const auto& s : shapes) take_gemm_workspace(ws, dtype, s.M, s.K, s.N, s.a_rs, s.a_cs, s.b_rs, s.b_cs, false);
}

void attention_meta_kernel(const Tensor& qkv, int64_t n_head, bool causal, const Tensor&, const Tensor&) {
  check_meta_dtype("attention_qkv", qkv.dtype());
  const AttentionGeometry g = geometry(qkv, n_head);
  MetaWorkspace ws;
  DType dt = qkv.dtype();
  if (is_reduced_float(dt)) {  // Note [16-bit attention on the CPU]: qkv's and out's f32 copies
    dt = DType::f32;
    ws.take(qkv.numel(), dt);
    ws.take(g.B * g.T * g.C, dt);
  }
  const int64_t slots = parallel::chunk_count(g.items(), 1);
  for (int64_t s = 0; s < slots; ++s) {
    ws.take(g.T * g.T, dt);
    take_gemms(ws, dt, forward_shapes(g, row_blocks(g, causal)));
  }
}

void attention_backward_meta_kernel(const Tensor&, const Tensor& qkv, const Tensor&, const Tensor&, int64_t n_head,
                                    bool causal, const Tensor&) {
  check_meta_dtype("attention_qkv_backward", qkv.dtype());
  const AttentionGeometry g = geometry(qkv, n_head);
  MetaWorkspace ws;
  DType dt = qkv.dtype();
  if (is_reduced_float(dt)) {  // Note [16-bit attention on the CPU]: qkv's, grad_out's and grad_qkv's f32 copies
    dt = DType::f32;
    ws.take(qkv.numel(), dt);
    ws.take(g.B * g.T * g.C, dt);
    ws.take(qkv.numel(), dt);
  }
  const int64_t slots = parallel::chunk_count(g.items(), 1);
  for (int64_t s = 0; s < slots; ++s) {
    ws.take(g.T * g.T, dt);
    ws.take(g.T * g.T, dt);
    take_gemms(ws, dt, backward_shapes(g, row_blocks(g, causal)));
  }
}

}  // namespace

EMBER_REGISTER_KERNEL(attention, DeviceType::CPU, attention_kernel);
EMBER_REGISTER_KERNEL(attention_backward, DeviceType::CPU, attention_backward_kernel);
EMBER_REGISTER_KERNEL(attention, DeviceType::Meta, attention_meta_kernel);
EMBER_REGISTER_KERNEL(attention_backward, DeviceType::Meta, attention_backward_meta_kernel);

}  // namespace ember::kernels::cpu
