// Fused CPU kernels of the sglang engine, compiled at install time (setup.py) once per build of the
// one ISA vocabulary (kernels/cpu/isa.py: avx512bf16, avx512, avx2, portable); the loader imports
// the build of the selected ISA. Intrinsics paths are guarded by the compiler's ISA macros: AVX-512
// ones (decode attention, RMSNorm, RoPE, bf16 SiLU: 16 float32 lanes, bfloat16 widened by a shift)
// in the avx512 builds, where only avx512bf16 may use BF16 instructions (`__AVX512BF16__`: vcvtneps2bf16; the
// avx512 build rounds with integer ops, for AVX-512 CPUs without BF16 such as Cascade Lake), AVX2 +
// FMA ones (every op: 8 float32 lanes, bfloat16 widened by a shift and rounded back to nearest even
// with integer ops) in the avx2 build, and the portable loops (which the compiler vectorises for the
// build's target) for the rest and the portable build.
//
// float32 / bfloat16 inputs; everything is computed in float32 and rounded once to the output
// dtype. The torch reference of each op is in kernels/cpu/reference.py (tests compare them).
//
//   decode_attention  one query per request over its KV slots in a head-major pool [Hk, rows, D],
//                     read in place (no gather); GQA; long sequences split across threads and
//                     merged by log-sum-exp. An FP8 pool (float8_e4m3fn / float8_e5m2, under float32
//                     or bf16 q) is widened element by element as read, with its per-layer scales.
//                     bf16_dot (AMD's AVX512-BF16): a bf16 pool's q.k (q's own bits) and p.v (p rounded
//                     to bf16, as the AMX prefill kernel does) by vdpbf16ps; an FP8 pool's too, each
//                     task's rows first widened to bf16 (exact) in order.
//   rms_norm          y = x * rsqrt(mean(x^2) + eps) * w
//   add_rms_norm      r = x + residual (rounded like torch's add; float32 residual: kept float32), y = rms_norm(r)
//   silu_and_mul      [T, 2d] -> silu(x[:, :d]) * x[:, d:]
//   rope              neox-layout rotary embedding of [T, H, D] rows (first `rot` dims)
//   prefill_attention causal attention of a sequence's new tokens (after an optional cached prefix
//                     read from the pool) on AMX tiles (prefill_attention_amx.cpp)
//   linear_f32out_packed  x . W^T in float32 from a packed bf16 W (linear_f32out_packed.cpp: LM head)
//   int8_linear       the W8A8-INT8 linear in one call: per-token int8 quantization, the int32 GEMM on a
//                     packed int8 weight (VNNI / maddubs / portable) and both scales (int8_linear.cpp)
//   int8_linear_vnni  the same compiled for AVX512-VNNI / AVX-VNNI, in the avx512 / avx2 builds only
//   bf16_linear       bf16 linear at decode-sized M on a weight packed in k pairs (AMX-BF16 / vdpbf16ps;
//                     bf16_linear.cpp; refused in builds without AVX512-BF16)
//   prefill_attention_vec  the same in float32 on AVX2 / AVX-512 vectors, float32 or bf16 inputs,
//                     head dim 64 / 128 (prefill_attention_vec.cpp: CPUs without AMX)

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>  // the ATen ops this file calls
#include <torch/csrc/utils/pybind.h>  // at::Tensor arguments in pybind11 (torch/extension.h: ~4x the parse time)

#include <algorithm>
#include <type_traits>
#if defined(__AVX512F__)
#include <immintrin.h>

#include "bf16_lanes.h"
#include "vec_exp2.h"
#include "silu_vec.h"
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "bf16_lanes.h"
#include "vec_exp2.h"
#include "silu_vec.h"
// the 8-lane paths below; the avx512 builds keep their own (or the compiler's 16-lane loops)
#define SGL_AVX2 1
#endif
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "fp8_kv.h"

namespace {

inline float to_f(float x) { return x; }
// bfloat16 data is handled as its uint16_t bits (loops over at::BFloat16 values do not vectorise)
inline float to_f(uint16_t x) { return __builtin_bit_cast(float, static_cast<uint32_t>(x) << 16); }

// exp(x) in float32 that the compiler vectorises (libm's expf is scalar without -ffast-math):
// 2^n * e^r with n = round(x / ln 2), |r| <= ln 2 / 2, degree-6 Taylor series for e^r;
// relative error < 2e-7. Inputs are clamped to [-87, 88] (results stay finite and normal).
// n is rounded by adding and subtracting 1.5 * 2^23 (nearest even, |x / ln 2| < 2^22), not by
// floor: without SSE4.1 (the portable build) floor is a libm call and the loops stay scalar.
inline float vexp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;
  const float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  float p = 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * __builtin_bit_cast(float, bits);
}

template <typename T>
inline T from_f(float x);
template <>
inline float from_f<float>(float x) {
  return x;
}
template <>
inline uint16_t from_f<uint16_t>(float x) {
  // round to nearest even, like Tensor.to(torch.bfloat16); NaN stays a (quiet) NaN. Integer ops
  // and a select, so that loops over it vectorise.
  const uint32_t u = __builtin_bit_cast(uint32_t, x);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(x != x ? 0x7FC0u : rounded);
}

// FP8 KV elements and their exact scalar widening (fp8_kv.h; e4m3 reads as 2^-8 times its value)
using sgl_fp8::fp8_e4m3;
using sgl_fp8::fp8_e5m2;
using sgl_fp8::is_fp8_kv;
using sgl_fp8::kv_unit;
using sgl_fp8::to_f;
constexpr int64_t kPvBlock = 16;  // FP8 V rows widened per block (a float32 scratch of 16 rows)

// Storage type of a tensor dtype in the kernels (bfloat16 -> its bits) and typed data pointers.
template <typename T>
using storage_t = std::conditional_t<std::is_same_v<T, at::BFloat16>, uint16_t, T>;
template <typename T>
const storage_t<T>* cptr(const at::Tensor& t) {
  return reinterpret_cast<const storage_t<T>*>(t.data_ptr<T>());
}
template <typename T>
storage_t<T>* mptr(const at::Tensor& t) {
  return reinterpret_cast<storage_t<T>*>(t.data_ptr<T>());
}

#if defined(__AVX512F__)
// 16 lanes of float32 from float32 / bfloat16 memory
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
// 16 FP8 values (see fp8_e4m3): to float16 bits in 16-bit lanes, widened by vcvtph2ps (exact)
inline __m512 load16(const fp8_e5m2* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(raw), 8));
}
inline __m512 load16(const fp8_e4m3* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  // sign-extended byte << 7: magnitude in bits 7-13, sign in 15 (and 14, cleared)
  const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(raw), 7), _mm256_set1_epi16(-16385));
  const __m256i nan_bits = _mm256_set1_epi16(0x3F80);  // |code| = 0x7F: NaN, exponent all ones
  const __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, nan_bits), nan_bits);
  return _mm512_cvtph_ps(_mm256_mask_blend_epi16(nan, h, _mm256_set1_epi16(0x7E00)));
}
// 16 float32 lanes to float32 / bfloat16 memory; bf16 rounded to nearest even with integer ops
// (bf16_lanes.h: from_f<uint16_t>'s, 16 at a time; a NaN becomes the quiet 0x7FC0 as there): exact
// in both avx512 builds (vcvtneps2bf16 flushes denormals, torch does not)
inline void store16(float* p, __m512 x) { _mm512_storeu_ps(p, x); }
using sgl_vec::f_to_bf16_16;
inline void store16(uint16_t* p, __m512 x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), f_to_bf16_16(x)); }
#endif

#if defined(SGL_AVX2)
// 8 lanes of float32 from / to float32 and bfloat16 memory, bf16 stored rounded to nearest even
// (from_f<uint16_t>'s integer ops, 8 at a time; NaN: bf16_lanes.h)
using sgl_vec::bf16_bits_to_f;
using sgl_vec::f_to_bf16_bits;
using sgl_vec::f_to_bf16_lanes;
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return bf16_bits_to_f(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
// 8 FP8 values (see fp8_e4m3) to float16 bits, widened by vcvtph2ps (F16C; exact)
inline __m256 load8(const fp8_e5m2* p) {
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtph_ps(_mm_unpacklo_epi8(_mm_setzero_si128(), raw));
}
inline __m256 load8(const fp8_e4m3* p) {
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m128i h = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(raw), 7), _mm_set1_epi16(-16385));
  const __m128i nan_bits = _mm_set1_epi16(0x3F80);  // |code| = 0x7F: NaN, exponent all ones
  const __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(h, nan_bits), nan_bits);
  return _mm256_cvtph_ps(_mm_or_si128(h, _mm_and_si128(nan, _mm_set1_epi16(0x7C00))));
}
inline void store8(float* p, __m256 x) { _mm256_storeu_ps(p, x); }
inline void store8(uint16_t* p, __m256 x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), f_to_bf16_bits(x)); }
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
// the 8 horizontal sums of a[0..7], as one vector (lane b = sum of a[b])
inline __m256 hsum8x8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);  // [a0..a3 low | a0..a3 high], a4..a7
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
// the first n (<= 8) lanes of v to dst
inline void store_first(float* dst, __m256 v, int64_t n) {
  if (n == 8) {
    _mm256_storeu_ps(dst, v);
  } else {
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, v);
    std::copy(tmp, tmp + n, dst);
  }
}
#endif

void check_cpu_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, name,
              " must be float32 or bfloat16, got ", t.scalar_type());
}

// ------------------------------------------------------------------------- decode attention
struct Task {
  int64_t req, head, begin, end;
};

