// The "csr" packed weight of a Linear (packed_weight.h): the pruned weight stored as CSR (values, narrow column
// indices, row pointers) and applied with ops::csr_linear. Invariant: a packed Linear has no "weight" parameter and
// holds the buffers weight_values, weight_col_indices and weight_row_ptr; its CsrWeight holds those very handles and
// validates their structure (ops::validate) before the first product after they change (a load_state_dict).
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ember/kernels/ops_sparse.h"
#include "ember/nn/layers.h"
#include "ember/nn/packed_weight.h"

namespace ember::nn {

class CsrWeight final : public PackedWeight {
 public:
  explicit CsrWeight(CsrMatrix m) : m_(std::move(m)) {}
  std::string format() const override { return "csr"; }
  Tensor linear(const Tensor& x, const Tensor& bias) const override;
  Tensor dense() const override;  // f32 [out, in]
  int64_t nbytes() const override { return m_.nbytes(); }
  const CsrMatrix& matrix() const { return m_; }

 private:
  void validate_if_changed() const;

  CsrMatrix m_;
  // Note [Lazy CSR validation]: the (storage, version) of the index tensors last validated. load_state_dict copies
  // into them (a version bump), to() swaps their storage; either makes the next product validate again, so indices
  // from a file never reach the kernels unchecked, and steady-state inference pays nothing.
  mutable std::mutex mutex_;
  mutable const void* checked_storage_[2] = {nullptr, nullptr};
  mutable int64_t checked_version_[2] = {-1, -1};
};

// Packs linear.weight as CSR (its exact nonzeros; index_dtype as ops::dense_to_csr: i16 when in_features <= 32768).
// The "weight" parameter is removed (linear.weight becomes undefined) and the CSR tensors are registered as
// persistent buffers. ValueError when the layer is already packed, or its weight is still pruned with a live mask
// (call prune::remove(linear, "weight") first: the mask and its gradient hook belong to training).
void to_sparse(Linear& linear, std::optional<DType> index_dtype = std::nullopt);
// Unpacks a "csr" Linear: the dense weight is registered again as the "weight" parameter (requires grad; listed after
// the bias now). ValueError when the layer is not packed as CSR.
void to_dense(Linear& linear);
// Packs every unpacked Linear in the tree whose weight has sparsity >= min_sparsity (in [0, 1]: ValueError otherwise)
// and returns their dotted names ("" for the root). A pruned Linear with a live mask raises as in to_sparse; every
// layer is checked before the first is packed, so nothing is packed when it raises.
std::vector<std::string> sparsify_linears(Module& root, double min_sparsity = 0.0,
                                          std::optional<DType> index_dtype = std::nullopt);

}  // namespace ember::nn
