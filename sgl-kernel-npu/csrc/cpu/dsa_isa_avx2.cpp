// DSA CPU kernels, AVX2 + FMA build (8 float lanes): AMD and Intel machines without AVX-512.
// Included by dsa_isa_avx2vnni.cpp with SGL_DSA_AVX2_VNNI defined: the same build plus AVX-VNNI
// (Alder Lake and later clients, Sierra Forest: VNNI without AVX-512), whose int8 index scoring
// uses vpdpbusd on 8 lanes.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "dsa_args.h"

#if defined(SGL_DSA_AVX2_VNNI)
#define SGL_DSA_NS avx2vnni
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avxvnni"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
#endif
#else
#define SGL_DSA_NS avx2
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#endif

namespace sgl_dsa {
namespace SGL_DSA_NS {
namespace {

#include "dsa_fp8.h"

struct V {
  static constexpr int W = 8;
  using R = __m256;
  static R zero() { return _mm256_setzero_ps(); }
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static R loadc(const float* p) { return _mm256_loadu_ps(p); }
  static R loadc(const uint16_t* p) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  // 8 FP8 codes through float16 bits and vcvtph2ps (F16C; dsa_fp8.h: exact)
  static R loadc(const fp8_e5m2* p) {
    const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtph_ps(_mm_unpacklo_epi8(_mm_setzero_si128(), raw));
  }
  static R loadc(const fp8_e4m3* p) {
    const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i h = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(raw), 7), _mm_set1_epi16(-16385));
    const __m128i nan_bits = _mm_set1_epi16(0x3F80);  // |code| 0x7F: NaN, exponent all ones
    const __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(h, nan_bits), nan_bits);
    const R v = _mm256_cvtph_ps(_mm_or_si128(h, _mm_and_si128(nan, _mm_set1_epi16(0x7C00))));
    return _mm256_mul_ps(v, _mm256_set1_ps(256.f));
  }
  static void store(float* p, R x) { _mm256_storeu_ps(p, x); }
  static R set1(float x) { return _mm256_set1_ps(x); }
  static R fmadd(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R max(R a, R b) { return _mm256_max_ps(a, b); }
  static unsigned gt_mask(R a, R b) { return unsigned(_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ))); }
  static R exp(R x) {
    const R live = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    R n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    R r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    R p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    // 2^n: n in [-126, 128] after the clamp; split as 2^(n/2) twice so 128 does not overflow the exponent
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i half = _mm256_srai_epi32(ni, 1);
    R s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
    R s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
    return _mm256_and_ps(_mm256_mul_ps(_mm256_mul_ps(p, s1), s2), live);
  }
};

// int8 index scoring: with AVX-VNNI vpdpbusd (4 dims of u8 x s8 per lane, the query offset by
// QOFF = 128), else vpmaddwd on int16 pairs
struct VI {
  using R = __m256i;
#ifdef SGL_DSA_AVX2_VNNI
  static constexpr int PACK = 4, QOFF = 128;
  static R dot(R acc, R q, R k) { return _mm256_dpbusd_avx_epi32(acc, q, k); }
#else
  static constexpr int PACK = 2, QOFF = 0;
  static R dot(R acc, R q, R k) { return _mm256_add_epi32(acc, _mm256_madd_epi16(q, k)); }
#endif
  static R load(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static R set1(int32_t x) { return _mm256_set1_epi32(x); }
  static V::R to_float(R x) { return _mm256_cvtepi32_ps(x); }
};

constexpr int HB_IDX = 2, KVB_IDX = 4;  // 8 accumulators of 16
constexpr int HB_PV = 2, VB_PV = 4;

#include "dsa_kernels_impl.h"

}  // namespace

#include "dsa_isa_entry.h"

}  // namespace SGL_DSA_NS
}  // namespace sgl_dsa

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