#if defined(SGL_AVX2)
// s[0..L) <- e^(s - max), returns the max and the sum (sum of exp_accurate over 8 lanes, vexp tail)
inline void softmax_avx2(float* __restrict__ s, int64_t L, float& mx, float& sm) {
  int64_t j = 0;
  __m256 vm = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (; j + 8 <= L; j += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + j));
  float m = hmax8(vm);
  for (; j < L; ++j) m = s[j] > m ? s[j] : m;
  const __m256 vmax = _mm256_set1_ps(m);
  __m256 vsum = _mm256_setzero_ps();
  for (j = 0; j + 8 <= L; j += 8) {
    const __m256 e = sgl_vec::exp_accurate(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmax));
    _mm256_storeu_ps(s + j, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  float sum = hsum8(vsum);
  for (; j < L; ++j) {
    s[j] = vexp(s[j] - m);
    sum += s[j];
  }
  mx = m;
  sm = sum;
}

// attend_task_avx2 for bfloat16 K / V and a head dim HD that is a multiple of 16: each load takes 16
// values and widens them by interleaving with zeros (each bf16 lands in the top half of a float
// lane: no shift, one shuffle per 8 lanes). The interleave works within 128-bit halves, so of a
// 16-dim chunk `lo` holds dims {0-3, 8-11} and `hi` dims {4-7, 12-15}: q is put in that order for
// the dot products, P V accumulates in it and is put back in order when stored.
template <int HD>
void attend_task_avx2_bf16(const float* __restrict__ qf, const uint16_t* __restrict__ kh,
                           const uint16_t* __restrict__ vh, const int64_t* __restrict__ srow, int64_t L,
                           int64_t G, float* __restrict__ scores, float* __restrict__ part, float* __restrict__ mx,
                           float* __restrict__ sm) {
  static_assert(HD % 16 == 0, "16-dim chunks");
  constexpr int NC = HD / 16;
  const __m256i zero = _mm256_setzero_si256();
  std::vector<float> qperm(G * HD);
  for (int64_t g = 0; g < G; ++g) {
    for (int c = 0; c < NC; ++c) {
      const __m256 a = _mm256_loadu_ps(qf + g * HD + 16 * c), b = _mm256_loadu_ps(qf + g * HD + 16 * c + 8);
      _mm256_storeu_ps(&qperm[g * HD + 16 * c], _mm256_permute2f128_ps(a, b, 0x20));
      _mm256_storeu_ps(&qperm[g * HD + 16 * c + 8], _mm256_permute2f128_ps(a, b, 0x31));
    }
  }
  for (int64_t j0 = 0; j0 < L; j0 += 8) {
    const int64_t nb = std::min<int64_t>(8, L - j0);
    const uint16_t* kr[8];
    for (int64_t b = 0; b < 8; ++b) kr[b] = kh + srow[j0 + (b < nb ? b : 0)] * HD;  // a short block repeats key 0
    for (int64_t j = j0 + 8; j < std::min(L, j0 + 16); ++j) {  // rows are scattered: fetch the next block
      const char* ka = reinterpret_cast<const char*>(kh + srow[j] * HD);
      for (size_t b = 0; b < HD * sizeof(uint16_t); b += 64) _mm_prefetch(ka + b, _MM_HINT_T0);
      const char* va = reinterpret_cast<const char*>(vh + srow[j] * HD);
      for (size_t b = 0; b < HD * sizeof(uint16_t); b += 64) _mm_prefetch(va + b, _MM_HINT_T1);
    }
    for (int64_t g = 0; g < G; ++g) {
      const float* __restrict__ qg = qperm.data() + g * HD;
      __m256 acc[8];
      for (int b = 0; b < 8; ++b) acc[b] = _mm256_setzero_ps();
      for (int c = 0; c < NC; ++c) {
        const __m256 qlo = _mm256_loadu_ps(qg + 16 * c), qhi = _mm256_loadu_ps(qg + 16 * c + 8);
        for (int b = 0; b < 8; ++b) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kr[b] + 16 * c));
          acc[b] = _mm256_fmadd_ps(qlo, _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, raw)), acc[b]);
          acc[b] = _mm256_fmadd_ps(qhi, _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, raw)), acc[b]);
        }
      }
      store_first(scores + g * L + j0, hsum8x8(acc), nb);
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    float* __restrict__ s = scores + g * L;
    softmax_avx2(s, L, mx[g], sm[g]);
    float* __restrict__ out = part + g * HD;
    constexpr int CPP = NC < 4 ? NC : 4;  // 16-dim chunks per pass over the keys (8 accumulators)
    for (int c0 = 0; c0 < NC; c0 += CPP) {
      __m256 acc[2 * CPP];
      for (int c = 0; c < 2 * CPP; ++c) acc[c] = _mm256_setzero_ps();
      for (int64_t j = 0; j < L; ++j) {
        const uint16_t* __restrict__ vrow = vh + srow[j] * HD + 16 * c0;
        const __m256 p = _mm256_set1_ps(s[j]);
        for (int c = 0; c < CPP; ++c) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vrow + 16 * c));
          acc[2 * c] = _mm256_fmadd_ps(p, _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, raw)), acc[2 * c]);
          acc[2 * c + 1] = _mm256_fmadd_ps(p, _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, raw)), acc[2 * c + 1]);
        }
      }
      for (int c = 0; c < CPP; ++c) {
        _mm256_storeu_ps(out + 16 * (c0 + c), _mm256_permute2f128_ps(acc[2 * c], acc[2 * c + 1], 0x20));
        _mm256_storeu_ps(out + 16 * (c0 + c) + 8, _mm256_permute2f128_ps(acc[2 * c], acc[2 * c + 1], 0x31));
      }
    }
  }
}

// P V for FP8 V rows (Dv % 8 == 0): each block of rows is widened once into float32 scratch and
// used by all G query heads (the plain loop below would widen every row G times); the output row
// of a head stays in registers for up to 64 columns per pass over the block.
template <typename KV>
void pv_fp8_avx2(const float* __restrict__ scores, const KV* __restrict__ vh, const int64_t* __restrict__ srow,
                 int64_t L, int64_t G, int64_t Dv, float* __restrict__ part) {
  std::vector<float> wide(kPvBlock * Dv);
  std::fill(part, part + G * Dv, 0.f);
  for (int64_t j0 = 0; j0 < L; j0 += kPvBlock) {
    const int64_t nb = std::min(kPvBlock, L - j0);
    for (int64_t b = 0; b < nb; ++b) {
      const KV* __restrict__ vrow = vh + srow[j0 + b] * Dv;
      for (int64_t d = 0; d < Dv; d += 8) _mm256_storeu_ps(&wide[b * Dv + d], load8(vrow + d));
    }
    for (int64_t g = 0; g < G; ++g) {
      const float* __restrict__ s = scores + g * L + j0;
      float* __restrict__ out = part + g * Dv;
      for (int64_t c0 = 0; c0 < Dv; c0 += 64) {
        const int nc = static_cast<int>(std::min<int64_t>(8, (Dv - c0) / 8));
        __m256 acc[8];
        for (int c = 0; c < nc; ++c) acc[c] = _mm256_loadu_ps(out + c0 + 8 * c);
        for (int64_t b = 0; b < nb; ++b) {
          const __m256 p = _mm256_set1_ps(s[b]);
          const float* __restrict__ w = &wide[b * Dv + c0];
          for (int c = 0; c < nc; ++c) acc[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(w + 8 * c), acc[c]);
        }
        for (int c = 0; c < nc; ++c) _mm256_storeu_ps(out + c0 + 8 * c, acc[c]);
      }
    }
  }
}

