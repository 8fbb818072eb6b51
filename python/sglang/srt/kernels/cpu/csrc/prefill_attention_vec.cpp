// Causal prefill attention computed in float32 on AVX-512 or AVX2 + FMA vectors, for float32 or
// bfloat16 q / k / v: the prefill kernel of CPUs without AMX (where bf16 tiles are missing and
// torch's bf16 flash kernel runs slow bf16 GEMMs, so bf16 models attend in float32 anyway).
//
// A flash-attention loop, transposed as the AMX kernel's: a task is BQ query rows of one q head,
// held in the lanes of QV vectors, so the online softmax (running max, sums, rescale) is all
// vertical vector ops, with no horizontal reduction:
//   S^T[key][rows]  = sum_d K[key][d] * Q^T[d][rows]     (KG keys x QV vectors of accumulators)
//   O^T[d][rows]   += sum_key V[key][d] * P^T[key][rows]  (DG dims x QV vectors of accumulators)
// with K and V read row by row (a broadcast per key and d), Q^T pre-scaled by scale * log2(e) so
// that p = 2^(s - max). 2^x is accurate to ~1e-7 (degree-6 series on |f| <= 1/2), so for float32
// inputs the result equals SDPA's up to the order of the sums. Keys are visited in blocks of N up
// to the task's last row; blocks that cross the diagonal are masked by position.
//
// Inputs: the fresh q / k / v of one sequence ([n, heads, D] rows, any row stride; D = 64 or
// 128), optionally after a cached prefix read from head-major pool buffers [Hk, rows, D] at the
// given slots, copied (bf16: widened) once per kv head into contiguous float32 rows; the pool may
// also be FP8 (float8_e4m3fn / float8_e5m2, `--kv-cache-dtype fp8_*`), its rows widened (fp8_kv.h)
// times the layer's k / v scale in that copy. One parallel
// region per kv head, whose threads take the tasks of its G q heads one at a time from a shared
// counter, longest first (the last rows see the most keys): the threads finish together even
// when one of them runs slower (a core shared with another process). For bf16 inputs p = 2^x
// uses the degree-3 fit of vec_exp2.h (~1e-4 relative, far below the output's bf16 rounding).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>  // the ATen ops this file calls (not torch/extension.h: ~10x the parse time)

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>

#include "fp8_kv.h"

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define SGL_PAV_512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__)
#define SGL_PAV_256 1
#include <immintrin.h>
#endif
#if defined(SGL_PAV_512) || defined(SGL_PAV_256)
#include "vec_exp2.h"
#endif
#if defined(SGL_PAV_512) && defined(__AVX512BF16__)
// bf16_dot: S = Q K^T of bf16 q / k by vdpbf16ps (pairs of bf16 products, exact, summed in float32;
// denormal bf16 inputs read as zero), then scaled, and O = P V with P rounded to bf16 (as the AMX
// kernel does): half the instructions of the float32 FMAs, and no widened K / V copies (an FP8
// prefix's rows are widened times their scales and rounded to bf16: exact at unit scales). Pays
// where vdpbf16ps runs at twice the float32 FMA's multiply-adds (AMD Zen 5: 245 vs 127 per ns and
// core), not where it runs at half (the Emerald Rapids Xeon measured: 44 vs 88). Off unless asked.
#define SGL_PAV_DOT 1
#endif

