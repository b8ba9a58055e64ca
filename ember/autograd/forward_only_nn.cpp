// Temporary: forwards to the kernel front ends until the recording formulas land.
#include "ember/autograd/functions.h"
namespace ember {
Tensor softmax(const Tensor& x, int64_t dim) { return ops::softmax(x, dim); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return ops::log_softmax(x, dim); }
LayerNormResult layer_norm_with_stats(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                                      const Tensor& bias, double eps) { return ops::layer_norm_with_stats(x, normalized_shape, weight, bias, eps); }
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) { return ops::layer_norm(x, normalized_shape, weight, bias, eps); }
Tensor embedding(const Tensor& weight, const Tensor& indices) { return ops::embedding(weight, indices); }
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p) { return ops::conv2d(x, weight, bias, p); }
MaxPoolResult max_pool2d_with_indices(const Tensor& x, const Pool2dParams& p) { return ops::max_pool2d_with_indices(x, p); }
Tensor max_pool2d(const Tensor& x, const Pool2dParams& p) { return ops::max_pool2d(x, p); }
Tensor avg_pool2d(const Tensor& x, const Pool2dParams& p) { return ops::avg_pool2d(x, p); }
DropoutResult dropout_with_mask(const Tensor& x, double p, bool train) { return ops::dropout_with_mask(x, p, train); }
Tensor dropout(const Tensor& x, double p, bool train) { return ops::dropout(x, p, train); }
}