// attend_task (below) on 8-lane vectors, for head dims that are multiples of 8. Scores of 8 keys at
// a time per query head (8 dot products reduced together by hsum8x8), softmax with exp_accurate,
// P V with the output row in registers (up to 64 columns per pass over the keys).
template <typename T, int HD>
void attend_task_avx2(const float* __restrict__ qf, const T* __restrict__ kh, const T* __restrict__ vh,
                      const int64_t* __restrict__ srow, int64_t L, int64_t G, int64_t D_, int64_t Dv_,
                      float* __restrict__ scores, float* __restrict__ part, float* __restrict__ mx,
                      float* __restrict__ sm) {
  if constexpr (std::is_same_v<T, uint16_t> && HD > 0 && HD % 16 == 0) {
    attend_task_avx2_bf16<HD>(qf, kh, vh, srow, L, G, scores, part, mx, sm);
    return;
  }
  const int64_t D = HD > 0 ? HD : D_;
  const int64_t Dv = HD > 0 ? HD : Dv_;
  using E = std::conditional_t<is_fp8_kv<T>, float, T>;  // FP8 keys: widened once per block, not per head
  std::vector<float> kwide(is_fp8_kv<T> ? 8 * D : 0);
  for (int64_t j0 = 0; j0 < L; j0 += 8) {
    const int64_t nb = std::min<int64_t>(8, L - j0);
    const E* kr[8];
    if constexpr (is_fp8_kv<T>) {
      for (int64_t b = 0; b < nb; ++b) {
        const T* __restrict__ row = kh + srow[j0 + b] * D;
        for (int64_t c = 0; c < D; c += 8) _mm256_storeu_ps(&kwide[b * D + c], load8(row + c));
      }
      for (int64_t b = 0; b < 8; ++b) kr[b] = kwide.data() + (b < nb ? b : 0) * D;  // a short block repeats key 0
    } else {
      for (int64_t b = 0; b < 8; ++b) kr[b] = kh + srow[j0 + (b < nb ? b : 0)] * D;  // a short block repeats key 0
    }
    for (int64_t j = j0 + 8; j < std::min(L, j0 + 16); ++j) {  // rows are scattered: fetch the next block
      const char* ka = reinterpret_cast<const char*>(kh + srow[j] * D);
      for (size_t b = 0; b < D * sizeof(T); b += 64) _mm_prefetch(ka + b, _MM_HINT_T0);
      const char* va = reinterpret_cast<const char*>(vh + srow[j] * Dv);
      for (size_t b = 0; b < Dv * sizeof(T); b += 64) _mm_prefetch(va + b, _MM_HINT_T1);
    }
    for (int64_t g = 0; g < G; ++g) {
      const float* __restrict__ qg = qf + g * D;
      __m256 acc[8];
      const __m256 q0 = _mm256_loadu_ps(qg);
      for (int b = 0; b < 8; ++b) acc[b] = _mm256_mul_ps(q0, load8(kr[b]));
      for (int64_t c = 8; c < D; c += 8) {
        const __m256 qc = _mm256_loadu_ps(qg + c);
        for (int b = 0; b < 8; ++b) acc[b] = _mm256_fmadd_ps(qc, load8(kr[b] + c), acc[b]);
      }
      store_first(scores + g * L + j0, hsum8x8(acc), nb);
    }
  }
  if constexpr (is_fp8_kv<T>) {
    for (int64_t g = 0; g < G; ++g) softmax_avx2(scores + g * L, L, mx[g], sm[g]);
    pv_fp8_avx2(scores, vh, srow, L, G, Dv, part);
    return;
  }
  for (int64_t g = 0; g < G; ++g) {
    float* __restrict__ s = scores + g * L;
    softmax_avx2(s, L, mx[g], sm[g]);
    float* __restrict__ out = part + g * Dv;
    for (int64_t c0 = 0; c0 < Dv; c0 += 64) {
      const int nc = static_cast<int>(std::min<int64_t>(8, (Dv - c0) / 8));
      __m256 acc[8];
      for (int c = 0; c < 8; ++c) acc[c] = _mm256_setzero_ps();
      for (int64_t jj = 0; jj < L; ++jj) {
        const T* __restrict__ vrow = vh + srow[jj] * Dv + c0;
        const __m256 p = _mm256_set1_ps(s[jj]);
        for (int c = 0; c < nc; ++c) acc[c] = _mm256_fmadd_ps(p, load8(vrow + 8 * c), acc[c]);
      }
      for (int c = 0; c < nc; ++c) _mm256_storeu_ps(out + c0 + 8 * c, acc[c]);
    }
  }
}
#endif

#if defined(__AVX512F__)
// vexp on 16 lanes (the same clamps, rounding, reduction and series: the same results up to the
// order of the FMA contractions)
inline __m512 vexp16(__m512 x) {
  // maxps / minps return their second operand when one is NaN: a NaN stays NaN, as in vexp
  x = _mm512_min_ps(_mm512_set1_ps(88.f), _mm512_max_ps(_mm512_set1_ps(-87.f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f),
                                    _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x));
  __m512 p = _mm512_set1_ps(1.f / 720.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}
#endif

// s[0..L) <- e^(s - max); the max and the sum of the exponentials
inline void softmax_row(float* __restrict__ s, int64_t L, float& mx, float& sm) {
#if defined(__AVX512F__)
  {  // 16 lanes, the last block masked (the scalar loops' max and vexp)
    const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    __m512 vm = ninf;
    for (int64_t j = 0; j < L; j += 16) {
      const __mmask16 k = L - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (L - j)) - 1);
      vm = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, k, s + j), vm);  // a NaN score is skipped, as below
    }
    const float m = _mm512_reduce_max_ps(vm);
    const __m512 vmax = _mm512_set1_ps(m);
    __m512 vs = _mm512_setzero_ps();
    for (int64_t j = 0; j < L; j += 16) {
      const __mmask16 k = L - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (L - j)) - 1);
      const __m512 e = vexp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), vmax));
      _mm512_mask_storeu_ps(s + j, k, e);
      vs = _mm512_mask_add_ps(vs, k, vs, e);
    }
    mx = m;
    sm = _mm512_reduce_add_ps(vs);
    return;
  }
#endif
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < L; ++j) m = s[j] > m ? s[j] : m;
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < L; ++j) {
    s[j] = vexp(s[j] - m);
    sum += s[j];
  }
  mx = m;
  sm = sum;
}

#if defined(__AVX512F__)
// P V (pv_fp8_avx2's scheme on 16 lanes, for every V element type): each block of rows widened
// once into float32 scratch for all G query heads, a head's output row in registers.
template <typename KV, int HD>
void pv_avx512(const float* __restrict__ scores, const KV* __restrict__ vh, const int64_t* __restrict__ srow,
                   int64_t L, int64_t G, float* __restrict__ part) {
  constexpr int NV = HD / 16;
  alignas(64) float wide[kPvBlock * HD];
  std::fill(part, part + G * HD, 0.f);
  for (int64_t j0 = 0; j0 < L; j0 += kPvBlock) {
    const int64_t nb = std::min(kPvBlock, L - j0);
    for (int64_t b = 0; b < nb; ++b) {
      const KV* __restrict__ vrow = vh + srow[j0 + b] * HD;
      if (j0 + kPvBlock + b < L) {  // the next block's scattered rows, ahead of use
        const char* ahead = reinterpret_cast<const char*>(vh + srow[j0 + kPvBlock + b] * HD);
        for (size_t o = 0; o < HD * sizeof(KV); o += 64) _mm_prefetch(ahead + o, _MM_HINT_T0);
      }
      for (int c = 0; c < NV; ++c) _mm512_store_ps(wide + b * HD + 16 * c, load16(vrow + 16 * c));
    }
    for (int64_t g = 0; g < G; ++g) {
      const float* __restrict__ s = scores + g * L + j0;
      float* __restrict__ out = part + g * HD;
      __m512 acc[NV];
      for (int c = 0; c < NV; ++c) acc[c] = _mm512_loadu_ps(out + 16 * c);
      for (int64_t b = 0; b < nb; ++b) {
        const __m512 p = _mm512_set1_ps(s[b]);
        for (int c = 0; c < NV; ++c) acc[c] = _mm512_fmadd_ps(p, _mm512_load_ps(wide + b * HD + 16 * c), acc[c]);
      }
      for (int c = 0; c < NV; ++c) _mm512_storeu_ps(out + 16 * c, acc[c]);
    }
  }
}

// The 16 horizontal sums of a[0..15] as one vector (lane k = sum of a[k]): three levels of
// in-lane unpacks / adds and two of 128-bit block shuffles, 45 ops for 16 sums (16 separate
// reductions take ~8 dependent ops each)
inline __m512 hsum16x16(const __m512* a) {
  __m512 b[8], c[4];
  for (int i = 0; i < 8; ++i) {  // per 128-bit block: [x0 + x2, y0 + y2, x1 + x3, y1 + y3]
    b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  }
  for (int i = 0; i < 4; ++i) {  // per block: the block sums of a[4i .. 4i + 3]
    const __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
    c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
  const __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, 0x88), _mm512_shuffle_f32x4(d0, d1, 0xDD));
}

// one HD-wide row at `row` into the cache level `hint` names
template <typename KV, int HD, int hint>
inline void prefetch_row(const KV* row) {
  const char* p = reinterpret_cast<const char*>(row);
  for (size_t o = 0; o < HD * sizeof(KV); o += 64) _mm_prefetch(p + o, static_cast<_mm_hint>(hint));
}

// K rows j0 .. j1 - 1 of the slots into L1, their V rows into L2
template <typename KV, int HD>
inline void prefetch_kv_rows(const KV* kh, const KV* vh, const int64_t* srow, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) {
    prefetch_row<KV, HD, _MM_HINT_T0>(kh + srow[j] * HD);
    prefetch_row<KV, HD, _MM_HINT_T1>(vh + srow[j] * HD);
  }
}

