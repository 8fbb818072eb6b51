// DSA CPU kernels, AVX-512 + AVX512-BF16 build (16 float lanes; Cooper Lake, Sapphire Rapids and
// later, Zen 4+). The AVX-512 build's kernels plus the indexer's bf16 scoring with vdpbf16ps
// (SGL_DSA_DPBF16). Compiled for that target whatever the compiler's default (the pragma below);
// called only where the CPU reports avx512f and avx512_bf16.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "dsa_args.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")
#endif

namespace sgl_dsa {
namespace avx512bf16 {
namespace {

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

constexpr int HB_IDX = 4, KVB_IDX = 4;  // 16 accumulators of 32
constexpr int HB_PV = 4, VB_PV = 4;
constexpr int HB_IDX_DP = 4;      // dp micro-kernel: 4 heads x 4 vectors of 16 keys
constexpr int IDX_GROUP_DP = 16;  // queries per key tile
#define SGL_DSA_DPBF16 1

#include "dsa_kernels_impl.h"

}  // namespace

void indexer_topk(const IndexerArgs& a, int64_t t0, int64_t t1) { indexer_impl(a, t0, t1); }
void sparse_attention(const SparseAttnArgs& a, int64_t t0, int64_t t1) {
  if (a.dtype == DType::BF16) sparse_impl<uint16_t>(a, t0, t1);
  else sparse_impl<float>(a, t0, t1);
}
void merge_states(const MergeArgs& a, int64_t r0, int64_t r1) { merge_impl(a, r0, r1); }

}  // namespace avx512bf16
}  // namespace sgl_dsa

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