namespace sgl_pav {

#if defined(SGL_PAV_512) || defined(SGL_PAV_256)

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.6931471805599453f;

// e^x for |x| <= ln(2) / 2: degree-6 Taylor series (relative error < 1.2e-7), on V's vectors
template <class V>
inline typename V::T exp_series(typename V::T x) {
  typename V::T p = V::set1(1.f / 720.f);
  p = V::fmadd(p, x, V::set1(1.f / 120.f));
  p = V::fmadd(p, x, V::set1(1.f / 24.f));
  p = V::fmadd(p, x, V::set1(1.f / 6.f));
  p = V::fmadd(p, x, V::set1(0.5f));
  p = V::fmadd(p, x, V::set1(1.f));
  return V::fmadd(p, x, V::set1(1.f));
}

#if defined(SGL_PAV_512)
struct Vec {
  using T = __m512;
  static constexpr int W = 16;
  static constexpr int QV = 3;  // query vectors per task (48 rows)
  static constexpr int KG = 8;  // keys per score register block (KG x QV accumulators)
  static constexpr int DG = 8;  // dims per P.V register block (DG x QV accumulators)
  static constexpr int N = 64;  // keys per block
  static T zero() { return _mm512_setzero_ps(); }
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T load(const float* p) { return _mm512_load_ps(p); }
  static void store(float* p, T x) { _mm512_store_ps(p, x); }
  static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T max(T a, T b) { return _mm512_max_ps(a, b); }
  static T iota() { return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
  // x where key_pos <= row_pos, else -inf
  static T causal(T x, T key_pos, T row_pos) {
    return _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(key_pos, row_pos, _CMP_GT_OQ),
                              set1(-std::numeric_limits<float>::infinity()));
  }
  // 2^t (0 below -150; a NaN stays NaN: maxps returns its second operand when one is NaN)
  static T exp2(T t) {
    t = _mm512_max_ps(set1(-150.f), t);
    const T n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_scalef_ps(exp_series<Vec>(_mm512_mul_ps(sub(t, n), set1(kLn2))), n);
  }
  static T exp2_fast(T t) { return sgl_vec::exp2_fast(_mm512_max_ps(set1(-150.f), t)); }
};
#else
struct Vec {
  using T = __m256;
  static constexpr int W = 8;
  static constexpr int QV = 2;  // 16 rows
  static constexpr int KG = 6;  // 12 accumulators + 2 query vectors + a broadcast: 15 of 16 ymm
  static constexpr int DG = 4;
  static constexpr int N = 48;
  static T zero() { return _mm256_setzero_ps(); }
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T load(const float* p) { return _mm256_load_ps(p); }
  static void store(float* p, T x) { _mm256_store_ps(p, x); }
  static T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T max(T a, T b) { return _mm256_max_ps(a, b); }
  static T iota() { return _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7); }
  static T causal(T x, T key_pos, T row_pos) {
    return _mm256_blendv_ps(x, set1(-std::numeric_limits<float>::infinity()),
                            _mm256_cmp_ps(key_pos, row_pos, _CMP_GT_OQ));
  }
  // 2^t (+0 below -127; t <= 127 here: scores minus their running max)
  static T exp2(T t) {
    t = _mm256_min_ps(set1(127.f), _mm256_max_ps(set1(-127.f), t));
    const T n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const T p = exp_series<Vec>(_mm256_mul_ps(sub(t, n), set1(kLn2)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  }
  static T exp2_fast(T t) { return sgl_vec::exp2_fast(t); }
};
#endif

constexpr int BQ = Vec::QV * Vec::W;  // query rows per task

// 64-byte aligned float scratch
class Floats {
 public:
  explicit Floats(size_t n) : p_(static_cast<float*>(std::aligned_alloc(64, std::max<size_t>(64, (n * 4 + 63) / 64 * 64)))) {
    TORCH_CHECK(p_ != nullptr, "prefill_attention_vec: out of memory");
  }
  ~Floats() { std::free(p_); }
  Floats(const Floats&) = delete;
  Floats& operator=(const Floats&) = delete;
  float* data() const { return p_; }

 private:
  float* p_;
};

// every accumulator of a register block to zero
template <int A, int B, class T>
inline __attribute__((always_inline)) void zero_acc(T (&acc)[A][B]) {
#pragma GCC unroll 8
  for (int a = 0; a < A; ++a)
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) acc[a][b] = T{};
}

// O^T rows d0.. of a P.V register block: ot = ot * alpha + acc
template <int DG, int QV, class T>
inline __attribute__((always_inline)) void update_ot(float* ot, int d0, const T (&alpha)[QV], const T (&acc)[DG][QV]) {
#pragma GCC unroll 8
  for (int dd = 0; dd < DG; ++dd)
#pragma GCC unroll 4
    for (int v = 0; v < QV; ++v) {
      float* o = ot + (d0 + dd) * BQ + v * Vec::W;
      Vec::store(o, Vec::fmadd(Vec::load(o), alpha[v], acc[dd][v]));
    }
}

#if defined(SGL_PAV_DOT)
// One N-key block (keys k0..) of a bf16_dot task (attend_rows' kDot form; its arguments): S^T = Q^T K
// by vdpbf16ps, scaled, masked past each row where the block reaches past row0, the new running
// max taken as each score is stored; then p = 2^(s - max), summed in key order and rounded to bf16
// key pairs in pb (the float p never stored); O^T = alpha * O^T + V^T . P^T. m / sum: the task's
// running max and sums, updated.
template <int D>
inline void dot_block(int64_t k0, int64_t row0, const __m512 (&row_pos)[Vec::QV], __m512 (&m)[Vec::QV],
                      __m512 (&sum)[Vec::QV], const uint32_t* qp, const uint16_t* kb, float qscale,
                      const uint32_t* vb, float* st, uint32_t* pb, float* ot) {
  using V = Vec;
  constexpr int QV = V::QV, KG = V::KG, DG = V::DG, N = V::N, W = V::W;
  const __m512 qs = _mm512_set1_ps(qscale);
  const bool diag = k0 + N - 1 > row0;
  __m512 mx[QV];
  for (int v = 0; v < QV; ++v) mx[v] = m[v];
  for (int g = 0; g < N; g += KG) {
    __m512 acc[KG][QV];
    zero_acc(acc);
    const uint32_t* kp[KG];
    for (int kk = 0; kk < KG; ++kk) kp[kk] = reinterpret_cast<const uint32_t*>(kb + (k0 + g + kk) * D);
    for (int dp = 0; dp < D / 2; ++dp) {
      __m512bh q[QV];
#pragma GCC unroll 4
      for (int v = 0; v < QV; ++v) q[v] = (__m512bh)_mm512_load_si512(qp + dp * BQ + v * W);
#pragma GCC unroll 8
      for (int kk = 0; kk < KG; ++kk) {
        const __m512bh b = (__m512bh)_mm512_set1_epi32(static_cast<int>(kp[kk][dp]));
#pragma GCC unroll 4
        for (int v = 0; v < QV; ++v) acc[kk][v] = _mm512_dpbf16_ps(acc[kk][v], b, q[v]);
      }
    }
#pragma GCC unroll 8
    for (int kk = 0; kk < KG; ++kk) {
      const __m512 key_pos = V::set1(static_cast<float>(k0 + g + kk));
#pragma GCC unroll 4
      for (int v = 0; v < QV; ++v) {
        __m512 sv = _mm512_mul_ps(acc[kk][v], qs);
        if (diag) sv = V::causal(sv, key_pos, row_pos[v]);
        mx[v] = V::max(mx[v], sv);
        V::store(st + (g + kk) * BQ + v * W, sv);
      }
    }
  }
  __m512 alpha[QV], s[QV];
  for (int v = 0; v < QV; ++v) {
    alpha[v] = V::exp2(V::sub(m[v], mx[v]));
    m[v] = mx[v];
    s[v] = V::zero();
  }
  for (int j = 0; j < N; j += 2) {  // P^T of keys j, j + 1 as one bf16 pair per lane
#pragma GCC unroll 4
    for (int v = 0; v < QV; ++v) {
      const __m512 p0 = V::exp2_fast(V::sub(V::load(st + j * BQ + v * W), mx[v]));
      const __m512 p1 = V::exp2_fast(V::sub(V::load(st + (j + 1) * BQ + v * W), mx[v]));
      s[v] = V::add(V::add(s[v], p0), p1);
      const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(p0));
      const __m512i hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(p1));
      _mm512_store_si512(pb + (j / 2) * BQ + v * W, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
  for (int v = 0; v < QV; ++v) sum[v] = V::fmadd(sum[v], alpha[v], s[v]);
  for (int d0 = 0; d0 < D; d0 += DG) {
    __m512 acc[DG][QV];
    zero_acc(acc);
    for (int jp = 0; jp < N / 2; ++jp) {
      const uint32_t* vp = vb + ((k0 / 2) + jp) * D + d0;
      __m512bh pp[QV];
#pragma GCC unroll 4
      for (int v = 0; v < QV; ++v) pp[v] = (__m512bh)_mm512_load_si512(pb + jp * BQ + v * W);
#pragma GCC unroll 8
      for (int dd = 0; dd < DG; ++dd) {
        const __m512bh b = (__m512bh)_mm512_set1_epi32(static_cast<int>(vp[dd]));
#pragma GCC unroll 4
        for (int v = 0; v < QV; ++v) acc[dd][v] = _mm512_dpbf16_ps(acc[dd][v], b, pp[v]);
      }
    }
    update_ot(ot, d0, alpha, acc);
  }
}
#endif

// One task: BQ rows (absolute positions row0, row0 + 1, ...) against keys [0, kend) held as
// contiguous float32 rows kf / vf [*, D] (zero rows after the last key, up to a multiple of N).
// qt: Q^T [D][BQ] pre-scaled; st: [N][BQ] scratch; ot: O^T [D][BQ] out (unnormalised); l: [BQ]
// out (the softmax sums).
// kDot (SGL_PAV_DOT only): S^T from qp (Q^T as bf16 pairs [D / 2][BQ], unscaled) and kb (bf16 K
// rows [*, D]) times qscale, instead of qt / kf; and O^T from P rounded to bf16 (key pairs per
// lane, in the scratch pb [N / 2][BQ]) and vb (V as key pairs: [key / 2][D] of two bf16), instead of
// vf, as the AMX kernel rounds P (the softmax sums stay those of the unrounded P): dot_block.
template <int D, bool kFastExp, bool kDot = false>
void attend_rows(const float* qt, const float* kf, const float* vf, int64_t kend, int64_t row0,
                 float* st, float* ot, float* l, const uint32_t* qp = nullptr, const uint16_t* kb = nullptr,
                 float qscale = 1.f, const uint32_t* vb = nullptr, uint32_t* pb = nullptr) {
  using V = Vec;
  using T = V::T;
  constexpr int QV = V::QV, KG = V::KG, DG = V::DG, N = V::N, W = V::W;
  T m[QV], sum[QV], row_pos[QV];
  for (int v = 0; v < QV; ++v) {
    m[v] = V::set1(-std::numeric_limits<float>::infinity());
    sum[v] = V::zero();
    row_pos[v] = V::add(V::set1(static_cast<float>(row0 + v * W)), V::iota());
  }
  std::memset(ot, 0, sizeof(float) * D * BQ);
  for (int64_t k0 = 0; k0 < kend; k0 += N) {
#if defined(SGL_PAV_DOT)
    if constexpr (kDot) {
      dot_block<D>(k0, row0, row_pos, m, sum, qp, kb, qscale, vb, st, pb, ot);
      continue;
    }
#endif
    // S^T of the block
    for (int g = 0; g < N; g += KG) {
      T acc[KG][QV];
      zero_acc(acc);
      const float* kp[KG];
      for (int kk = 0; kk < KG; ++kk) kp[kk] = kf + (k0 + g + kk) * D;
      for (int d = 0; d < D; ++d) {
        T q[QV];
#pragma GCC unroll 4
        for (int v = 0; v < QV; ++v) q[v] = V::load(qt + d * BQ + v * W);
#pragma GCC unroll 8
        for (int kk = 0; kk < KG; ++kk) {
          const T b = V::set1(kp[kk][d]);
#pragma GCC unroll 4
          for (int v = 0; v < QV; ++v) acc[kk][v] = V::fmadd(b, q[v], acc[kk][v]);
        }
      }
#pragma GCC unroll 8
      for (int kk = 0; kk < KG; ++kk)
#pragma GCC unroll 4
        for (int v = 0; v < QV; ++v) V::store(st + (g + kk) * BQ + v * W, acc[kk][v]);
    }
    if (k0 + N - 1 > row0) {  // the block reaches past the first row: mask keys after each row
      for (int j = 0; j < N; ++j) {
        const T key_pos = V::set1(static_cast<float>(k0 + j));
        for (int v = 0; v < QV; ++v) V::store(st + j * BQ + v * W, V::causal(V::load(st + j * BQ + v * W), key_pos, row_pos[v]));
      }
    }
    // online softmax: new running max, rescale factor, p = 2^(s - max), sums
    T mx[QV], alpha[QV], s[QV];
    for (int v = 0; v < QV; ++v) mx[v] = m[v];
    for (int j = 0; j < N; ++j)
#pragma GCC unroll 4
      for (int v = 0; v < QV; ++v) mx[v] = V::max(mx[v], V::load(st + j * BQ + v * W));
    for (int v = 0; v < QV; ++v) {
      alpha[v] = V::exp2(V::sub(m[v], mx[v]));
      m[v] = mx[v];
      s[v] = V::zero();
    }
    for (int j = 0; j < N; ++j)
#pragma GCC unroll 4
      for (int v = 0; v < QV; ++v) {
        const T x = V::sub(V::load(st + j * BQ + v * W), mx[v]);
        const T p = kFastExp ? V::exp2_fast(x) : V::exp2(x);
        V::store(st + j * BQ + v * W, p);
        s[v] = V::add(s[v], p);
      }
    for (int v = 0; v < QV; ++v) sum[v] = V::fmadd(sum[v], alpha[v], s[v]);
    // O^T = alpha * O^T + V^T . P^T
    for (int d0 = 0; d0 < D; d0 += DG) {
      T acc[DG][QV];
      zero_acc(acc);
      for (int j = 0; j < N; ++j) {
        const float* vp = vf + (k0 + j) * D + d0;
        T p[QV];
#pragma GCC unroll 4
        for (int v = 0; v < QV; ++v) p[v] = V::load(st + j * BQ + v * W);
#pragma GCC unroll 8
        for (int dd = 0; dd < DG; ++dd) {
          const T b = V::set1(vp[dd]);
#pragma GCC unroll 4
          for (int v = 0; v < QV; ++v) acc[dd][v] = V::fmadd(b, p[v], acc[dd][v]);
        }
      }
      update_ot(ot, d0, alpha, acc);
    }
  }
  for (int v = 0; v < QV; ++v) V::store(l + v * W, sum[v]);
}

inline float widen(float x) { return x; }
inline float widen(uint16_t x) { return __builtin_bit_cast(float, static_cast<uint32_t>(x) << 16); }
inline void narrow(float x, float* dst) { *dst = x; }
inline void narrow(float x, uint16_t* dst) {  // round to nearest even; NaN stays a quiet NaN
  const uint32_t u = __builtin_bit_cast(uint32_t, x);
  *dst = static_cast<uint16_t>(x != x ? 0x7FC0u : (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Where the keys / values of one kv head are: fresh rows (strided) after prefix rows (pool slots)
// of type C: S, or an FP8 code (widened times `scale`, the pool's layer scale).
template <typename S, typename C = S>
struct KVRows {
  const S* fresh;
  int64_t fresh_stride;
  const C* cache;  // head-major [Hk, cache_rows, D]; nullptr without a prefix
  const int64_t* slots;
  int64_t prefix;
  float scale = 1.f;
  // key's row of kv head h as bf16 bits (S: bf16) into dst[0..D): a fresh or bf16 cached row as
  // stored; an FP8 cached row widened times `scale` (and kv_unit), rounded to bf16 (exact at unit
  // scale: every FP8 value is a bf16)
  void copy_row(int64_t key, int64_t h, int64_t cache_rows, int D, S* __restrict__ dst) const {
    if constexpr (sgl_fp8::is_fp8_kv<C>) {
      if (key < prefix) {
        const C* r = cache + (h * cache_rows + slots[key]) * D;
        const float mul = scale * sgl_fp8::kv_unit<C>;
        for (int d = 0; d < D; ++d) narrow(sgl_fp8::to_f(r[d]) * mul, dst + d);
        return;
      }
    }
    const S* r = key >= prefix ? fresh + (key - prefix) * fresh_stride + h * D
                               : reinterpret_cast<const S*>(cache) + (h * cache_rows + slots[key]) * D;
    std::memcpy(dst, r, sizeof(S) * D);
  }
  // key's row of kv head h as float32 into dst[0..D)
  void widen_row(int64_t key, int64_t h, int64_t cache_rows, int D, float* __restrict__ dst) const {
    if (key >= prefix) {
      const S* r = fresh + (key - prefix) * fresh_stride + h * D;
      for (int d = 0; d < D; ++d) dst[d] = widen(r[d]);
      return;
    }
    const C* r = cache + (h * cache_rows + slots[key]) * D;
    if constexpr (sgl_fp8::is_fp8_kv<C>) {
      const float mul = scale * sgl_fp8::kv_unit<C>;
      for (int d = 0; d < D; ++d) dst[d] = sgl_fp8::to_f(r[d]) * mul;
    } else {
      for (int d = 0; d < D; ++d) dst[d] = widen(r[d]);
    }
  }
};

template <typename S, typename C, int D, bool kDot = false>
void run(const S* q, int64_t sq0, const KVRows<S, C>& ks, const KVRows<S, C>& vs, int64_t cache_rows, int64_t n, int64_t H,
         int64_t Hk, float scale, S* out, int64_t so0) {
  static_assert(!kDot || (std::is_same_v<S, uint16_t> && (std::is_same_v<C, uint16_t> || sgl_fp8::is_fp8_kv<C>)),
                "bf16_dot: bf16 q / k, a bf16 or FP8 cache");
  constexpr int N = Vec::N;
  const int64_t P = ks.prefix, L = P + n, G = H / Hk;
  const int64_t lpad = (L + N - 1) / N * N;
  Floats kf(lpad * D), vf(lpad * D);
  std::memset(kf.data() + L * D, 0, sizeof(float) * (lpad - L) * D);  // the last block's padding keys
  std::memset(vf.data() + L * D, 0, sizeof(float) * (lpad - L) * D);
  // kDot: K also as bf16 rows (zero padding keys), read by the vdpbf16ps scores
  Floats kbf(kDot ? (lpad * D + 1) / 2 : 1);
  uint16_t* kb = reinterpret_cast<uint16_t*>(kbf.data());
  if constexpr (kDot) std::memset(kb + L * D, 0, sizeof(uint16_t) * (lpad - L) * D);
  // kDot: V as key pairs, [key / 2][D] of (V[2i][d], V[2i + 1][d]) (zero padding keys)
  Floats vbf(kDot ? lpad * D / 2 : 1);
  uint16_t* vb16 = reinterpret_cast<uint16_t*>(vbf.data());
  if constexpr (kDot) std::memset(vb16 + L / 2 * 2 * D, 0, sizeof(uint16_t) * (lpad - L / 2 * 2) * D);
  const int64_t nqb = (n + BQ - 1) / BQ;
  const float qscale = scale * kLog2e;
  for (int64_t h = 0; h < Hk; ++h) {
    // the kv head's keys / values as contiguous float32 rows (widened from bf16, copied from
    // float32: strided fresh rows and scattered pool rows read slower in the loops than a copy)
    at::parallel_for(0, L, 64, [&](int64_t b, int64_t e) {
      for (int64_t key = b; key < e; ++key) {
        if constexpr (kDot) {
          ks.copy_row(key, h, cache_rows, D, kb + key * D);
          alignas(64) S row[D];
          vs.copy_row(key, h, cache_rows, D, row);
          uint16_t* dst = vb16 + (key / 2) * 2 * D + (key & 1);
          for (int d = 0; d < D; ++d) dst[2 * d] = row[d];
        } else {
          ks.widen_row(key, h, cache_rows, D, kf.data() + key * D);
          vs.widen_row(key, h, cache_rows, D, vf.data() + key * D);
        }
      }
    });
    const int64_t ntasks = G * nqb;
    std::atomic<int64_t> next{0};
    at::parallel_for(0, std::min<int64_t>(ntasks, at::get_num_threads()), 1, [&](int64_t, int64_t) {
      // far-below-max scores give p around 2^-126 and below: flush denormals (microcode assists)
      const unsigned int csr = _mm_getcsr();
      _mm_setcsr(csr | 0x8040);
      Floats qt(D * BQ), st(Vec::N * BQ), ot(D * BQ), l(BQ), pbs(kDot ? Vec::N / 2 * BQ : 1);
      uint32_t* qp = reinterpret_cast<uint32_t*>(qt.data());  // kDot: Q^T as bf16 pairs [D / 2][BQ]
      for (int64_t t = next.fetch_add(1); t < ntasks; t = next.fetch_add(1)) {
        const int64_t hq = h * G + t % G, r0 = (nqb - 1 - t / G) * BQ;
        const int64_t rows = std::min<int64_t>(BQ, n - r0);
        for (int64_t i = 0; i < BQ; ++i) {
          const S* qrow = q + (r0 + i) * sq0 + hq * D;
          if constexpr (kDot) {
            for (int d = 0; d < D; d += 2) {
              qp[(d / 2) * BQ + i] = i >= rows ? 0u : (static_cast<uint32_t>(qrow[d + 1]) << 16 | qrow[d]);
            }
            continue;
          }
          if (i >= rows) {
            for (int d = 0; d < D; ++d) qt.data()[d * BQ + i] = 0.f;
            continue;
          }
          for (int d = 0; d < D; ++d) qt.data()[d * BQ + i] = widen(qrow[d]) * qscale;
        }
        const int64_t kend = std::min<int64_t>(L, P + r0 + BQ);
        attend_rows<D, !std::is_same_v<S, float>, kDot>(qt.data(), kf.data(), vf.data(), kend, P + r0, st.data(),
                                                        ot.data(), l.data(), qp, kb, qscale,
                                                        reinterpret_cast<const uint32_t*>(vb16),
                                                        reinterpret_cast<uint32_t*>(pbs.data()));
        for (int64_t i = 0; i < rows; ++i) {
          const float inv = 1.f / l.data()[i];
          S* orow = out + (r0 + i) * so0 + hq * D;
          for (int d = 0; d < D; ++d) narrow(ot.data()[d * BQ + i] * inv, orow + d);
        }
      }
      _mm_setcsr(csr);
    });
  }
}

#endif  // SGL_PAV_512 || SGL_PAV_256

}  // namespace sgl_pav

bool prefill_attention_vec_supported() {
#if defined(SGL_PAV_512) || defined(SGL_PAV_256)
  return true;
#else
  return false;
#endif
}

at::Tensor prefill_attention_vec(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                 const std::optional<at::Tensor>& k_cache, const std::optional<at::Tensor>& v_cache,
                                 const std::optional<at::Tensor>& prefix_slots, const std::optional<at::Tensor>& out_opt,
                                 double k_scale, double v_scale, bool bf16_dot) {
  TORCH_CHECK(prefill_attention_vec_supported(), "prefill_attention_vec: this build has no AVX2 / AVX-512 path");
#if defined(SGL_PAV_512) || defined(SGL_PAV_256)
  using namespace sgl_pav;
  const auto dt = q.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16, "prefill_attention_vec: float32 or bfloat16 q / k / v");
  TORCH_CHECK(k.scalar_type() == dt && v.scalar_type() == dt, "prefill_attention_vec: q / k / v of one dtype");
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "prefill_attention_vec: CPU tensors");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "prefill_attention_vec: [n, heads, D] inputs");
  const int64_t D = q.size(2);
  TORCH_CHECK(D == 64 || D == 128, "prefill_attention_vec: head dim 64 or 128, got ", D);
  TORCH_CHECK(k.size(2) == D && v.size(2) == D, "prefill_attention_vec: q / k / v head dims differ");
  for (const at::Tensor* t : {&q, &k, &v}) {
    TORCH_CHECK(t->stride(2) == 1 && t->stride(1) == D, "prefill_attention_vec: heads of a row must be contiguous");
  }
  const int64_t n = q.size(0), H = q.size(1), Hk = k.size(1);
  TORCH_CHECK(k.size(0) == n && v.size(0) == n && v.size(1) == Hk && Hk > 0 && H % Hk == 0,
              "prefill_attention_vec: shapes");
  const bool has_prefix = prefix_slots.has_value() && prefix_slots->numel() > 0;
  const int64_t P = has_prefix ? prefix_slots->numel() : 0;
  int64_t cache_rows = 0;
  const int64_t* slots = nullptr;
  if (has_prefix) {
    TORCH_CHECK(k_cache.has_value() && v_cache.has_value(), "prefill_attention_vec: prefix_slots needs k_cache / v_cache");
    for (const at::Tensor* c : {&*k_cache, &*v_cache}) {
      TORCH_CHECK(c->scalar_type() == k_cache->scalar_type() &&
                      (c->scalar_type() == dt || c->scalar_type() == at::kFloat8_e4m3fn ||
                       c->scalar_type() == at::kFloat8_e5m2) &&
                      c->dim() == 3 && c->is_contiguous() && c->size(0) == Hk && c->size(2) == D &&
                      c->size(1) == k_cache->size(1),
                  "prefill_attention_vec: caches must be contiguous head-major [Hk, rows, D] of q's dtype (or both "
                  "float8_e4m3fn / float8_e5m2)");
    }
    TORCH_CHECK(prefix_slots->scalar_type() == at::kLong && prefix_slots->dim() == 1 && prefix_slots->is_contiguous(),
                "prefill_attention_vec: prefix_slots must be contiguous int64 [P]");
    cache_rows = k_cache->size(1);
    slots = prefix_slots->data_ptr<int64_t>();
    for (int64_t j = 0; j < P; ++j) {
      TORCH_CHECK(slots[j] >= 0 && slots[j] < cache_rows, "prefill_attention_vec: prefix slot ", slots[j],
                  " outside the cache");
    }
  }
  at::Tensor out;
  if (out_opt.has_value() && out_opt->defined()) {
    out = *out_opt;
    TORCH_CHECK(out.scalar_type() == dt && out.dim() == 3 && out.size(0) == n && out.size(1) == H && out.size(2) == D &&
                    out.stride(2) == 1 && out.stride(1) == D,
                "prefill_attention_vec: out must be [n, heads, D] of q's dtype with contiguous heads");
  } else {
    out = at::empty({n, H, D}, q.options());
  }
  if (n == 0) return out;
  const float fscale = static_cast<float>(scale);
  const at::ScalarType cdt = has_prefix ? k_cache->scalar_type() : dt;
  auto launch = [&](auto tag, auto ctag) {
    using S = decltype(tag);
    using C = decltype(ctag);
    const auto ptr = [](const at::Tensor& t) { return reinterpret_cast<const S*>(t.data_ptr()); };
    const auto cptr = [&](const std::optional<at::Tensor>& t) {
      return has_prefix ? reinterpret_cast<const C*>(t->data_ptr()) : nullptr;
    };
    const KVRows<S, C> ks{ptr(k), k.stride(0), cptr(k_cache), slots, P, static_cast<float>(k_scale)};
    const KVRows<S, C> vs{ptr(v), v.stride(0), cptr(v_cache), slots, P, static_cast<float>(v_scale)};
    S* o = reinterpret_cast<S*>(out.data_ptr());
#if defined(SGL_PAV_DOT)
    if constexpr (std::is_same_v<S, uint16_t> && (std::is_same_v<C, uint16_t> || sgl_fp8::is_fp8_kv<C>)) {
      if (bf16_dot) {
        if (D == 64) {
          run<S, C, 64, true>(ptr(q), q.stride(0), ks, vs, cache_rows, n, H, Hk, fscale, o, out.stride(0));
        } else {
          run<S, C, 128, true>(ptr(q), q.stride(0), ks, vs, cache_rows, n, H, Hk, fscale, o, out.stride(0));
        }
        return;
      }
    }
#endif
    if (D == 64) {
      run<S, C, 64>(ptr(q), q.stride(0), ks, vs, cache_rows, n, H, Hk, fscale, o, out.stride(0));
    } else {
      run<S, C, 128>(ptr(q), q.stride(0), ks, vs, cache_rows, n, H, Hk, fscale, o, out.stride(0));
    }
  };
  auto launch_cache = [&](auto tag) {
    if (cdt == at::kFloat8_e4m3fn) {
      launch(tag, sgl_fp8::fp8_e4m3{});
    } else if (cdt == at::kFloat8_e5m2) {
      launch(tag, sgl_fp8::fp8_e5m2{});
    } else {
      launch(tag, tag);
    }
  };
  if (dt == at::kFloat) {
    launch_cache(float{});
  } else {
    launch_cache(uint16_t{});
  }
  return out;
#else
  return at::Tensor();
#endif
}
