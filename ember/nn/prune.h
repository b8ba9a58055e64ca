// Unstructured magnitude pruning (PyTorch's torch.nn.utils.prune.l1_unstructured / global_unstructured / remove)
// without the memory PyTorch adds: the weight is zeroed in place (no weight_orig) and the mask is bit-packed.
// Invariant: a pruned parameter NAME of a module has a persistent u8 buffer "NAME_mask" (ops_sparse.h's packing,
// one bit per element, 1 = kept) on the parameter's device, every element whose bit is 0 is exactly 0, and while the
// parameter requires grad a gradient hook zeroes the gradient of those elements before accumulation.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ember/core/tensor.h"
#include "ember/nn/module.h"
#include "ember/nn/prune_amount.h"

namespace ember::nn {

// Note [Pruning order]
// Pruning removes the `amount` elements of smallest |w| among the elements still kept (amount resolved against
// their number: PyTorch's PruningContainer semantics, so pruning 50% twice keeps 25%). Ties are broken by position:
// the lower flat index (row-major) is pruned first; in global_unstructured the earlier tensor of the list comes
// first. NaN counts as larger than every number (pruned last). Exact zeros that are not pruned yet are ordinary
// candidates (|0| is the smallest magnitude). The new mask is the AND of the old one and the new selection.

// Prunes the parameter `name` of `module` (its own, not a child's: "weight", not "fc1.weight"). ValueError naming
// the module type and the name when there is no such parameter or it is not floating; ValueError from the amount
// (a count above the number of elements still kept).
void l1_unstructured(Module& module, const std::string& name, PruneAmount amount);

// One magnitude threshold over all the listed parameters together (PyTorch's global_unstructured with L1Unstructured):
// the amount is resolved against the number of elements still kept in all of them. ValueError for an empty list, a
// null module, a parameter listed twice, or a missing / non-floating parameter.
void global_unstructured(const std::vector<std::pair<std::shared_ptr<Module>, std::string>>& params,
                         PruneAmount amount);

// Makes the pruning of `name` permanent: drops the "NAME_mask" buffer and the gradient hook; the zeros stay.
// ValueError when the parameter is not pruned.
void remove(Module& module, const std::string& name);

// Whether `name` is pruned: the module has the parameter and a "NAME_mask" buffer.
bool is_pruned(const Module& module, const std::string& name);
// The mask of a pruned parameter, unpacked: bool of the parameter's shape, on its device (true = kept).
Tensor prune_mask(const Module& module, const std::string& name);
// The fraction of exact zeros in t (0 for an empty tensor); NaN is not zero.
double sparsity(const Tensor& t);

// Re-zeroes the pruned elements of every pruned parameter in the tree (after an optimizer step that could move
// them: momentum or Adam moments from before the pruning, weight decay on a stale state).
void reapply_masks(Module& root);

// For every pruned parameter in the tree, zeroes the pruned elements of each tensor tensors_of(param) returns that
// has the parameter's shape and a floating dtype (other tensors, such as Adam's 0-d step, are left alone).
void mask_param_state(Module& root, const std::function<std::vector<Tensor>(const Tensor& param)>& tensors_of);

// Zeroes the pruned entries of an optimizer's state (SGD's momentum_buffer, Adam's exp_avg and exp_avg_sq): with
// them zero and the gradients masked, SGD (with momentum, weight decay) and Adam/AdamW keep pruned weights at 0.
// A template so nn/ does not include optim/ (a layer above it): any type with state(param).entries() works.
template <class Optimizer>
void mask_optimizer_state(Optimizer& optimizer, Module& root) {
  mask_param_state(root, [&optimizer](const Tensor& param) {
    std::vector<Tensor> out;
    for (const auto& entry : optimizer.state(param).entries()) out.push_back(entry.second);
    return out;
  });
}

}  // namespace ember::nn
