// The backward engine and the public entry points: backward() accumulates into the leaves' .grad, grad() returns
// gradients without touching .grad. Execution is dependency-counted and single-threaded on the caller's thread.
#pragma once

#include <vector>

#include "ember/autograd/node.h"

namespace ember::autograd {

// Gradients of `outputs` (seeded with `grad_outputs`; an omitted one must belong to a one-element output and is 1)
// accumulated into the .grad of every leaf that requires grad. The graph is freed unless retain_graph.
void backward(const TensorList& outputs, const TensorList& grad_outputs = {}, bool retain_graph = false);

// d(outputs)/d(inputs) seeded with grad_outputs, returned in inputs' order; no .grad is touched. An input the
// outputs do not depend on raises ValueError unless allow_unused (then its gradient is undefined).
TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs = {},
                bool retain_graph = false, bool allow_unused = false);

}  // namespace ember::autograd

namespace ember {
// backward(loss) and backward(tensor, grad): the single-output spelling; also loss.backward() on Tensor.
inline void backward(const Tensor& output, const Tensor& grad_output = Tensor(), bool retain_graph = false) {
  autograd::backward({output}, {grad_output}, retain_graph);
}
}  // namespace ember
