// Out-of-tree consumer: uses the installed headers and library; exits non-zero if a result is wrong.
#include <ember/ember.h>

#include <cstdio>

int main() {
  ember::Tensor a = ember::arange(0, 6, 1, ember::DType::f32).view({2, 3});
  ember::Tensor s = a.t().contiguous();
  const std::vector<float> v = s.to_vector<float>();
  const float expected[] = {0, 3, 1, 4, 2, 5};
  for (int i = 0; i < 6; ++i) {
    if (v[i] != expected[i]) {
      std::printf("consumer: wrong value at %d: %f\n", i, v[i]);
      return 1;
    }
  }
  std::printf("consumer: ember %s linked, transpose ok\n", "0.1");
  return 0;
}