// Scores of G query heads (qf [G][HD], pre-scaled) against L scattered K rows: blocks of 16 keys
// widened once into float32 scratch (the next block's K rows prefetched, its V rows into L2 for
// pv_avx512), then per head 16 independent dot products reduced together by hsum16x16; the last
// L % 16 keys one by one.
template <typename KV, int HD>
void scores_avx512(const float* __restrict__ qf, const KV* __restrict__ kh, const KV* __restrict__ vh,
                   const int64_t* __restrict__ srow, int64_t L, int64_t G, float* __restrict__ scores) {
  constexpr int NV = HD / 16;
  alignas(64) float wide[16 * HD];
  const int64_t L16 = L / 16 * 16;
  prefetch_kv_rows<KV, HD>(kh, vh, srow, 0, std::min<int64_t>(16, L));  // the first block's rows
  for (int64_t j0 = 0; j0 < L16; j0 += 16) {
    for (int b = 0; b < 16; ++b) {
      const KV* __restrict__ krow = kh + srow[j0 + b] * HD;
      if (j0 + 16 + b < L) {  // rows are scattered over the pool: fetch the next block ahead of use
        const char* ahead = reinterpret_cast<const char*>(kh + srow[j0 + 16 + b] * HD);
        for (size_t o = 0; o < HD * sizeof(KV); o += 64) _mm_prefetch(ahead + o, _MM_HINT_T0);
        const char* vahead = reinterpret_cast<const char*>(vh + srow[j0 + 16 + b] * HD);
        for (size_t o = 0; o < HD * sizeof(KV); o += 64) _mm_prefetch(vahead + o, _MM_HINT_T1);
      }
      for (int c = 0; c < NV; ++c) _mm512_store_ps(wide + b * HD + 16 * c, load16(krow + 16 * c));
    }
    for (int64_t g = 0; g < G; ++g) {
      __m512 q[NV], acc[16];
      for (int c = 0; c < NV; ++c) q[c] = _mm512_loadu_ps(qf + g * HD + 16 * c);
#pragma GCC unroll 16
      for (int b = 0; b < 16; ++b) {
        acc[b] = _mm512_mul_ps(q[0], _mm512_load_ps(wide + b * HD));
        for (int c = 1; c < NV; ++c) acc[b] = _mm512_fmadd_ps(q[c], _mm512_load_ps(wide + b * HD + 16 * c), acc[b]);
      }
      _mm512_storeu_ps(scores + g * L + j0, hsum16x16(acc));
    }
  }
  for (int64_t j = L16; j < L; ++j) {
    const KV* __restrict__ krow = kh + srow[j] * HD;
    __m512 kv[NV];
    for (int c = 0; c < NV; ++c) kv[c] = load16(krow + 16 * c);
    for (int64_t g = 0; g < G; ++g) {
      __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qf + g * HD), kv[0]);
      for (int c = 1; c < NV; ++c) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qf + g * HD + 16 * c), kv[c], acc);
      scores[g * L + j] = _mm512_reduce_add_ps(acc);
    }
  }
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)
// scores_avx512 for a bf16 pool by vdpbf16ps (`bf16_dot`): q's own bf16 values [G][HD] against the
// raw K rows, products exact and summed in float32, then scaled by `fscale` (where the float path
// scales q first): no widened copy of K, half the multiply-add instructions. For CPUs where
// vdpbf16ps runs at the float32 FMA's instruction rate (AMD Zen 4 / 5: `Platform.bf16_vec_kernels`).
constexpr int64_t kDotAhead = 48;  // rows prefetched ahead by the bf16_dot loops (three 16-key blocks)
template <int HD>
void scores_dot_avx512(const uint16_t* __restrict__ qb, const uint16_t* __restrict__ kh,
                       const uint16_t* __restrict__ vh, const int64_t* __restrict__ srow, int64_t L, int64_t G,
                       float fscale, float* __restrict__ scores) {
  constexpr int NP = HD / 32;  // 32 bf16 a vector
  const __m512 sc = _mm512_set1_ps(fscale);
  const int64_t L16 = L / 16 * 16;
  prefetch_kv_rows<uint16_t, HD>(kh, vh, srow, 0, std::min<int64_t>(kDotAhead, L));  // the first blocks' rows
  for (int64_t j0 = 0; j0 < L16; j0 += 16) {
    // scattered rows, kDotAhead ahead of use
    prefetch_kv_rows<uint16_t, HD>(kh, vh, srow, std::min(L, j0 + kDotAhead), std::min(L, j0 + kDotAhead + 16));
    for (int64_t g = 0; g < G; ++g) {
      __m512bh q[NP];
      for (int c = 0; c < NP; ++c) q[c] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(qb + g * HD + 32 * c));
      __m512 acc[16];
#pragma GCC unroll 16
      for (int b = 0; b < 16; ++b) {
        const uint16_t* kr = kh + srow[j0 + b] * HD;
        acc[b] = _mm512_dpbf16_ps(_mm512_setzero_ps(), q[0], reinterpret_cast<__m512bh>(_mm512_loadu_si512(kr)));
        for (int c = 1; c < NP; ++c)
          acc[b] = _mm512_dpbf16_ps(acc[b], q[c], reinterpret_cast<__m512bh>(_mm512_loadu_si512(kr + 32 * c)));
      }
      _mm512_storeu_ps(scores + g * L + j0, _mm512_mul_ps(hsum16x16(acc), sc));
    }
  }
  for (int64_t j = L16; j < L; ++j) {
    const uint16_t* kr = kh + srow[j] * HD;
    for (int64_t g = 0; g < G; ++g) {
      __m512 acc = _mm512_setzero_ps();
      for (int c = 0; c < NP; ++c)
        acc = _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(_mm512_loadu_si512(qb + g * HD + 32 * c)),
                               reinterpret_cast<__m512bh>(_mm512_loadu_si512(kr + 32 * c)));
      scores[g * L + j] = _mm512_reduce_add_ps(acc) * fscale;
    }
  }
}

// P V for a bf16 pool by vdpbf16ps (`bf16_dot`): each head's P (softmax numerators, float32 in
// `scores`) rounded to bf16 into pb [G][L rounded up to even] (a zero past L), V rows taken two at a
// time and interleaved in 16-bit halves (row j low, row j + 1 high) so that one vdpbf16ps adds
// p_j v_j + p_j+1 v_j+1 for 16 dims; the interleave works within 128-bit blocks, so each 32-dim
// chunk's two accumulators hold dims {0-3, 8-11, ...} and {4-7, 12-15, ...} and are put back in
// order when stored. Heads HG at a time (their accumulators in registers), each pair's interleave
// shared by them.
template <int HD>
void pv_dot_avx512(const float* __restrict__ scores, const uint16_t* __restrict__ vh,
                   const int64_t* __restrict__ srow, int64_t L, int64_t G, float* __restrict__ part,
                   uint16_t* __restrict__ pb) {
  constexpr int NP = HD / 32;
  constexpr int HG = HD == 64 ? 4 : 2;  // 2 NP accumulators a head: 16 registers
  const int64_t Lp = (L + 1) / 2 * 2;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t j0 = 0; j0 < L; j0 += 16) {
      const __mmask16 m = L - j0 >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (L - j0)) - 1);
      const __m512 v = _mm512_maskz_loadu_ps(m, scores + g * L + j0);
      _mm256_mask_storeu_epi16(pb + g * Lp + j0, m, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
    }
    if (Lp > L) pb[g * Lp + L] = 0;
  }
  for (int64_t g0 = 0; g0 < G; g0 += HG) {
    const int64_t hn = std::min<int64_t>(HG, G - g0);
    __m512 acc[HG][2 * NP];
    for (int h = 0; h < HG; ++h)
      for (int c = 0; c < 2 * NP; ++c) acc[h][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < L; j += 2) {
      for (int64_t a = j + kDotAhead; a < std::min(L, j + kDotAhead + 2); ++a)  // scattered rows: fetch ahead
        prefetch_row<uint16_t, HD, _MM_HINT_T0>(vh + srow[a] * HD);
      const uint16_t* v0 = vh + srow[j] * HD;
      const uint16_t* v1 = j + 1 < L ? vh + srow[j + 1] * HD : nullptr;
      __m512i lo[NP], hi[NP];
      for (int c = 0; c < NP; ++c) {
        const __m512i a = _mm512_loadu_si512(v0 + 32 * c);
        const __m512i b = v1 != nullptr ? _mm512_loadu_si512(v1 + 32 * c) : _mm512_setzero_si512();
        lo[c] = _mm512_unpacklo_epi16(a, b);
        hi[c] = _mm512_unpackhi_epi16(a, b);
      }
      for (int h = 0; h < HG; ++h) {
        if (h >= hn) break;
        uint32_t pair;
        std::memcpy(&pair, pb + (g0 + h) * Lp + j, 4);
        const __m512bh pp = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pair)));
        for (int c = 0; c < NP; ++c) {
          acc[h][2 * c] = _mm512_dpbf16_ps(acc[h][2 * c], pp, reinterpret_cast<__m512bh>(lo[c]));
          acc[h][2 * c + 1] = _mm512_dpbf16_ps(acc[h][2 * c + 1], pp, reinterpret_cast<__m512bh>(hi[c]));
        }
      }
    }
    for (int64_t h = 0; h < hn; ++h)
      for (int c = 0; c < NP; ++c) {
        const __m512 t0 = _mm512_shuffle_f32x4(acc[h][2 * c], acc[h][2 * c + 1], 0x44);  // lo q0 q1, hi q0 q1
        const __m512 t1 = _mm512_shuffle_f32x4(acc[h][2 * c], acc[h][2 * c + 1], 0xEE);  // lo q2 q3, hi q2 q3
        float* out = part + (g0 + h) * HD + 32 * c;
        _mm512_storeu_ps(out, _mm512_shuffle_f32x4(t0, t0, 0xD8));
        _mm512_storeu_ps(out + 16, _mm512_shuffle_f32x4(t1, t1, 0xD8));
      }
  }
}
#endif

// bf16_dot's inputs to attend_task: q's bf16 values [G][D] (null: the float path), the score
// scale, P's bf16 scratch; for an FP8 pool also kw / vw [L][HD], its K / V rows widened to bf16,
// read through `iota` (0, 1, ...) as the pool's rows are read through the slots.
struct DotArgs {
  const uint16_t* qb = nullptr;
  float fscale = 1.f;
  uint16_t* pb = nullptr;
  uint16_t* kw = nullptr;
  uint16_t* vw = nullptr;
  const int64_t* iota = nullptr;
};

#if defined(__AVX512F__) && defined(__AVX512BF16__)
// 32 codes' bf16 bits: their magnitudes looked up in the 128-entry table `mags` (four vectors, two
// 64-entry vpermt2w lookups chosen by bit 6), the sign bit put back.
inline __m512i fp8x32_bf16(const uint8_t* p, const __m512i (&mags)[4]) {
  const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i lo = _mm512_permutex2var_epi16(mags[0], w, mags[1]);
  const __m512i hi = _mm512_permutex2var_epi16(mags[2], w, mags[3]);
  const __m512i mag = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(w, _mm512_set1_epi16(0x40)), lo, hi);
  return _mm512_or_si512(mag, _mm512_slli_epi16(_mm512_and_si512(w, _mm512_set1_epi16(0x80)), 8));
}

