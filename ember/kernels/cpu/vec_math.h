// Float e^x and the normal distribution's cdf/pdf (the exact GELU and its derivative) written without branches or
// library calls, so a unit-stride loop over them vectorises. glibc's expf and erff are scalar calls: the gpt config's
// GELU forward and backward spent a fifth of a training step in them.
// Note [Vectorisable float math]
// exp_sum(hi, lo) = e^(hi + lo) for |lo| << 1: Cody-Waite reduction hi = n ln2 + r with ln2 split in a 9-bit head
// (n ln2_hi exact for |n| <= 2^15, and hi - n ln2_hi exact) and a tail, lo added to the reduced r, e^r by its Taylor
// polynomial to r^7 (truncation <= 1.3e-8 relative for |r| <= 0.39), then scaled by 2^n as two powers of two so
// subnormal and overflowing results round once, like libm's. Within 2 ulp of e^x for every float; +inf above
// 88.73, 0 below -103.98, NaN in NaN out. Exact float arithmetic only: no FMA needed (the SSE build is the same code).
// normal_cdf_pdf(x): with z = |x|/sqrt2 and t = 1/(1 + z/2), erfc(z) = t e^(-z^2) Q(t), Q a degree-10 polynomial
// fitted in relative error on t in (0, 1] (z in [0, inf); scripts/fit-normal-cdf.py, 1.2e-8 in double, ~2e-7 once
// rounded to float and evaluated in float). cdf = erfc/2 for x < 0 and 1 - erfc/2 otherwise, so both tails keep
// their relative accuracy; e^(-x^2/2) is computed from x^2 split exactly into head + tail (x's top 12 bits squared
// exactly), since rounding x^2 first would cost |x^2/2| ulps. The pdf reuses that exponential. Both agree with the
// float64 formulas within ~5e-7 relative (tests/kernels/test_cpu_vec_math.cpp).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace ember::kernels::cpu {

// a * b + c, fused where the build targets FMA (the polynomials' steps; results differ from the SSE build's by
// rounding only).
inline float mul_add(float a, float b, float c) {
#if defined(__FMA__)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// e^(hi + lo); lo is a small correction (|lo| <= 0.05) that the reduction adds after removing n ln2 from hi.
inline float exp_sum(float hi, float lo) {
  const float upper = 89.0f, lower = -105.0f;  // e^89 overflows, e^-105 rounds to 0
  float h = hi < upper ? hi : upper;           // a NaN takes the bound here and is restored at the end
  h = h > lower ? h : lower;
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const float n = (h * 1.44269504f + shifter) - shifter;
  const float r = (h - n * 0.693359375f) - n * -2.12194440e-4f + lo;
  float p = 1.98412698e-4f;  // 1/7!
  p = mul_add(p, r, 1.38888889e-3f);
  p = mul_add(p, r, 8.33333333e-3f);
  p = mul_add(p, r, 4.16666667e-2f);
  p = mul_add(p, r, 1.66666667e-1f);
  p = mul_add(p, r, 0.5f);
  p = mul_add(p, r, 1.0f);
  p = mul_add(p, r, 1.0f);
  const int32_t k = static_cast<int32_t>(n);  // in [-152, 129]
  const int32_t k1 = k >> 1, k2 = k - k1;
  const float s1 = std::bit_cast<float>(static_cast<int32_t>((k1 + 127) * (1 << 23)));
  const float s2 = std::bit_cast<float>(static_cast<int32_t>((k2 + 127) * (1 << 23)));
  const float y = p * s1 * s2;
  return hi != hi ? hi : y;
}

inline float exp_vec(float x) { return exp_sum(x, 0.0f); }

// The standard normal's cdf Phi(x) and density phi(x) (Note [Vectorisable float math]).
struct NormalCdfPdf {
  float cdf, pdf;
};
inline NormalCdfPdf normal_cdf_pdf(float x) {
  float a = x < 0.0f ? -x : x;
  a = a < 20.0f ? a : 20.0f;  // e^-200 is 0 already; keeps +-inf (and NaN, restored below) out of the split
  const float t = 1.0f / (1.0f + a * 0.353553391f);  // 1 / (1 + z/2), z = |x| / sqrt2
  // a^2 = head + tail exactly: head the square of a's top 12 significant bits, tail = al (a + ah).
  const float ah = std::bit_cast<float>(std::bit_cast<uint32_t>(a) & 0xFFFFF000u);
  const float al = a - ah;
  const float e = exp_sum(-0.5f * (ah * ah), -0.5f * (al * (a + ah)));  // e^(-x^2/2) = e^(-z^2)
  float q = 4.319595173e-02f;
  q = mul_add(q, t, -2.347363830e-01f);
  q = mul_add(q, t, 4.937013388e-01f);
  q = mul_add(q, t, -4.549821615e-01f);
  q = mul_add(q, t, 1.321833879e-01f);
  q = mul_add(q, t, -5.921444297e-02f);
  q = mul_add(q, t, 9.346336871e-02f);
  q = mul_add(q, t, 1.753158122e-01f);
  q = mul_add(q, t, 2.468845844e-01f);
  q = mul_add(q, t, 2.820937634e-01f);
  q = mul_add(q, t, 2.820948064e-01f);
  const float half_erfc = 0.5f * (t * e * q);
  const float cdf = x < 0.0f ? half_erfc : 1.0f - half_erfc;
  return {x != x ? x : cdf, e * 0.398942280f};
}

// gelu(x) = x Phi(x) and g * gelu'(x) = g (Phi(x) + x phi(x)).
inline float gelu_vec(float x) { return x * normal_cdf_pdf(x).cdf; }
inline float gelu_backward_vec(float g, float x) {
  const NormalCdfPdf n = normal_cdf_pdf(x);
  return g * (n.cdf + x * n.pdf);
}

}  // namespace ember::kernels::cpu
