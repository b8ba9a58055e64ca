// Reference models used by the examples, the `ember bench train` configurations and the tests: the MNIST CNN of
// pytorch/examples and the multilayer perceptron of the benchmark. nanoGPT's GPT is in transformer.h.
#pragma once

#include <memory>
#include <vector>

#include "ember/nn/layers.h"

namespace ember::nn {

// pytorch/examples' MNIST Net: conv 1→32 3×3, ReLU, conv 32→64 3×3, ReLU, max-pool 2, dropout .25, flatten,
// fc 9216→128, ReLU, dropout .5, fc 128→10. forward(x [N, 1, 28, 28]) → logits [N, 10] (the example's
// log_softmax + nll_loss is cross_entropy on these). dropout = false builds it without the dropout layers.
class MnistNet : public Module {
 public:
  explicit MnistNet(bool dropout = true);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<Dropout> dropout1, dropout2;  // null without dropout
  std::shared_ptr<Linear> fc1, fc2;
};

// Linear layers with ReLU between them: sizes {784, 1024, 1024, 10} gives 784-1024-1024-10.
std::shared_ptr<Sequential> make_mlp(const std::vector<int64_t>& sizes);

}  // namespace ember::nn