// An FP8 pool's K / V rows at the slots, widened to bf16 in order (kw / vw [L][HD]). Exact: every
// e4m3 / e5m2 value (e4m3's as 2^-8 times it, fp8_kv.h) is a normal bf16, so the dot path computes
// what it computes on a bf16 pool holding those values (and reads half the pool bytes).
template <typename KV, int HD>
void widen_rows_bf16(const KV* __restrict__ kh, const KV* __restrict__ vh, const int64_t* __restrict__ srow,
                     int64_t L, uint16_t* __restrict__ kw, uint16_t* __restrict__ vw) {
  const uint16_t* table = sgl_fp8::bf16_mags_of(KV{});
  __m512i mags[4];
  for (int i = 0; i < 4; ++i) mags[i] = _mm512_loadu_si512(table + 32 * i);
  for (int64_t j = 0; j < L; ++j) {
    if (j + kDotAhead < L) {  // scattered rows: fetch ahead
      prefetch_row<KV, HD, _MM_HINT_T0>(kh + srow[j + kDotAhead] * HD);
      prefetch_row<KV, HD, _MM_HINT_T0>(vh + srow[j + kDotAhead] * HD);
    }
    const uint8_t* kr = reinterpret_cast<const uint8_t*>(kh + srow[j] * HD);
    const uint8_t* vr = reinterpret_cast<const uint8_t*>(vh + srow[j] * HD);
    for (int c = 0; c < HD / 32; ++c) {
      _mm512_storeu_si512(kw + j * HD + 32 * c, fp8x32_bf16(kr + 32 * c, mags));
      _mm512_storeu_si512(vw + j * HD + 32 * c, fp8x32_bf16(vr + 32 * c, mags));
    }
  }
}
#endif

// One (request, kv head, slot range) task: scores of its G query heads, softmax statistics and the
// unnormalised output. HD > 0 fixes the head dim at compile time (accumulators stay in registers).
// dot.qb (bf16_dot): q's bf16 values [G][D] for scores_dot_avx512, else null.
template <typename T, int HD>
void attend_task(const float* __restrict__ qf, const T* __restrict__ kh, const T* __restrict__ vh,
                 const int64_t* __restrict__ srow, int64_t L, int64_t G, int64_t D_, int64_t Dv_,
                 float* __restrict__ scores, float* __restrict__ part, float* __restrict__ mx,
                 float* __restrict__ sm, const DotArgs& dot = {}) {
  const int64_t D = HD > 0 ? HD : D_;
  const int64_t Dv = HD > 0 ? HD : Dv_;
#if defined(SGL_AVX2)
  if (D % 8 == 0 && Dv % 8 == 0) {
    attend_task_avx2<T, HD>(qf, kh, vh, srow, L, G, D, Dv, scores, part, mx, sm);
    return;
  }
#endif
#if defined(__AVX512F__)
  if constexpr (HD > 0 && HD % 16 == 0) {
    // each K / V row widened once for all G heads (scores: 16 keys reduced together)
#if defined(__AVX512BF16__)
    if constexpr ((std::is_same_v<T, uint16_t> || is_fp8_kv<T>) && HD % 32 == 0) {
      if (dot.qb != nullptr) {
        const uint16_t *kd, *vd;
        if constexpr (is_fp8_kv<T>) {  // the task's rows widened to bf16 (exact), then read in order
          widen_rows_bf16<T, HD>(kh, vh, srow, L, dot.kw, dot.vw);
          kd = dot.kw, vd = dot.vw, srow = dot.iota;
        } else {
          kd = kh, vd = vh;
        }
        scores_dot_avx512<HD>(dot.qb, kd, vd, srow, L, G, dot.fscale, scores);
        for (int64_t g = 0; g < G; ++g) softmax_row(scores + g * L, L, mx[g], sm[g]);
        pv_dot_avx512<HD>(scores, vd, srow, L, G, part, dot.pb);
        return;
      }
    }
#else
    (void)dot;
#endif
    scores_avx512<T, HD>(qf, kh, vh, srow, L, G, scores);
    for (int64_t g = 0; g < G; ++g) softmax_row(scores + g * L, L, mx[g], sm[g]);
    pv_avx512<T, HD>(scores, vh, srow, L, G, part);
    return;
  }
#endif
  {
    for (int64_t j = 0; j < L; ++j) {
      const T* __restrict__ krow = kh + srow[j] * D;
      for (int64_t g = 0; g < G; ++g) {
        const float* __restrict__ qg = qf + g * D;
        float acc = 0.f;
#pragma omp simd reduction(+ : acc)
        for (int64_t d = 0; d < D; ++d) acc += qg[d] * to_f(krow[d]);
        scores[g * L + j] = acc;
      }
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    float* __restrict__ s = scores + g * L;
    softmax_row(s, L, mx[g], sm[g]);
    float* __restrict__ out = part + g * Dv;
    {
      std::fill(out, out + Dv, 0.f);
      for (int64_t j = 0; j < L; ++j) {
        const T* __restrict__ vrow = vh + srow[j] * Dv;
        const float p = s[j];
#pragma omp simd
        for (int64_t d = 0; d < Dv; ++d) out[d] += p * to_f(vrow[d]);
      }
    }
  }
}

// T: q's (and the output's) dtype; KV: the pool's element (T's storage, or an FP8 type). The
// pool's per-layer scales are folded in: k_scale (times kv_unit) into q's scaling, v_scale into
// the final normalisation, so the loops over K / V only widen.
template <typename T, typename KV>
void decode_attention_impl(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                           const at::Tensor& slots, const at::Tensor& lens, double scale, double k_scale,
                           double v_scale, bool bf16_dot, at::Tensor& out) {
  const int64_t n = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t Hk = k_buf.size(0), rows = k_buf.size(1), Dv = v_buf.size(2);
  const int64_t G = H / Hk, max_len = slots.size(1);
  const int64_t sq0 = q.stride(0), sq1 = q.stride(1);
  const auto* qp = cptr<T>(q);
  const auto* kp = static_cast<const KV*>(k_buf.data_ptr());
  const auto* vp = static_cast<const KV*>(v_buf.data_ptr());
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  auto* op = mptr<T>(out);

  // Split long sequences so that there are a few tasks per thread (flash-decoding).
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(lp[i] >= 1 && lp[i] <= max_len, "decode_attention: lens[", i, "] = ", lp[i],
                " outside [1, ", max_len, "]");
    total += lp[i];
  }
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t split = std::max<int64_t>(256, (total * Hk + 4 * threads - 1) / (4 * threads));
  std::vector<Task> tasks;
  std::vector<int64_t> first_task(n * Hk + 1);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < Hk; ++h) {
      first_task[i * Hk + h] = static_cast<int64_t>(tasks.size());
      for (int64_t b = 0; b < lp[i]; b += split) tasks.push_back({i, h, b, std::min(lp[i], b + split)});
    }
  }
  first_task[n * Hk] = static_cast<int64_t>(tasks.size());
  const int64_t nt = static_cast<int64_t>(tasks.size());
  // per task and q head: unnormalised output [Dv], running max, sum of exp
  std::vector<float> part(nt * G * Dv), mx(nt * G), sm(nt * G);
  const float fscale = static_cast<float>(scale * k_scale * kv_unit<KV>);
  const float vmul = static_cast<float>(v_scale * kv_unit<KV>);
  // one task per (request, kv head): each task normalises its own rows (one parallel region, not
  // two: a region costs a wake-up of the sleeping threads under OMP_WAIT_POLICY=PASSIVE)
  const bool unsplit = nt == n * Hk;
  // bf16_dot: a bf16 q on a bf16 or FP8 pool (its rows widened to bf16 per task) of head dim 64 /
  // 128 takes scores_dot_avx512 (q's own bits)
#if defined(__AVX512F__) && defined(__AVX512BF16__)
  const bool dot = bf16_dot && std::is_same_v<T, at::BFloat16> &&
                   (std::is_same_v<KV, uint16_t> || is_fp8_kv<KV>) && D == Dv && (D == 64 || D == 128);
#else
  const bool dot = false;  // no vdpbf16ps in this build: the hint is ignored
  (void)bf16_dot;
