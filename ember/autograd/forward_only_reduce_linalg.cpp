// Temporary: forwards to the kernel front ends until the recording formulas land.
#include "ember/autograd/functions.h"
namespace ember {
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) { return ops::sum(x, dims, keepdim); }
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) { return ops::mean(x, dims, keepdim); }
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) { return ops::amax(x, dims, keepdim); }
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) { return ops::amin(x, dims, keepdim); }
Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) { return ops::var(x, dims, correction, keepdim); }
Tensor matmul(const Tensor& a, const Tensor& b) { return ops::matmul(a, b); }
Tensor bmm(const Tensor& a, const Tensor& b) { return ops::bmm(a, b); }
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) { return ops::linear(x, weight, bias); }
}
