// Vector exponentials shared by sglang_cpu_ops.cpp and prefill_attention_amx.cpp; this file's text
// is part of the sources' tag (kernels/cpu/isa.py), so a build older than an edit of it is not
// loaded.
//
// AVX-512 (16 lanes) and AVX2 + FMA (8 lanes): exp2_fast(t) = 2^t to about 1e-4 relative error
// (|rel err| < 8e-5), for results that are rounded to bfloat16 anyway (the prefill kernel's P, the
// SiLU gate): 2^floor(t) * q(f) with f = t - floor(t) in [0, 1) and q a degree-3 fit of 2^f.
// AVX2 only: exp_accurate(x) = e^x to < 2e-7 relative error, the 8-lane form of the scalar vexp
// in sglang_cpu_ops.cpp (float32 softmax and SiLU, where exp2_fast is not precise enough).
#pragma once

#if (defined(__AVX512F__) && defined(__AVX512DQ__)) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace sgl_vec {

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// vreduceps gives f directly, scalef 2^floor(t) (0 far below range, inf far above)
inline __m512 exp2_fast(__m512 t) {
  const __m512 f = _mm512_reduce_ps(t, 0x09);  // t - floor(t), precision exception suppressed
  __m512 q = _mm512_set1_ps(0.07802402973175049f);
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(0.22606706619262695f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(0.6958339810371399f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(0.9999251365661621f));
  return _mm512_scalef_ps(q, t);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
// 2^n for integer-valued n in [-127, 127] by building the exponent field (n = -127 gives +0)
inline __m256 pow2i(__m256 n) {
  const __m256i e = _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127));
  return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}

// t is clamped to [-127, 127] first: 2^t is +0 below -127 (as it underflows anyway) and at most
// 2^127 (finite; callers clamp further where they need to). The clamps keep a NaN a NaN (maxps /
// minps return their second operand when either is NaN). exp2_fast_below: for t known <= 127.
inline __m256 exp2_fast_below(__m256 t) {
  t = _mm256_max_ps(_mm256_set1_ps(-127.f), t);
  const __m256 n = _mm256_floor_ps(t);
  const __m256 f = _mm256_sub_ps(t, n);
  __m256 q = _mm256_set1_ps(0.07802402973175049f);
  q = _mm256_fmadd_ps(q, f, _mm256_set1_ps(0.22606706619262695f));
  q = _mm256_fmadd_ps(q, f, _mm256_set1_ps(0.6958339810371399f));
  q = _mm256_fmadd_ps(q, f, _mm256_set1_ps(0.9999251365661621f));
  return _mm256_mul_ps(q, pow2i(n));
}

inline __m256 exp2_fast(__m256 t) { return exp2_fast_below(_mm256_min_ps(_mm256_set1_ps(127.f), t)); }

// e^x = 2^n e^r, n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts), degree-6 Taylor series
// for e^r; x clamped to [-87, 88] (results finite and normal), a NaN stays NaN.
inline __m256 exp_accurate(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(88.f), _mm256_max_ps(_mm256_set1_ps(-87.f), x));
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 p = _mm256_set1_ps(1.f / 720.f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  return _mm256_mul_ps(p, pow2i(n));
}
#endif

}  // namespace sgl_vec