#endif

  at::parallel_for(0, nt, 1, [&](int64_t tb, int64_t te) {
    const int64_t span = std::min(split, max_len);  // a task's keys at most
    std::vector<float> qf(G * D), scores(G * span);
    std::vector<uint16_t> qb(dot ? G * D : 0), pb(dot ? G * (span + 2) : 0);
    const bool widen = dot && is_fp8_kv<KV>;  // FP8 rows as bf16 for the dot path (not zeroed: written first)
    std::unique_ptr<uint16_t[]> kw(widen ? new uint16_t[span * D] : nullptr), vw(widen ? new uint16_t[span * D] : nullptr);
    std::vector<int64_t> iota(widen ? span : 0);
    std::iota(iota.begin(), iota.end(), int64_t{0});
    for (int64_t t = tb; t < te; ++t) {
      const Task& task = tasks[t];
      for (int64_t g = 0; g < G; ++g) {
        const storage_t<T>* qrow = qp + task.req * sq0 + (task.head * G + g) * sq1;
        if (dot)  // q's own bits (the scores are scaled after the dot products)
          std::memcpy(qb.data() + g * D, qrow, static_cast<size_t>(D) * sizeof(uint16_t));
        else
          for (int64_t d = 0; d < D; ++d) qf[g * D + d] = to_f(qrow[d]) * fscale;
      }
      const DotArgs da{dot ? qb.data() : nullptr, fscale, pb.data(), kw.get(), vw.get(), iota.data()};
      const int64_t* srow = sp + task.req * max_len + task.begin;
      const KV* kh = kp + task.head * rows * D;
      const KV* vh = vp + task.head * rows * Dv;
      const int64_t L = task.end - task.begin;
      float* pt = part.data() + t * G * Dv;
      if (D == 64 && Dv == 64) {
        attend_task<KV, 64>(qf.data(), kh, vh, srow, L, G, D, Dv, scores.data(), pt, &mx[t * G], &sm[t * G], da);
      } else if (D == 128 && Dv == 128) {
        attend_task<KV, 128>(qf.data(), kh, vh, srow, L, G, D, Dv, scores.data(), pt, &mx[t * G], &sm[t * G], da);
      } else {
        attend_task<KV, 0>(qf.data(), kh, vh, srow, L, G, D, Dv, scores.data(), pt, &mx[t * G], &sm[t * G]);
      }
      if (unsplit) {  // the task is its (request, kv head): normalise here, no merge region
        for (int64_t g = 0; g < G; ++g) {
          storage_t<T>* orow = op + (task.req * H + task.head * G + g) * Dv;
          const float inv = vmul / sm[t * G + g];
          for (int64_t d = 0; d < Dv; ++d) orow[d] = from_f<storage_t<T>>(pt[g * Dv + d] * inv);
        }
      }
    }
  });
  if (unsplit) return;

  // merge the splits of each (request, kv head) and normalise
  at::parallel_for(0, n * Hk, 4, [&](int64_t b, int64_t e) {
    std::vector<float> acc(Dv);
    for (int64_t ih = b; ih < e; ++ih) {
      const int64_t i = ih / Hk, h = ih % Hk;
      for (int64_t g = 0; g < G; ++g) {
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t t = first_task[ih]; t < first_task[ih + 1]; ++t) m = std::max(m, mx[t * G + g]);
        float denom = 0.f;
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t t = first_task[ih]; t < first_task[ih + 1]; ++t) {
          const float w = std::exp(mx[t * G + g] - m);
          denom += w * sm[t * G + g];
          const float* pt = part.data() + (t * G + g) * Dv;
          for (int64_t d = 0; d < Dv; ++d) acc[d] += w * pt[d];
        }
        storage_t<T>* orow = op + (i * H + h * G + g) * Dv;
        const float inv = vmul / denom;
        for (int64_t d = 0; d < Dv; ++d) orow[d] = from_f<storage_t<T>>(acc[d] * inv);
      }
    }
  });
}

inline bool is_fp8(at::ScalarType t) { return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2; }

// q's dtype T; the pool's: T's own, or FP8 (each element widened inside the loops)
template <typename T>
void decode_attention_kv(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                         const at::Tensor& slots, const at::Tensor& lens, double scale, double k_scale,
                         double v_scale, bool bf16_dot, at::Tensor& out) {
  switch (k_buf.scalar_type()) {
    case at::kFloat8_e4m3fn:
      decode_attention_impl<T, fp8_e4m3>(q, k_buf, v_buf, slots, lens, scale, k_scale, v_scale, bf16_dot, out);
      break;
    case at::kFloat8_e5m2:
      decode_attention_impl<T, fp8_e5m2>(q, k_buf, v_buf, slots, lens, scale, k_scale, v_scale, bf16_dot, out);
      break;
    default:
      decode_attention_impl<T, storage_t<T>>(q, k_buf, v_buf, slots, lens, scale, k_scale, v_scale, bf16_dot, out);
  }
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                            const at::Tensor& slots, const at::Tensor& lens, double scale, double k_scale,
                            double v_scale, bool bf16_dot) {
  check_cpu_float(q, "q");
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "q must be [n, H, D] with contiguous D");
  TORCH_CHECK(k_buf.dim() == 3 && v_buf.dim() == 3 && k_buf.is_contiguous() && v_buf.is_contiguous(),
              "k_buf / v_buf must be contiguous head-major [Hk, rows, D]");
  TORCH_CHECK(k_buf.scalar_type() == v_buf.scalar_type() &&
                  (k_buf.scalar_type() == q.scalar_type() || is_fp8(k_buf.scalar_type())),
              "q, k_buf and v_buf must share a dtype (or k_buf / v_buf both float8_e4m3fn or float8_e5m2), got ",
              q.scalar_type(), ", ", k_buf.scalar_type(), ", ", v_buf.scalar_type());
  TORCH_CHECK(k_buf.size(0) == v_buf.size(0) && k_buf.size(1) == v_buf.size(1), "k_buf / v_buf mismatch");
  TORCH_CHECK(q.size(2) == k_buf.size(2), "q and k head dims differ");
  TORCH_CHECK(q.size(1) % k_buf.size(0) == 0, "query heads must be a multiple of kv heads");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.dim() == 2 && slots.is_contiguous() &&
                  slots.size(0) == q.size(0),
              "slots must be contiguous int64 [n, max_len]");
  TORCH_CHECK(lens.scalar_type() == at::kLong && lens.dim() == 1 && lens.is_contiguous() &&
                  lens.size(0) == q.size(0),
              "lens must be contiguous int64 [n]");
  auto out = at::empty({q.size(0), q.size(1), v_buf.size(2)}, q.options());
  if (q.size(0) == 0) return out;
  if (q.scalar_type() == at::kFloat) {
    decode_attention_kv<float>(q, k_buf, v_buf, slots, lens, scale, k_scale, v_scale, false, out);
  } else {
    decode_attention_kv<at::BFloat16>(q, k_buf, v_buf, slots, lens, scale, k_scale, v_scale, bf16_dot, out);
  }
  return out;
}

// ------------------------------------------------------------------------- norms
// rows per parallel chunk: keep small batches (decode) on one thread
inline int64_t row_grain(int64_t width) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, width)); }

// T: x, w and the output; R: the residual stream (T, or float32 under a bf16 model's float32
// residual stream: the sum is then kept unrounded and normed as is)
template <typename T, typename R = T>
void rms_norm_impl(const at::Tensor& x, const at::Tensor* residual, const at::Tensor& w, double eps,
                   at::Tensor& out, at::Tensor* res_out) {
  const int64_t rows = x.size(0), N = x.size(1);
  const int64_t sx = x.stride(0);
  const auto* xp = cptr<T>(x);
  const storage_t<R>* rp = residual ? cptr<R>(*residual) : nullptr;
  const int64_t sr = residual ? residual->stride(0) : 0;
  const auto* wp = cptr<T>(w);
  auto* op = mptr<T>(out);
  storage_t<R>* rop = res_out ? mptr<R>(*res_out) : nullptr;
  const float feps = static_cast<float>(eps);
  at::parallel_for(0, rows, row_grain(N), [&](int64_t b, int64_t e) {
    std::vector<float> buf(N);
    for (int64_t r = b; r < e; ++r) {
      const storage_t<T>* xr = xp + r * sx;
      const storage_t<R>* rr = rp ? rp + r * sr : nullptr;
      storage_t<R>* ro = rop ? rop + r * N : nullptr;
      int64_t c0 = 0;  // columns before c0 done by the vector path
      float ss = 0.f;
#if defined(__AVX512F__)
      {
        __m512 vss = _mm512_setzero_ps();
        for (; c0 + 16 <= N; c0 += 16) {
          __m512 v = load16(xr + c0);
          if (rr) {
            v = _mm512_add_ps(v, load16(rr + c0));
            if constexpr (std::is_same_v<storage_t<R>, uint16_t>) {  // the add is rounded, as torch's is
              const __m256i bits = f_to_bf16_16(v);
              _mm256_storeu_si256(reinterpret_cast<__m256i*>(ro + c0), bits);
              v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
            } else {
              _mm512_storeu_ps(ro + c0, v);
            }
          }
          _mm512_storeu_ps(buf.data() + c0, v);
          vss = _mm512_fmadd_ps(v, v, vss);
        }
        ss = _mm512_reduce_add_ps(vss);
      }
#elif defined(SGL_AVX2)
      {
        __m256 vss = _mm256_setzero_ps();
        for (; c0 + 8 <= N; c0 += 8) {
          __m256 v = load8(xr + c0);
          if (rr) {
            v = _mm256_add_ps(v, load8(rr + c0));
            if constexpr (std::is_same_v<storage_t<R>, uint16_t>) {  // the add is rounded, as torch's is
              const __m128i bits = f_to_bf16_bits(v);
              _mm_storeu_si128(reinterpret_cast<__m128i*>(ro + c0), bits);
              v = bf16_bits_to_f(bits);
            } else {
              _mm256_storeu_ps(ro + c0, v);
            }
          }
          _mm256_storeu_ps(buf.data() + c0, v);
          vss = _mm256_fmadd_ps(v, v, vss);
        }
        ss = hsum8(vss);
      }
#endif
      if (rr) {
        for (int64_t c = c0; c < N; ++c) {
          const storage_t<R> sum = from_f<storage_t<R>>(to_f(xr[c]) + to_f(rr[c]));  // the add is rounded, as torch's is
          ro[c] = sum;
          buf[c] = to_f(sum);
        }
      } else {
        for (int64_t c = c0; c < N; ++c) buf[c] = to_f(xr[c]);
      }
#pragma omp simd reduction(+ : ss)
      for (int64_t c = c0; c < N; ++c) ss += buf[c] * buf[c];
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(N) + feps);
      storage_t<T>* orow = op + r * N;
      int64_t c1 = 0;
#if defined(__AVX512F__)
      const __m512 vinv16 = _mm512_set1_ps(inv);
      for (; c1 + 16 <= N; c1 += 16) {
        store16(orow + c1, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(buf.data() + c1), vinv16), load16(wp + c1)));
      }
#elif defined(SGL_AVX2)
      const __m256 vinv = _mm256_set1_ps(inv);
      for (; c1 + 8 <= N; c1 += 8) store8(orow + c1, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(buf.data() + c1), vinv), load8(wp + c1)));
