// The "csr" packed weight of a Linear (sparse_linear.h): packing, unpacking, the product and its lazy validation.
// Invariant: the module's buffers and the CsrWeight's CsrMatrix are the same Tensor handles.
#include "ember/nn/sparse_linear.h"

#include <unordered_set>

#include "ember/core/grad_mode.h"
#include "ember/nn/prune.h"

namespace ember::nn {

namespace {

const char* const kBuffers[3] = {"weight_values", "weight_col_indices", "weight_row_ptr"};

}  // namespace

void CsrWeight::validate_if_changed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Tensor* idx[2] = {&m_.col_indices, &m_.row_ptr};
  bool same = true;
  for (int i = 0; i < 2; ++i)
    same = same && checked_storage_[i] == idx[i]->storage().get() && checked_version_[i] == idx[i]->version();
  if (same) return;
  ops::validate(m_);
  for (int i = 0; i < 2; ++i) {
    checked_storage_[i] = idx[i]->storage().get();
    checked_version_[i] = idx[i]->version();
  }
}

Tensor CsrWeight::linear(const Tensor& x, const Tensor& bias) const {
  validate_if_changed();
  return ops::csr_linear(x, m_, bias);
}

Tensor CsrWeight::dense() const { return ops::csr_to_dense(m_).to(DType::f32); }

void to_sparse(Linear& linear, std::optional<DType> index_dtype) {
  EMBER_CHECK(!linear.packed_weight, ValueError, "to_sparse: the Linear is already packed (format '",
              linear.packed_weight ? linear.packed_weight->format() : "", "')");
  EMBER_CHECK(!is_pruned(linear, "weight"), ValueError, "to_sparse: the Linear's weight is pruned with a live mask; "
              "call prune remove(linear, \"weight\") first to make the pruning permanent, then pack it");
  EMBER_CHECK(linear.weight.defined() && linear.weight.dim() == 2, ValueError,
              "to_sparse: the Linear has no 2-d weight to pack");
  CsrMatrix m = ops::dense_to_csr(linear.weight.detach(), index_dtype);
  linear.remove_parameter("weight");
  linear.weight = Tensor();
  m.values = linear.register_buffer(kBuffers[0], m.values);
  m.col_indices = linear.register_buffer(kBuffers[1], m.col_indices);
  m.row_ptr = linear.register_buffer(kBuffers[2], m.row_ptr);
  linear.packed_weight = std::make_shared<CsrWeight>(std::move(m));
}

void to_dense(Linear& linear) {
  const auto* csr = dynamic_cast<const CsrWeight*>(linear.packed_weight.get());
  EMBER_CHECK(csr != nullptr, ValueError, "to_dense: the Linear is not packed as CSR (",
              linear.packed_weight ? "format '" + linear.packed_weight->format() + "'" : std::string("dense"), ")");
  Tensor dense = ops::csr_to_dense(csr->matrix());
  for (const char* name : kBuffers) linear.remove_buffer(name);
  linear.packed_weight.reset();
  linear.weight = linear.register_parameter("weight", dense);
}

std::vector<std::string> sparsify_linears(Module& root, double min_sparsity, std::optional<DType> index_dtype) {
  EMBER_CHECK(min_sparsity >= 0.0 && min_sparsity <= 1.0, ValueError,
              "sparsify_linears: min_sparsity must be in [0, 1], got ", min_sparsity);
  // All or nothing: every layer to pack is chosen and checked before the first one is packed.
  std::vector<std::pair<std::string, Linear*>> targets;
  std::unordered_set<const Module*> seen;  // a layer shared in the tree is listed once per path: pack it once
  for (const auto& [path, module] : root.named_modules()) {
    if (!seen.insert(module.get()).second) continue;
    auto* linear = dynamic_cast<Linear*>(module.get());
    if (linear == nullptr || linear->packed_weight || !linear->weight.defined()) continue;
    if (sparsity(linear->weight) < min_sparsity) continue;
    EMBER_CHECK(!is_pruned(*linear, "weight"), ValueError, "sparsify_linears: the Linear '", path,
                "' is pruned with a live mask; call prune remove(linear, \"weight\") first (nothing was packed)");
    EMBER_CHECK(linear->weight.dim() == 2, ValueError, "sparsify_linears: the Linear '", path,
                "' has no 2-d weight to pack (nothing was packed)");
    EMBER_CHECK(index_dtype != DType::i16 || linear->weight.size(1) <= 32768, ValueError,
                "sparsify_linears: the Linear '", path, "' has ", linear->weight.size(1),
                " input features, beyond what i16 column indices hold (32768; nothing was packed)");
    targets.emplace_back(path, linear);
  }
  std::vector<std::string> packed;
  for (const auto& [path, linear] : targets) {
    to_sparse(*linear, index_dtype);
    packed.push_back(path);
  }
  return packed;
}

}  // namespace ember::nn
