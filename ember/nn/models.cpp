// Reference models (models.h). Invariant: layer names and order are the PyTorch originals', so state_dict keys match.
#include "ember/nn/models.h"

namespace ember::nn {

MnistNet::MnistNet(bool dropout) : Module("MnistNet") {
  conv1 = register_module("conv1", std::make_shared<Conv2d>(1, 32, 3, 1));
  conv2 = register_module("conv2", std::make_shared<Conv2d>(32, 64, 3, 1));
  if (dropout) {
    dropout1 = register_module("dropout1", std::make_shared<Dropout>(0.25));
    dropout2 = register_module("dropout2", std::make_shared<Dropout>(0.5));
  }
  fc1 = register_module("fc1", std::make_shared<Linear>(9216, 128));
  fc2 = register_module("fc2", std::make_shared<Linear>(128, 10));
}

Tensor MnistNet::forward(const Tensor& x) {
  EMBER_MODULE_SCOPE();
  EMBER_CHECK(x.dim() == 4 && x.size(1) == 1 && x.size(2) == 28 && x.size(3) == 28, ShapeError,
              "MnistNet: expects input [N, 1, 28, 28], got ", x.description());
  Tensor h = relu(conv1->forward(x));
  h = relu(conv2->forward(h));
  h = max_pool2d(h, Pool2dParams{});
  if (dropout1) h = dropout1->forward(h);
  h = relu(fc1->forward(h.flatten(1)));
  if (dropout2) h = dropout2->forward(h);
  return fc2->forward(h);
}

std::shared_ptr<Sequential> make_mlp(const std::vector<int64_t>& sizes) {
  EMBER_CHECK(sizes.size() >= 2, ValueError, "make_mlp: needs at least an input and an output size");
  auto net = std::make_shared<Sequential>();
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    if (i > 0) net->push_back(std::make_shared<ReLU>());
    net->push_back(std::make_shared<Linear>(sizes[i], sizes[i + 1]));
  }
  return net;
}

}  // namespace ember::nn