#endif
      for (int64_t c = c1; c < N; ++c) orow[c] = from_f<storage_t<T>>(buf[c] * inv * to_f(wp[c]));
    }
  });
}

void check_norm_args(const at::Tensor& x, const at::Tensor& w) {
  check_cpu_float(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "x must be [rows, N] with contiguous rows");
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(1) && w.is_contiguous() && w.scalar_type() == x.scalar_type(),
              "weight must be a contiguous [N] tensor of x's dtype");
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  check_norm_args(x, w);
  auto out = at::empty({x.size(0), x.size(1)}, x.options());
  if (x.scalar_type() == at::kFloat) {
    rms_norm_impl<float>(x, nullptr, w, eps, out, nullptr);
  } else {
    rms_norm_impl<at::BFloat16>(x, nullptr, w, eps, out, nullptr);
  }
  return out;
}

std::vector<at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& w,
                                     double eps) {
  check_norm_args(x, w);
  // a bf16 x may come with a float32 residual (a float32 residual stream): the new residual is float32
  const bool f32_stream = x.scalar_type() == at::kBFloat16 && residual.scalar_type() == at::kFloat;
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.stride(1) == 1 &&
                  (residual.scalar_type() == x.scalar_type() || f32_stream),
              "residual must match x (or be float32 under a bfloat16 x)");
  auto out = at::empty({x.size(0), x.size(1)}, x.options());
  auto res = at::empty({x.size(0), x.size(1)}, residual.options());
  if (x.scalar_type() == at::kFloat) {
    rms_norm_impl<float>(x, &residual, w, eps, out, &res);
  } else if (f32_stream) {
    rms_norm_impl<at::BFloat16, float>(x, &residual, w, eps, out, &res);
  } else {
    rms_norm_impl<at::BFloat16>(x, &residual, w, eps, out, &res);
  }
  return {out, res};
}

// ------------------------------------------------------------------------- silu_and_mul
#if defined(__AVX512F__) && defined(__AVX512DQ__)
// silu(g) * u for 16 bfloat16 lanes, one pass (silu_vec.h's method, which the fused gate_up
// linear of int8_linear_kernel.h shares). Faster than the three-pass loop below (docs/benchmarks.md,
// fused CPU kernels).
inline __m256i silu_mul16(const uint16_t* gate, const uint16_t* up) {
  const __m512 y = sgl_vec::silu_mul16(load16(gate), load16(up));
#if defined(__AVX512BF16__)
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(y));
#else
  // round to nearest even with integer ops (no AVX512-BF16), then the low halves of the 16 lanes
  // (vpmovdw); NaN as in f_to_bf16_lanes: only computed or bf16-born NaNs reach this
  const __m512i u = _mm512_castps_si512(y);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb);
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
#endif
}
#elif defined(SGL_AVX2)
using sgl_vec::silu_mul8_bf16;
using sgl_vec::silu_mul8_f32;
#endif

template <typename T>
void silu_and_mul_impl(const at::Tensor& x, at::Tensor& out) {
  const int64_t rows = x.size(0), d = out.size(1), sx = x.stride(0);
  const auto* xp = cptr<T>(x);
  auto* op = mptr<T>(out);
  at::parallel_for(0, rows, row_grain(d), [&](int64_t b, int64_t e) {
    std::vector<float> g(d);
    for (int64_t r = b; r < e; ++r) {
      const storage_t<T>* gate = xp + r * sx;
      const storage_t<T>* up = gate + d;
      storage_t<T>* orow = op + r * d;
      int64_t c0 = 0;
#if defined(__AVX512F__) && defined(__AVX512DQ__)
      if constexpr (std::is_same_v<T, at::BFloat16>) {
        for (; c0 + 16 <= d; c0 += 16) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(orow + c0), silu_mul16(gate + c0, up + c0));
        }
      }
#elif defined(SGL_AVX2)
      if constexpr (std::is_same_v<T, at::BFloat16>) {
        // 16 values per step, widened by interleaving with zeros (no shifts): lo = values {0-3, 8-11},
        // hi = {4-7, 12-15}; packus's in-lane order puts the results back in place
        const __m256i zero = _mm256_setzero_si256();
        for (; c0 + 16 <= d; c0 += 16) {
          const __m256i graw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gate + c0));
          const __m256i uraw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(up + c0));
          const __m256 ylo = silu_mul8_bf16(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, graw)),
                                            _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, uraw)));
          const __m256 yhi = silu_mul8_bf16(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, graw)),
                                            _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, uraw)));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(orow + c0),
                              _mm256_packus_epi32(f_to_bf16_lanes(ylo), f_to_bf16_lanes(yhi)));
        }
        for (; c0 + 8 <= d; c0 += 8) store8(orow + c0, silu_mul8_bf16(load8(gate + c0), load8(up + c0)));
      } else {
        for (; c0 + 8 <= d; c0 += 8) store8(orow + c0, silu_mul8_f32(load8(gate + c0), load8(up + c0)));
      }
#endif
      float* __restrict__ gp = g.data();
      for (int64_t c = c0; c < d; ++c) gp[c] = to_f(gate[c]);
      // e^-g overflows to inf below g = -88 (vexp alone clamps to a finite value): g / inf is
      // -0 for a finite g and NaN for -inf, as torch's g * sigmoid(g) (and the vector path)
#pragma omp simd
      for (int64_t c = c0; c < d; ++c) {
        const float v = gp[c];
        const float e = -v > 88.f ? std::numeric_limits<float>::infinity() : vexp(-v);
        gp[c] = v / (1.f + e);
      }
      for (int64_t c = c0; c < d; ++c) orow[c] = from_f<storage_t<T>>(gp[c] * to_f(up[c]));
    }
  });
}

at::Tensor silu_and_mul(const at::Tensor& x) {
  check_cpu_float(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) % 2 == 0, "x must be [rows, 2d] with contiguous rows");
  auto out = at::empty({x.size(0), x.size(1) / 2}, x.options());
  if (x.scalar_type() == at::kFloat) {
    silu_and_mul_impl<float>(x, out);
  } else {
    silu_and_mul_impl<at::BFloat16>(x, out);
  }
  return out;
}

// ------------------------------------------------------------------------- rope
template <typename T>
void rope_impl(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t rot, at::Tensor& out) {
  const int64_t n = x.size(0), H = x.size(1), D = x.size(2);
  const int64_t sx0 = x.stride(0), sx1 = x.stride(1), sc = cos.stride(0), ss = sin.stride(0);
  const int64_t half = rot / 2;
  const auto* xp = cptr<T>(x);
  const auto* cp = cptr<T>(cos);
  const auto* snp = cptr<T>(sin);
  auto* op = mptr<T>(out);
  at::parallel_for(0, n, row_grain(H * D), [&](int64_t b, int64_t e) {
    std::vector<float> c(rot), s(rot);
    for (int64_t t = b; t < e; ++t) {
      for (int64_t i = 0; i < rot; ++i) {
        c[i] = to_f(cp[t * sc + i]);
        s[i] = to_f(snp[t * ss + i]);
      }
      for (int64_t h = 0; h < H; ++h) {
        const storage_t<T>* xr = xp + t * sx0 + h * sx1;
        storage_t<T>* orow = op + (t * H + h) * D;
        // sin is "signed": its first half negated, so out = x * cos + roll(x, half) * sin
        int64_t i0 = 0;  // pairs (i, i + half) before i0 done by the vector path
#if defined(__AVX512F__)
        for (; i0 + 16 <= half; i0 += 16) {
          const __m512 x0 = load16(xr + i0), x1 = load16(xr + i0 + half);
          store16(orow + i0, _mm512_fmadd_ps(x1, _mm512_loadu_ps(&s[i0]), _mm512_mul_ps(x0, _mm512_loadu_ps(&c[i0]))));
          store16(orow + i0 + half,
                  _mm512_fmadd_ps(x0, _mm512_loadu_ps(&s[i0 + half]), _mm512_mul_ps(x1, _mm512_loadu_ps(&c[i0 + half]))));
        }
#elif defined(SGL_AVX2)
        for (; i0 + 8 <= half; i0 += 8) {
          const __m256 x0 = load8(xr + i0), x1 = load8(xr + i0 + half);
          store8(orow + i0, _mm256_fmadd_ps(x1, _mm256_loadu_ps(&s[i0]), _mm256_mul_ps(x0, _mm256_loadu_ps(&c[i0]))));
          store8(orow + i0 + half,
                 _mm256_fmadd_ps(x0, _mm256_loadu_ps(&s[i0 + half]), _mm256_mul_ps(x1, _mm256_loadu_ps(&c[i0 + half]))));
        }
#endif
        for (int64_t i = i0; i < half; ++i) orow[i] = from_f<storage_t<T>>(to_f(xr[i]) * c[i] + to_f(xr[i + half]) * s[i]);
        for (int64_t i = half + i0; i < rot; ++i) orow[i] = from_f<storage_t<T>>(to_f(xr[i]) * c[i] + to_f(xr[i - half]) * s[i]);
        for (int64_t i = rot; i < D; ++i) orow[i] = xr[i];
      }
    }
  });
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t rot) {
  check_cpu_float(x, "x");
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1, "x must be [T, H, D] with contiguous D");
  TORCH_CHECK(rot > 0 && rot % 2 == 0 && rot <= x.size(2), "rot must be even and <= head_dim");
  for (const at::Tensor* t : {&cos, &sin}) {
    TORCH_CHECK(t->dim() == 2 && t->size(0) == x.size(0) && t->size(1) == rot && t->stride(1) == 1 &&
                    t->scalar_type() == x.scalar_type(),
                "cos / sin must be [T, rot] in x's dtype");
  }
  auto out = at::empty({x.size(0), x.size(1), x.size(2)}, x.options());
  if (x.scalar_type() == at::kFloat) {
    rope_impl<float>(x, cos, sin, rot, out);
  } else {
    rope_impl<at::BFloat16>(x, cos, sin, rot, out);
  }
  return out;
}

}  // namespace

