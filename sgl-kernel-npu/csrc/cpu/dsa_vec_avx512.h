// The 16-lane float vector of the AVX-512 DSA builds (dsa_isa_avx512.cpp, its VNNI variant, dsa_isa_avx512bf16.cpp)
// and their int8 dot product: included inside each build's own namespace, after its target pragma.
#pragma once

#include "dsa_fp8.h"

struct V {
  static constexpr int W = 16;
  using R = __m512;
  static R zero() { return _mm512_setzero_ps(); }
  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static R loadc(const float* p) { return _mm512_loadu_ps(p); }
  static R loadc(const uint16_t* p) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // 16 FP8 codes through float16 bits and vcvtph2ps (dsa_fp8.h: exact)
  static R loadc(const fp8_e5m2* p) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(raw), 8));
  }
  static R loadc(const fp8_e4m3* p) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    // the sign-extended byte << 7: magnitude in bits 7-13, the sign in 15 (and in 14, cleared)
    const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(raw), 7), _mm256_set1_epi16(-16385));
    const __m256i nan_bits = _mm256_set1_epi16(0x3F80);  // |code| 0x7F: NaN
    const __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, nan_bits), nan_bits);
    const R v = _mm512_cvtph_ps(_mm256_mask_blend_epi16(nan, h, _mm256_set1_epi16(0x7E00)));
    return _mm512_mul_ps(v, _mm512_set1_ps(256.f));
  }
  static void store(float* p, R x) { _mm512_storeu_ps(p, x); }
  static R set1(float x) { return _mm512_set1_ps(x); }
  static R fmadd(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R sub(R a, R b) { return _mm512_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R max(R a, R b) { return _mm512_max_ps(a, b); }
  static unsigned gt_mask(R a, R b) { return unsigned(_mm512_cmp_ps_mask(a, b, _CMP_GT_OQ)); }
  // e^x, ~1 ulp on [-87, 88]; 0 below (and for -inf)
  static R exp(R x) {
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_GE_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
    R n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
    R r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    R p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
    return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n));
  }
};

// int8 index scoring: 16 int32 lanes, each summing the products of PACK dims packed in its word.
// SGL_DSA_VNNI (a build whose target has avx512vnni): vpdpbusd, 4 dims of u8 x s8 per lane (the
// query is made unsigned by QOFF = 128; the scorer starts each key's sum at -128 * sum(k)); else
// vpmaddwd on int16 pairs (AVX512BW).
struct VI {
  using R = __m512i;
#ifdef SGL_DSA_VNNI
  static constexpr int PACK = 4, QOFF = 128;
  static R dot(R acc, R q, R k) { return _mm512_dpbusd_epi32(acc, q, k); }
#else
  static constexpr int PACK = 2, QOFF = 0;
  static R dot(R acc, R q, R k) { return _mm512_add_epi32(acc, _mm512_madd_epi16(q, k)); }
#endif
  static R load(const int32_t* p) { return _mm512_loadu_si512(p); }
  static R set1(int32_t x) { return _mm512_set1_epi32(x); }
  static V::R to_float(R x) { return _mm512_cvtepi32_ps(x); }
};
