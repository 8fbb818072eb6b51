// The SwiGLU gate silu(g) * u on vectors of float32 lanes, shared by sglang_cpu_ops.cpp
// (silu_and_mul) and int8_linear_kernel.h (the gate_up linear's fused epilogue), so that the fused
// and the separate gate give the same bits. Include vec_exp2.h first.
//   silu_mul16 (AVX-512) / silu_mul8_bf16 (AVX2 + FMA): for results rounded to bfloat16: e^-g as
//     exp2_fast(-g log2 e), 1 / (1 + e^-g) by rcp and one Newton step; 0 below g = -126 ln 2 (the
//     sigmoid underflows, as in torch; -inf * 0 = NaN, as in torch).
//   silu_mul8_f32 (AVX2 + FMA): float32 results: exp_accurate and a true division.
#pragma once

#include <limits>

namespace sgl_vec {

#if defined(__AVX512F__) && defined(__AVX512DQ__)
inline __m512 silu_mul16(__m512 g, __m512 u) {
  const __m512 t_raw = _mm512_mul_ps(g, _mm512_set1_ps(-1.44269504088896341f));
  const __m512 t = _mm512_min_ps(t_raw, _mm512_set1_ps(126.f));
  const __m512 den = _mm512_add_ps(exp2_fast(t), _mm512_set1_ps(1.f));
  __m512 r = _mm512_rcp14_ps(den);
  r = _mm512_mul_ps(r, _mm512_fnmadd_ps(den, r, _mm512_set1_ps(2.f)));  // Newton: r (2 - den r)
  r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(t_raw, _mm512_set1_ps(126.f), _CMP_GT_OQ), _mm512_setzero_ps());
  return _mm512_mul_ps(_mm512_mul_ps(g, r), u);
}
#elif defined(__AVX2__) && defined(__FMA__)
inline __m256 silu_mul8_bf16(__m256 g, __m256 u) {
  const __m256 t_raw = _mm256_mul_ps(g, _mm256_set1_ps(-1.44269504088896341f));
  const __m256 t = _mm256_min_ps(t_raw, _mm256_set1_ps(126.f));
  const __m256 den = _mm256_add_ps(exp2_fast_below(t), _mm256_set1_ps(1.f));
  __m256 r = _mm256_rcp_ps(den);
  r = _mm256_mul_ps(r, _mm256_fnmadd_ps(den, r, _mm256_set1_ps(2.f)));  // Newton: r (2 - den r)
  r = _mm256_andnot_ps(_mm256_cmp_ps(t_raw, _mm256_set1_ps(126.f), _CMP_GT_OQ), r);
  return _mm256_mul_ps(_mm256_mul_ps(g, r), u);
}
// e^-g is inf above -g = 88, so g / inf is -0 for finite g and NaN for g = -inf, as torch's
// g * sigmoid(g)
inline __m256 silu_mul8_f32(__m256 g, __m256 u) {
  const __m256 ng = _mm256_sub_ps(_mm256_setzero_ps(), g);
  __m256 e = exp_accurate(ng);
  e = _mm256_blendv_ps(e, _mm256_set1_ps(std::numeric_limits<float>::infinity()),
                       _mm256_cmp_ps(ng, _mm256_set1_ps(88.f), _CMP_GT_OQ));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(e, _mm256_set1_ps(1.f))), u);
}
#endif

}  // namespace sgl_vec