#define SGL_STR2(x) #x
#define SGL_STR(x) SGL_STR2(x)
#if defined(SGLANG_CPU_ISA)
#define SGL_ISA_NAME SGL_STR(SGLANG_CPU_ISA)
#else
#define SGL_ISA_NAME "unnamed"
#endif
#if defined(SGLANG_CSRC_TAG)
#define SGL_CSRC_TAG SGL_STR(SGLANG_CSRC_TAG)
#else
#define SGL_CSRC_TAG ""
#endif

#if defined(SGLANG_WITH_AMX_SOURCE)
// prefill_attention_amx.cpp (built into the avx512bf16 build only)
bool prefill_attention_supported();
at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                             const std::optional<at::Tensor>& k_cache, const std::optional<at::Tensor>& v_cache,
                             const std::optional<at::Tensor>& prefix_slots, const std::optional<at::Tensor>& out);
#else
// builds without AMX do not compile prefill_attention_amx.cpp: the kernel is never available
bool prefill_attention_supported() { return false; }
at::Tensor prefill_attention(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                             const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                             const std::optional<at::Tensor>&, const std::optional<at::Tensor>&) {
  TORCH_CHECK(false, "prefill_attention: AMX is not available in the ", SGL_ISA_NAME, " build of the CPU kernels");
  return at::Tensor();
}
#endif

// prefill_attention_vec.cpp (every build; its AVX2 / AVX-512 paths where the build has them)
bool prefill_attention_vec_supported();
at::Tensor prefill_attention_vec(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                 const std::optional<at::Tensor>& k_cache, const std::optional<at::Tensor>& v_cache,
                                 const std::optional<at::Tensor>& prefix_slots, const std::optional<at::Tensor>& out,
                                 double k_scale, double v_scale, bool bf16_dot);

// linear_f32out_packed.cpp (every build): x . W^T in float32 from a packed bf16 weight
at::Tensor linear_f32out_packed(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                                const std::optional<at::Tensor>& bias);

// int8_linear.cpp (every build): W8A8-INT8 linear on a weight packed by pack_int8_vnni
std::string int8_linear_impl();
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& comp, const at::Tensor& ws,
                       int64_t N, const std::optional<at::Tensor>& bias, bool swiglu);
std::string int8_linear_vnni_impl();
// bf16_linear.cpp (every build; "" / refused without AVX512-BF16): bf16 linear at decode-sized M
std::string bf16_linear_impl();
at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N, const std::optional<at::Tensor>& bias,
                       bool use_amx, bool swiglu);
at::Tensor bf16_linear_f32out(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                              const std::optional<at::Tensor>& bias);
at::Tensor int8_linear_vnni(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& comp,
                            const at::Tensor& ws, int64_t N, const std::optional<at::Tensor>& bias, bool swiglu);
// kv_store.cpp: one layer's K / V rows of n tokens into its head-major pool buffers at their slots
void kv_store(at::Tensor& k_buf, at::Tensor& v_buf, const at::Tensor& loc, const at::Tensor& k, const at::Tensor& v);

// The compute kernels run without the GIL (tensors are converted before, results after): another
// Python thread of the process (HiCache's storage prefetch, the KV warmer) runs while a kernel does.
// Holding it, a prefetch thread's page (60 torch calls) waited on the forward's kernels: 27.7 ms a
// page in the server against 0.81 ms alone (docs/notes/2026-11-hicache.md).
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto kNoGil = py::call_guard<py::gil_scoped_release>();
  m.def("isa", []() { return std::string(SGL_ISA_NAME); }, "the build (ISA name, kernels/cpu/isa.py) this module is");
  m.def("source_tag", []() { return std::string(SGL_CSRC_TAG); }, "hash of the csrc files it was built from");
  m.def("decode_attention", &decode_attention,
        "decode attention over a head-major KV pool, in place; an FP8 pool (float8_e4m3fn / float8_e5m2) is "
        "widened as read, times k_scale / v_scale; bf16_dot: a bf16 q on a bf16 or FP8 pool (rows widened to bf16, "
        "exact) of head dim 64 / 128 takes q.k and p.v by vdpbf16ps, p rounded to bf16 (avx512bf16 build; elsewhere "
        "ignored)",
        py::arg("q"), py::arg("k_buf"), py::arg("v_buf"), py::arg("slots"), py::arg("lens"), py::arg("scale"),
        py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0, py::arg("bf16_dot") = false, kNoGil);
  m.def("kv_store", &kv_store, "one layer's K / V rows of n tokens into its head-major pool buffers at their slots",
        py::arg("k_buf"), py::arg("v_buf"), py::arg("loc"), py::arg("k"), py::arg("v"), kNoGil);
  m.def("rms_norm", &rms_norm, "RMSNorm", kNoGil);
  m.def("add_rms_norm", &add_rms_norm, "residual add + RMSNorm -> (normed, new residual)", kNoGil);
  m.def("silu_and_mul", &silu_and_mul, "SwiGLU gate", kNoGil);
  m.def("rope", &rope, "neox rotary embedding", kNoGil);
  m.def("prefill_attention_supported", &prefill_attention_supported, "whether prefill_attention runs here (AMX)");
  m.def("prefill_attention", &prefill_attention,
        "causal attention of one sequence's new tokens on AMX (bf16, head dim 64), over an optional cached prefix",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scale"), py::arg("k_cache") = py::none(),
        py::arg("v_cache") = py::none(), py::arg("prefix_slots") = py::none(), py::arg("out") = py::none(), kNoGil);
  m.def("linear_f32out_packed", &linear_f32out_packed,
        "float32 x [n, K] . W [N, K]^T (+ bias) in float32, W bf16 packed by pack_bf16_pairs (int32 [ceil(N/32), K, 16])",
        py::arg("x"), py::arg("packed"), py::arg("N"), py::arg("bias") = py::none(), kNoGil);
  m.def("bf16_linear_impl", &bf16_linear_impl, "the path bf16_linear runs here: amx, avx512-bf16, or '' (none)");
  m.def("bf16_linear", &bf16_linear,
        "bf16 x [M, K] . W [N, K]^T (+ bias) in bf16 for few rows, W packed by pack_bf16_kpairs (int32 "
        "[ceil(N/16), ceil(K/32)*16, 16], kNoGil); use_amx=False: the vdpbf16ps path on AMX CPUs too; swiglu: "
        "a [gate; up] weight, out [M, N / 2] = silu(gate) * up",
        py::arg("x"), py::arg("packed"), py::arg("N"), py::arg("bias") = py::none(), py::arg("use_amx") = true,
        py::arg("swiglu") = false, kNoGil);
  m.def("bf16_linear_f32out", &bf16_linear_f32out,
        "float32 x [M, K] . W [N, K]^T (+ float32 bias) in float32 on AMX, W bf16 packed by pack_bf16_kpairs (x split "
        "exactly into three bf16 planes: exact products, float32 sums, kNoGil); refused without AMX",
        py::arg("x"), py::arg("packed"), py::arg("N"), py::arg("bias") = py::none(), kNoGil);
  m.def("int8_linear_impl", &int8_linear_impl, "the product path int8_linear runs in this build");
  m.def("int8_linear", &int8_linear,
        "W8A8-INT8 linear: x [M, K] (float32 / bf16) quantized per row, times the int8 weight packed by "
        "pack_int8_vnni, scaled by the row and weight scales (+ bias of x's dtype), in x's dtype; swiglu: a "
        "[gate; up] weight, out [M, N / 2] = silu(gate) * up (bf16 x)",
        py::arg("x"), py::arg("packed"), py::arg("comp"), py::arg("weight_scale"), py::arg("N"),
        py::arg("bias") = py::none(), py::arg("swiglu") = false, kNoGil);
  if (!int8_linear_vnni_impl().empty()) {  // the avx512 / avx2 builds' VNNI copy
    m.def("int8_linear_vnni_impl", &int8_linear_vnni_impl, "the product path int8_linear_vnni runs");
    m.def("int8_linear_vnni", &int8_linear_vnni,
          "int8_linear compiled for AVX512-VNNI / AVX-VNNI (the avx512vnni / avx2vnni ISAs, kNoGil); refused on CPUs "
          "without them",
          py::arg("x"), py::arg("packed"), py::arg("comp"), py::arg("weight_scale"), py::arg("N"),
          py::arg("bias") = py::none(), py::arg("swiglu") = false, kNoGil);
  }
  m.def("prefill_attention_vec_supported", &prefill_attention_vec_supported,
        "whether prefill_attention_vec runs in this build (AVX2 / AVX-512)");
  m.def("prefill_attention_vec", &prefill_attention_vec,
        "causal attention of one sequence's new tokens in float32 on AVX2 / AVX-512 (float32 or bf16, head dim 64 "
        "or 128), over an optional cached prefix (of q's dtype, or FP8 widened times k_scale / v_scale, kNoGil); bf16_dot: "
        "bf16 q / k over a bf16 or FP8 cache (its rows widened times their scales, rounded to bf16) scored by "
        "vdpbf16ps where the build has AVX512-BF16 (ignored elsewhere)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scale"), py::arg("k_cache") = py::none(),
        py::arg("v_cache") = py::none(), py::arg("prefix_slots") = py::none(), py::arg("out") = py::none(),
        py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0, py::arg("bf16_dot") = false);
}
