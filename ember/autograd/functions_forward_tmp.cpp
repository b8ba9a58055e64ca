// Temporary: forwards to the kernel front ends until the recording formulas land.
#include "ember/autograd/functions.h"
namespace ember {
Tensor add(const Tensor& a, const Tensor& b) { return ops::add(a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return ops::sub(a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return ops::mul(a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return ops::div(a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return ops::pow(a, b); }
Tensor pow(const Tensor& a, double exponent) { return ops::pow(a, exponent); }
Tensor maximum(const Tensor& a, const Tensor& b) { return ops::maximum(a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return ops::minimum(a, b); }
Tensor add(const Tensor& a, Scalar b) { return ops::add(a, b); }
Tensor sub(const Tensor& a, Scalar b) { return ops::sub(a, b); }
Tensor mul(const Tensor& a, Scalar b) { return ops::mul(a, b); }
Tensor div(const Tensor& a, Scalar b) { return ops::div(a, b); }
Tensor neg(const Tensor& x) { return ops::neg(x); }
Tensor exp(const Tensor& x) { return ops::exp(x); }
Tensor log(const Tensor& x) { return ops::log(x); }
Tensor sqrt(const Tensor& x) { return ops::sqrt(x); }
Tensor rsqrt(const Tensor& x) { return ops::rsqrt(x); }
Tensor tanh(const Tensor& x) { return ops::tanh(x); }
Tensor sigmoid(const Tensor& x) { return ops::sigmoid(x); }
Tensor relu(const Tensor& x) { return ops::relu(x); }
Tensor gelu(const Tensor& x, GeluApprox approx) { return ops::gelu(x, approx); }
Tensor silu(const Tensor& x) { return ops::silu(x); }
Tensor abs(const Tensor& x) { return ops::abs(x); }
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) { return ops::clamp(x, min, max); }
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) { return ops::where(cond, a, b); }
Tensor cast(const Tensor& x, DType dtype) { return ops::cast(x, dtype); }
Tensor operator+(const Tensor& a, const Tensor& b) { return ops::add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return ops::sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return ops::mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return ops::div(a, b); }
Tensor operator-(const Tensor& a) { return ops::neg(a); }
Tensor operator+(const Tensor& a, Scalar b) { return ops::add(a, b); }
Tensor operator-(const Tensor& a, Scalar b) { return ops::sub(a, b); }
Tensor operator*(const Tensor& a, Scalar b) { return ops::mul(a, b); }
Tensor operator/(const Tensor& a, Scalar b) { return ops::div(a, b); }
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) { return ops::sum(x, dims, keepdim); }
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) { return ops::mean(x, dims, keepdim); }
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) { return ops::amax(x, dims, keepdim); }
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) { return ops::amin(x, dims, keepdim); }
Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) { return ops::var(x, dims, correction, keepdim); }
Tensor matmul(const Tensor& a, const Tensor& b) { return ops::matmul(a, b); }
Tensor bmm(const Tensor& a, const Tensor& b) { return ops::bmm(a, b); }
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) { return ops::linear(x, weight, bias); }
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
