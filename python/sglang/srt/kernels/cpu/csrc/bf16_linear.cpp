// bf16_linear: y [M, N] = x [M, K] . W [N, K]^T (+ bias) for bf16 x / W / y, W packed
// once by pack_bf16_kpairs (layers/linear_bf16_packed.py): int32 [ceil(N / 16), Kp / 2, 16], Kp = K
// rounded up to 32; in block b, row p holds columns 16b .. 16b + 15, each as the bf16 pair
// (k = 2p in the low half, 2p + 1 in the high half); padding is zero. That is both the B operand of
// an AMX-BF16 tile (16 k pairs x 64 bytes) and one vdpbf16ps operand per k pair.
//
// Every weight byte is read once per call for all rows (oneDNN's packed bf16 linear reads the
// weights at about half the bandwidth at 1-16 rows: docs/notes/2026-11-step-breakdown.md). Products
// are exact in float32, summed in float32, + bias in float32, rounded to bf16 once.
//   AMX (CPUs with AMX-BF16, use_amx): tiles of 16 (or 32) rows x 2 column blocks, tdpbf16ps; x
//     read in place where K is a multiple of 32 (decode sizes and prefill chunks alike).
//   vector: tiles of up to 4 rows x 4 column blocks, vdpbf16ps (AVX512-BF16 without AMX); in the
//     avx512 build (AVX-512 without BF16) the same tiles with each weight pair widened to float32 by
//     a shift and a mask and two FMAs per row, on x widened once per call (bf16_linear_impl()
//     "avx512-fma"): weights still read once per call, as bf16.
//   avx2 build ("avx2-fma"): the same widening on each block's two 8-lane halves, in tiles of 2 rows
//     x 2 column blocks (16 ymm: 8 accumulators, 4 x broadcasts, the widened pair).
// The portable build answers bf16_linear_impl() == "" and refuses the call.
// swiglu (both paths): a [gate; up] weight's tiles pair gate block j with up block j + N / 32, and
// the epilogue stores silu(gate) * up (silu_vec.h) of the bf16 values the plain call would store:
// [M, N / 2] (layers/linear_bf16_packed.py `Bf16PackedLinear.swiglu`).
//
// bf16_linear_f32out (AMX only): float32 x and output on the same packed weight (the LM head at
// float32 precision, layers/linear_float32_out.py): x split exactly into three bf16 planes, each
// plane's products by tdpbf16ps into one float32 accumulator per block, three blocks per k step
// sharing the planes' A tiles; the weight read once per call for up to 16 rows.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512BW__)
#include <immintrin.h>

#include "bf16_lanes.h"
#include "vec_exp2.h"  // before silu_vec.h, which uses it
#include "silu_vec.h"
#define SGL_BF16_LINEAR 1
#if defined(__AVX512BF16__)
#define SGL_BF16_DOT 1  // vdpbf16ps; without it (the avx512 build) each pair is widened by shifts
#endif
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "bf16_lanes.h"
#include "vec_exp2.h"  // before silu_vec.h, which uses it
#include "silu_vec.h"
#define SGL_BF16_LINEAR_AVX2 1  // the avx2 build: 8-lane halves of each block, widened by shifts
#endif
#if defined(SGL_BF16_DOT) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "amx_tiles.h"
#define SGL_BF16_LINEAR_AMX 1
#endif

namespace {
#if defined(SGL_BF16_LINEAR) || defined(SGL_BF16_LINEAR_AVX2)
constexpr int64_t kLanes = 16;  // output columns per packed block
constexpr int64_t kKAlign = 32;  // Kp: K rounded up to one AMX tile row of bf16

struct Args {
  const uint16_t* x;  // [rows, Kp], zero past K (and past M up to rows); AMX: rows [0, full) at stride ldx
  const uint32_t* w;  // packed
  const uint16_t* bias;
  uint16_t* out;  // [M, N]
  int64_t M, N, Kp, blocks;
  int64_t ldx = 0, full = 0;  // AMX: x's row stride (elements) and its rows read in place
  const uint16_t* tail = nullptr;  // AMX: rows [full, M) zero-padded to whole 16-row tiles, stride Kp
  int64_t ldo = 0;  // the output's row stride: N, or N / 2 under the SwiGLU epilogue
  int64_t half = 0;  // the SwiGLU epilogue ([gate; up] weight): N / 32 blocks a half; else 0
  const float* xf = nullptr;  // the avx512 / avx2 builds: x widened to float32, [M, Kp], zero past K
};
#endif

#if defined(SGL_BF16_LINEAR)

// the 16 rows of x from row r (a multiple of 16) as an A tile source, and its stride in bytes
inline const uint16_t* a_rows(const Args& g, int64_t r, int64_t& stride) {
  if (r < g.full) {
    stride = g.ldx * 2;
    return g.x + r * g.ldx;
  }
  stride = g.Kp * 2;
  return g.tail + (r - g.full) * g.Kp;
}

inline __m512 bias16(const uint16_t* bias, int64_t c0, __mmask16 m) {
  if (bias == nullptr) return _mm512_setzero_ps();
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, bias + c0)), 16));
}
inline __mmask16 lanes(int64_t n) {
  return n >= kLanes ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}
// v's 16 lanes rounded to bf16 bits, to nearest even: vcvtneps2bf16, or without AVX512-BF16 the
// same by integer ops (bf16_lanes.h)
inline __m256i round_bf16(__m512 v) {
#if defined(SGL_BF16_DOT)
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
#else
  return sgl_vec::f_to_bf16_16(v);
#endif
}
inline void store_bf16(uint16_t* p, __m512 v, __mmask16 m) { _mm256_mask_storeu_epi16(p, m, round_bf16(v)); }

// v rounded to bf16 as the plain output stores it, kept in float32
inline __m512 as_bf16(__m512 v) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(round_bf16(v)), 16)); }

// ----------------------------------------------------------------------------- vdpbf16ps tiles
// rows [i0, i0 + RI) x the NB column blocks bl[0 .. NB); under the SwiGLU epilogue the first NB / 2
// are gate blocks and the rest their up blocks (same order), and the tile stores silu(gate) * up
template <int RI, int NB>
void vec_tile(const Args& g, int64_t i0, const int64_t* bl) {
  const int64_t pairs = g.Kp / 2, bstride = pairs * kLanes;
  __m512 a[RI][NB];
  for (int i = 0; i < RI; ++i)
    for (int b = 0; b < NB; ++b) a[i][b] = _mm512_setzero_ps();
#if defined(SGL_BF16_DOT)
  const uint16_t* x = g.x + i0 * g.Kp;
  for (int64_t p = 0; p < pairs; ++p) {
    __m512i wv[NB];
    for (int b = 0; b < NB; ++b) wv[b] = _mm512_loadu_si512(g.w + bl[b] * bstride + p * kLanes);
    for (int i = 0; i < RI; ++i) {
      uint32_t xi;
      std::memcpy(&xi, x + i * g.Kp + 2 * p, 4);
      const __m512bh xb = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(xi)));
      for (int b = 0; b < NB; ++b) a[i][b] = _mm512_dpbf16_ps(a[i][b], xb, reinterpret_cast<__m512bh>(wv[b]));
    }
  }
#else
  // each packed pair widened by a shift (k = 2p, the low half) and a mask (k = 2p + 1), then two
  // float32 FMAs per row (bf16 products are exact in float32, as in vdpbf16ps)
  const float* x = g.xf + i0 * g.Kp;
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t p = 0; p < pairs; ++p) {
    __m512 wl[NB], wh[NB];
    for (int b = 0; b < NB; ++b) {
      const __m512i wv = _mm512_loadu_si512(g.w + bl[b] * bstride + p * kLanes);
      wl[b] = _mm512_castsi512_ps(_mm512_slli_epi32(wv, 16));
      wh[b] = _mm512_castsi512_ps(_mm512_and_si512(wv, hi_mask));
    }
    for (int i = 0; i < RI; ++i) {
      const __m512 xl = _mm512_set1_ps(x[i * g.Kp + 2 * p]), xh = _mm512_set1_ps(x[i * g.Kp + 2 * p + 1]);
      for (int b = 0; b < NB; ++b) a[i][b] = _mm512_fmadd_ps(xh, wh[b], _mm512_fmadd_ps(xl, wl[b], a[i][b]));
    }
  }
#endif
  if (g.half > 0) {  // whole blocks (N a multiple of 32): silu(gate) * up of the bf16-rounded values
    for (int b = 0; b < NB / 2; ++b) {
      const int64_t cg = bl[b] * kLanes, cu = bl[b + NB / 2] * kLanes;
      const __m512 bg = bias16(g.bias, cg, 0xFFFF), bu = bias16(g.bias, cu, 0xFFFF);
      for (int i = 0; i < RI; ++i) {
        const __m512 gv = as_bf16(_mm512_add_ps(a[i][b], bg)), uv = as_bf16(_mm512_add_ps(a[i][b + NB / 2], bu));
        store_bf16(g.out + (i0 + i) * g.ldo + cg, sgl_vec::silu_mul16(gv, uv), 0xFFFF);
      }
    }
    return;
  }
  for (int b = 0; b < NB; ++b) {
    const int64_t c0 = bl[b] * kLanes;
    const __mmask16 m = lanes(g.N - c0);
    const __m512 bv = bias16(g.bias, c0, m);
    for (int i = 0; i < RI; ++i) store_bf16(g.out + (i0 + i) * g.ldo + c0, _mm512_add_ps(a[i][b], bv), m);
  }
}

template <int NB>
void vec_rows(const Args& g, const int64_t* bl) {
  int64_t i = 0;
  for (; i + 4 <= g.M; i += 4) vec_tile<4, NB>(g, i, bl);
  switch (g.M - i) {
    case 3: return vec_tile<3, NB>(g, i, bl);
    case 2: return vec_tile<2, NB>(g, i, bl);
    case 1: return vec_tile<1, NB>(g, i, bl);
    default: return;
  }
}

// tasks of 4 column blocks (the SwiGLU epilogue: 2 gate blocks and their up blocks), all rows each
void gemm_vec(const Args& g) {
  const int64_t h = g.half, tasks = h > 0 ? (h + 1) / 2 : (g.blocks + 3) / 4;
  at::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (h > 0) {
        const int64_t b = 2 * t;
        const int64_t two[4] = {b, b + 1, b + h, b + 1 + h}, one[2] = {b, b + h};
        if (h - b >= 2) vec_rows<4>(g, two); else vec_rows<2>(g, one);
        continue;
      }
      const int64_t b0 = t * 4;
      if (g.blocks - b0 >= 4) {
        const int64_t bl[4] = {b0, b0 + 1, b0 + 2, b0 + 3};
        vec_rows<4>(g, bl);
      } else {
        for (int64_t b = b0; b < g.blocks; ++b) vec_rows<1>(g, &b);
      }
    }
  });
}

#endif  // SGL_BF16_LINEAR

#if defined(SGL_BF16_LINEAR_AVX2)
// ------------------------------------------------------------------- AVX2: 8-lane halves of a block
// 8 float32 lanes rounded to bf16 bits and widened back (bf16_lanes.h, as round_bf16 above)
using sgl_vec::bf16_bits_to_f;
using sgl_vec::f_to_bf16_bits;
inline __m256 as_bf16_8(__m256 v) { return bf16_bits_to_f(f_to_bf16_bits(v)); }

// a block's 16 bias values from column c0 (n of them real) as two halves
inline void bias_halves(const uint16_t* bias, int64_t c0, int64_t n, __m256 out[2]) {
  alignas(16) uint16_t tmp[16] = {};
  if (bias != nullptr) std::memcpy(tmp, bias + c0, static_cast<size_t>(std::min<int64_t>(n, kLanes)) * 2);
  out[0] = bf16_bits_to_f(_mm_load_si128(reinterpret_cast<const __m128i*>(tmp)));
  out[1] = bf16_bits_to_f(_mm_load_si128(reinterpret_cast<const __m128i*>(tmp + 8)));
}
inline void store_halves(uint16_t* p, const __m256 v[2], int64_t n) {
  alignas(16) uint16_t tmp[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(tmp), f_to_bf16_bits(v[0]));
  _mm_store_si128(reinterpret_cast<__m128i*>(tmp + 8), f_to_bf16_bits(v[1]));
  std::memcpy(p, tmp, static_cast<size_t>(std::min<int64_t>(n, kLanes)) * 2);
}

// rows [i0, i0 + RI) of x x the NB column blocks bl[0 .. NB) (under the SwiGLU epilogue NB = 2: a
// gate block and its up block): two FMAs per half per pair and row, on the pair widened by a shift
// (k = 2p) and a mask (k = 2p + 1) once for the RI rows
template <int RI, int NB>
void vec_tile8(const Args& g, int64_t i0, const int64_t* bl) {
  const int64_t pairs = g.Kp / 2, bstride = pairs * kLanes;
  __m256 a[RI][NB][2];
  for (int i = 0; i < RI; ++i)
    for (int b = 0; b < NB; ++b) a[i][b][0] = a[i][b][1] = _mm256_setzero_ps();
  const float* x = g.xf + i0 * g.Kp;
  const __m256i hi_mask = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t p = 0; p < pairs; ++p) {
    __m256 xl[RI], xh[RI];
    for (int i = 0; i < RI; ++i) {
      xl[i] = _mm256_broadcast_ss(x + i * g.Kp + 2 * p);
      xh[i] = _mm256_broadcast_ss(x + i * g.Kp + 2 * p + 1);
    }
    for (int b = 0; b < NB; ++b) {
      const uint32_t* w = g.w + bl[b] * bstride + p * kLanes;
      for (int h = 0; h < 2; ++h) {
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 8 * h));
        const __m256 wl = _mm256_castsi256_ps(_mm256_slli_epi32(wv, 16));
        const __m256 wh = _mm256_castsi256_ps(_mm256_and_si256(wv, hi_mask));
        for (int i = 0; i < RI; ++i) a[i][b][h] = _mm256_fmadd_ps(xh[i], wh, _mm256_fmadd_ps(xl[i], wl, a[i][b][h]));
      }
    }
  }
  __m256 bv[2], bu[2], v[2];
  if (g.half > 0) {  // NB == 2, whole blocks: silu(gate) * up of the bf16-rounded values
    const int64_t cg = bl[0] * kLanes, cu = bl[NB - 1] * kLanes;
    bias_halves(g.bias, cg, kLanes, bv);
    bias_halves(g.bias, cu, kLanes, bu);
    for (int i = 0; i < RI; ++i) {
      for (int h = 0; h < 2; ++h)
        v[h] = sgl_vec::silu_mul8_bf16(as_bf16_8(_mm256_add_ps(a[i][0][h], bv[h])),
                                       as_bf16_8(_mm256_add_ps(a[i][NB - 1][h], bu[h])));
      store_halves(g.out + (i0 + i) * g.ldo + cg, v, kLanes);
    }
    return;
  }
  for (int b = 0; b < NB; ++b) {
    const int64_t c0 = bl[b] * kLanes;
    bias_halves(g.bias, c0, g.N - c0, bv);
    for (int i = 0; i < RI; ++i) {
      for (int h = 0; h < 2; ++h) v[h] = _mm256_add_ps(a[i][b][h], bv[h]);
      store_halves(g.out + (i0 + i) * g.ldo + c0, v, g.N - c0);
    }
  }
}

// all rows, two at a time, of one tile of NB blocks
template <int NB>
void vec_rows8(const Args& g, const int64_t* bl) {
  int64_t i = 0;
  for (; i + 2 <= g.M; i += 2) vec_tile8<2, NB>(g, i, bl);
  if (i < g.M) vec_tile8<1, NB>(g, i, bl);
}

// tasks of 4 column blocks (the SwiGLU epilogue: 2 gate blocks and their up blocks), in tiles of 2
// blocks (a gate block and its up block) over all rows: a tile's weights (K x 64 bytes) stay in
// L1 / L2 between row pairs
void gemm_vec8(const Args& g) {
  const int64_t h = g.half, tasks = h > 0 ? (h + 1) / 2 : (g.blocks + 3) / 4;
  at::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (h > 0) {
        for (int64_t b = 2 * t; b < std::min(2 * t + 2, h); ++b) {
          const int64_t pair[2] = {b, b + h};
          vec_rows8<2>(g, pair);
        }
        continue;
      }
      int64_t b = t * 4;
      const int64_t end = std::min(b + 4, g.blocks);
      for (; b + 2 <= end; b += 2) {
        const int64_t two[2] = {b, b + 1};
        vec_rows8<2>(g, two);
      }
      if (b < end) vec_rows8<1>(g, &b);
    }
  });
}
#endif

#if defined(SGL_BF16_LINEAR)
// --------------------------------------------------------------------------------- AMX-BF16 tiles
#if defined(SGL_BF16_LINEAR_AMX)
// CPUID leaf 7 EDX bit 22 (AMX-BF16) and 24 (AMX-TILE), and the kernel's permission for the tile data
bool amx_bf16_ready() {
  static const bool ok = [] {
    unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    if ((edx & (1u << 22)) == 0 || (edx & (1u << 24)) == 0) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

// tile intrinsics are asm volatile without memory clobbers: fence the compiler around them
#define SGL_BF16_FENCE() asm volatile("" ::: "memory")

// an A tile: kept in L1 (decode sizes: each row tile meets every column block), or loaded with the
// streaming hint (prefill sizes: the weight's tiles, reused by the task's row tiles, stay in L1)
template <bool kStreamA>
inline void load_a(int tile, const uint16_t* p, int64_t stride) {
  if constexpr (kStreamA) {
    if (tile == 0) _tile_stream_loadd(0, p, stride); else _tile_stream_loadd(1, p, stride);
  } else {
    if (tile == 0) _tile_loadd(0, p, stride); else _tile_loadd(1, p, stride);
  }
}

// the SwiGLU epilogue of a 32-row x (gate block, up block) tile: silu(gate) * up on the values the
// plain call would store, so the same bits as bf16_linear then the kernels' silu_and_mul
void swiglu_rows(const Args& g, int64_t r0, int64_t b0, const float (*acc)[16 * 16]) {
  const int64_t cg = b0 * kLanes, cu = cg + g.half * kLanes;
  const __m512 bg = bias16(g.bias, cg, 0xFFFF), bu = bias16(g.bias, cu, 0xFFFF);
  for (int h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 16 && r0 + h * 16 + i < g.M; ++i) {
      const __m512 gv = as_bf16(_mm512_add_ps(_mm512_load_ps(acc[h] + i * 16), bg));
      const __m512 uv = as_bf16(_mm512_add_ps(_mm512_load_ps(acc[2 + h] + i * 16), bu));
      store_bf16(g.out + (r0 + h * 16 + i) * g.ldo + cg, sgl_vec::silu_mul16(gv, uv), 0xFFFF);
    }
}

// rows [r0, r0 + 32) of x (a second row tile past M is skipped) x blocks b0, b1 (b1: b0 + 1, past
// the last: skipped; under the SwiGLU epilogue b0's up block)
template <bool kStreamA>
void amx_tile(const Args& g, int64_t r0, int64_t b0, int64_t b1) {
  alignas(64) float acc[4][16 * 16];
  const int64_t bstride = g.Kp / 2 * kLanes;
  const bool two = b1 < g.blocks, low = r0 + 16 < g.M;
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  SGL_BF16_FENCE();
  int64_t s0 = 0, s1 = 0;
  const uint16_t* x0 = a_rows(g, r0, s0);
  const uint16_t* x1 = low ? a_rows(g, r0 + 16, s1) : x0;
  for (int64_t k0 = 0; k0 < g.Kp; k0 += kKAlign) {
    load_a<kStreamA>(0, x0 + k0, s0);
    _tile_loadd(2, g.w + b0 * bstride + k0 / 2 * kLanes, 64);
    _tile_dpbf16ps(4, 0, 2);
    if (low) {
      load_a<kStreamA>(1, x1 + k0, s1);
      _tile_dpbf16ps(5, 1, 2);
    }
    if (two) {
      _tile_loadd(3, g.w + b1 * bstride + k0 / 2 * kLanes, 64);
      _tile_dpbf16ps(6, 0, 3);
      if (low) _tile_dpbf16ps(7, 1, 3);
    }
  }
  _tile_stored(4, acc[0], 64);
  _tile_stored(5, acc[1], 64);
  _tile_stored(6, acc[2], 64);
  _tile_stored(7, acc[3], 64);
  SGL_BF16_FENCE();
  if (g.half > 0) return swiglu_rows(g, r0, b0, acc);
  const int64_t c0 = b0 * kLanes;
  if (two && g.N - c0 >= 2 * kLanes) {  // both blocks whole: one 64-byte row store
    const __m512 bv0 = bias16(g.bias, c0, 0xFFFF), bv1 = bias16(g.bias, c0 + kLanes, 0xFFFF);
    for (int h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 16 && r0 + h * 16 + i < g.M; ++i) {
        const __m512 lo = _mm512_add_ps(_mm512_load_ps(acc[h] + i * 16), bv0);
        const __m512 hi = _mm512_add_ps(_mm512_load_ps(acc[2 + h] + i * 16), bv1);
        _mm512_storeu_si512(g.out + (r0 + h * 16 + i) * g.ldo + c0,
                            reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
      }
    return;
  }
  for (int b = 0; b < (two ? 2 : 1); ++b) {
    const int64_t c0 = (b0 + b) * kLanes;
    const __mmask16 m = lanes(g.N - c0);
    const __m512 bv = bias16(g.bias, c0, m);
    for (int h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 16 && r0 + h * 16 + i < g.M; ++i)
        store_bf16(g.out + (r0 + h * 16 + i) * g.ldo + c0, _mm512_add_ps(_mm512_load_ps(acc[2 * b + h] + i * 16), bv),
                   m);
  }
}

// The tasks of an AMX GEMM: blocks of `rows_per_task` rows x groups of `per_group` column units
// (one unit per group at decode sizes, one row block then); a thread's tasks are consecutive, so its
// rows of x stay in L2 while the weights stream past (int8_linear's layout). Within a task, each
// row tile meets the group's units in turn (its A tiles stay in L1: a 2048-row, 3072-column call
// 5.2 -> 3.5 ms on [amx] against units outer). tile(r, u): rows [r, r + row_step) of column unit u.
template <typename Tile>
void amx_tasks(int64_t M, int64_t units, int64_t rows_per_task, int64_t per_group, int64_t row_step,
               const Tile& tile) {
  const int64_t row_blocks = (M + rows_per_task - 1) / rows_per_task;
  const int64_t per = row_blocks == 1 ? 1 : per_group, groups = (units + per - 1) / per;
  at::parallel_for(0, row_blocks * groups, 1, [&](int64_t t0, int64_t t1) {
    sgl_amx::configure_full_tiles();
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = (t / groups) * rows_per_task, r1 = std::min(M, r0 + rows_per_task);
      const int64_t u0 = (t % groups) * per, u1 = std::min(units, u0 + per);
      for (int64_t r = r0; r < r1; r += row_step)
        for (int64_t u = u0; u < u1; ++u) tile(r, u);
    }
    _tile_release();
  });
}

// units: pairs of neighbouring column blocks, or under the SwiGLU epilogue a gate block and its up
// block; 32-row tiles
void gemm_amx(const Args& g) {
  // unit u: blocks b0 = u * step and b0 + off
  const bool sw = g.half > 0;
  const int64_t units = sw ? g.half : (g.blocks + 1) / 2, step = sw ? 1 : 2, off = sw ? g.half : 1;
  if (g.M > 32)
    amx_tasks(g.M, units, 128, 8, 32, [&](int64_t r, int64_t u) { amx_tile<true>(g, r, u * step, u * step + off); });
  else
    amx_tasks(g.M, units, 128, 8, 32, [&](int64_t r, int64_t u) { amx_tile<false>(g, r, u * step, u * step + off); });
}

// ----------------------------------------------------- float32 x, float32 out (the LM head) on AMX
// x = hi + mid + lo exactly (three bf16 planes of 8 significant bits each cover float32's 24), each
// plane times W by tdpbf16ps into one float32 accumulator: every product is exact, the sums float32
// (as a float32 GEMM on the widened bf16 weight, up to the order of the sums).
struct F32Args {
  const uint16_t* planes;  // [3][rows][Kp]: hi, mid, lo
  const uint32_t* w;
  const float* bias;
  float* out;
  int64_t M, N, Kp, blocks, rows;
};

void split_row(const float* x, int64_t K, int64_t Kp, uint16_t* hi, uint16_t* mid, uint16_t* lo) {
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m512 v = _mm512_loadu_ps(x + k);
    const __m256i h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
    const __m512 r = _mm512_sub_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
    const __m256i m = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(r));
    const __m512 r2 = _mm512_sub_ps(r, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(m), 16)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + k), h);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(mid + k), m);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + k), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(r2)));
  }
  if (k < K) {  // the tail through a zero-padded vector
    alignas(64) float t[16] = {0};
    std::memcpy(t, x + k, static_cast<size_t>(K - k) * 4);
    alignas(32) uint16_t h[16], m[16], l[16];
    split_row(t, 16, 16, h, m, l);
    std::memcpy(hi + k, h, static_cast<size_t>(K - k) * 2);
    std::memcpy(mid + k, m, static_cast<size_t>(K - k) * 2);
    std::memcpy(lo + k, l, static_cast<size_t>(K - k) * 2);
  }
  for (uint16_t* p : {hi, mid, lo}) std::memset(p + K, 0, static_cast<size_t>(Kp - K) * 2);
}

// rows [r0, r0 + 16) x blocks b0 .. b0 + 2 (those past the last skipped): the three planes' A tiles
// are loaded once per k step for all three blocks, each block's planes summed into its own C tile,
// B tiles in two registers taken in turn
constexpr int64_t kF32Blocks = 3;
void amx_f32_tile(const F32Args& g, int64_t r0, int64_t b0) {
  alignas(64) float acc[kF32Blocks][16 * 16];
  const int64_t bstride = g.Kp / 2 * kLanes, plane = g.rows * g.Kp;
  const int64_t nb = std::min<int64_t>(kF32Blocks, g.blocks - b0);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  SGL_BF16_FENCE();
  const uint32_t* w = g.w + b0 * bstride;
  for (int64_t k0 = 0; k0 < g.Kp; k0 += kKAlign) {
    const uint16_t* a = g.planes + r0 * g.Kp + k0;
    const uint32_t* wk = w + k0 / 2 * kLanes;
    _tile_loadd(0, a, g.Kp * 2);
    _tile_loadd(1, a + plane, g.Kp * 2);
    _tile_loadd(2, a + 2 * plane, g.Kp * 2);
    _tile_loadd(3, wk, 64);
    _tile_dpbf16ps(5, 0, 3);
    _tile_dpbf16ps(5, 1, 3);
    _tile_dpbf16ps(5, 2, 3);
    if (nb > 1) {
      _tile_loadd(4, wk + bstride, 64);
      _tile_dpbf16ps(6, 0, 4);
      _tile_dpbf16ps(6, 1, 4);
      _tile_dpbf16ps(6, 2, 4);
    }
    if (nb > 2) {
      _tile_loadd(3, wk + 2 * bstride, 64);
      _tile_dpbf16ps(7, 0, 3);
      _tile_dpbf16ps(7, 1, 3);
      _tile_dpbf16ps(7, 2, 3);
    }
  }
  _tile_stored(5, acc[0], 64);
  _tile_stored(6, acc[1], 64);
  _tile_stored(7, acc[2], 64);
  SGL_BF16_FENCE();
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t c0 = (b0 + b) * kLanes;
    const __mmask16 m = lanes(g.N - c0);
    const __m512 bv = g.bias == nullptr ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, g.bias + c0);
    for (int64_t i = 0; i < 16 && r0 + i < g.M; ++i)
      _mm512_mask_storeu_ps(g.out + (r0 + i) * g.N + c0, m, _mm512_add_ps(_mm512_load_ps(acc[b] + i * 16), bv));
  }
}

void gemm_amx_f32(const F32Args& g) {  // units: column block triples, 16-row tiles
  // 64 rows a task: x's three planes stay in L2 while W streams past
  const int64_t triples = (g.blocks + kF32Blocks - 1) / kF32Blocks;
  amx_tasks(g.M, triples, 64, 16, 16, [&](int64_t r, int64_t p) { amx_f32_tile(g, r, p * kF32Blocks); });
}
#endif
#endif
}  // namespace

namespace {
// the packed weight's shape for x [M, K] and N outputs, and the bias (of bias_type, N values)
void check_packed(const char* name, const at::Tensor& x, const at::Tensor& packed, int64_t N,
                  const std::optional<at::Tensor>& bias, at::ScalarType bias_type) {
  const int64_t K = x.size(1), Kp = (K + 31) / 32 * 32, blocks = (N + 15) / 16;
  TORCH_CHECK(packed.scalar_type() == at::kInt && packed.is_contiguous() && packed.dim() == 3 &&
                  packed.size(0) == blocks && packed.size(1) == Kp / 2 && packed.size(2) == 16,
              name, ": packed must be pack_bf16_kpairs' int32 [ceil(N / 16), ceil(K / 32) * 16, 16] for N = ", N,
              ", K = ", K);
  if (bias.has_value())
    TORCH_CHECK(bias->scalar_type() == bias_type && bias->numel() == N && bias->is_contiguous(), name,
                ": bias must be a contiguous ", bias_type == at::kFloat ? "float32" : "bf16", " [N] tensor");
}
}  // namespace

#if defined(SGL_BF16_LINEAR_AVX2) || (defined(SGL_BF16_LINEAR) && !defined(SGL_BF16_DOT))
#define SGL_BF16_FMA 1  // the FMA paths (avx512 / avx2 builds)
namespace {
// x [M, K] (row stride ldx) widened to float32 once into a zero-padded scratch kept by the calling
// thread (K to Kp), then the build's FMA tiles
void gemm_widened(Args& g, const uint16_t* xp, int64_t ldx, int64_t K) {
  thread_local std::vector<float> widened;
  if (widened.size() < static_cast<size_t>(g.M * g.Kp)) widened.resize(static_cast<size_t>(g.M * g.Kp));
  for (int64_t i = 0; i < g.M; ++i) {
    float* row = widened.data() + i * g.Kp;
    for (int64_t k = 0; k < K; ++k) {
      const uint32_t bits = static_cast<uint32_t>(xp[i * ldx + k]) << 16;
      std::memcpy(row + k, &bits, 4);
    }
    std::fill(row + K, row + g.Kp, 0.f);
  }
  g.xf = widened.data();
#if defined(SGL_BF16_LINEAR_AVX2)
  gemm_vec8(g);
#else
  gemm_vec(g);
#endif
}
}  // namespace
#endif

std::string bf16_linear_impl() {
#if defined(SGL_BF16_LINEAR_AMX)
  if (amx_bf16_ready()) return "amx";
#endif
#if defined(SGL_BF16_DOT)
  return "avx512-bf16";
#elif defined(SGL_BF16_LINEAR)
  return "avx512-fma";
#elif defined(SGL_BF16_LINEAR_AVX2)
  return "avx2-fma";
#else
  return "";
#endif
}

at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N, const std::optional<at::Tensor>& bias,
                       bool use_amx, bool swiglu) {
  TORCH_CHECK(!bf16_linear_impl().empty(), "bf16_linear: this build of the CPU kernels has no AVX-512 / AVX2");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.stride(1) == 1,
              "bf16_linear: x must be a bf16 [M, K] tensor with contiguous rows");
  check_packed("bf16_linear", x, packed, N, bias, at::kBFloat16);
  TORCH_CHECK(!swiglu || N % 32 == 0,
              "bf16_linear: swiglu needs N a multiple of 32 (each half whole 16-column blocks), got N = ", N);
  const int64_t M = x.size(0), K = x.size(1), Kp = (K + 31) / 32 * 32, blocks = (N + 15) / 16;
  auto out = at::empty({M, swiglu ? N / 2 : N}, x.options());
#if defined(SGL_BF16_LINEAR) || defined(SGL_BF16_LINEAR_AVX2)
  if (M == 0 || N == 0) return out;
  bool amx = false;
#if defined(SGL_BF16_LINEAR_AMX)
  amx = use_amx && amx_bf16_ready();
#endif
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  Args g{nullptr,
         reinterpret_cast<const uint32_t*>(packed.data_ptr<int32_t>()),
         bias.has_value() ? reinterpret_cast<const uint16_t*>(bias->data_ptr()) : nullptr,
         reinterpret_cast<uint16_t*>(out.data_ptr()),
         M,
         N,
         Kp,
         blocks};
  g.ldo = out.size(1);
  g.half = swiglu ? N / (2 * kLanes) : 0;
#if defined(SGL_BF16_LINEAR_AMX)
  if (amx && K % kKAlign == 0) {
    // x read in place by whole 16-row groups (no copy of a prefill chunk); the last rows zero-padded
    // to one whole tile in a scratch kept by the calling thread
    const int64_t full = M / 16 * 16, left = M - full;
    thread_local std::vector<uint16_t> tail;
    if (tail.size() < static_cast<size_t>(16 * Kp)) tail.resize(static_cast<size_t>(16 * Kp));
    if (left > 0) std::memset(tail.data(), 0, static_cast<size_t>(16 * Kp) * 2);
    for (int64_t i = 0; i < left; ++i)
      std::memcpy(tail.data() + i * Kp, xp + (full + i) * x.stride(0), static_cast<size_t>(K) * 2);
    g.x = xp;
    g.ldx = x.stride(0);
    g.full = full;
    g.tail = tail.data();
    gemm_amx(g);
    return out;
  }
#endif
#if defined(SGL_BF16_FMA)
  (void)amx;
  gemm_widened(g, xp, x.stride(0), K);
#else
  // x copied into a zero-padded scratch kept by the calling thread: K to Kp, and for AMX the rows
  // to whole 16-row tiles
  const int64_t rows = amx ? (M + 15) / 16 * 16 : M;
  thread_local std::vector<uint16_t> scratch;
  if (scratch.size() < static_cast<size_t>(rows * Kp)) scratch.resize(static_cast<size_t>(rows * Kp));
  uint16_t* xs = scratch.data();
  for (int64_t i = 0; i < M; ++i) {
    std::memcpy(xs + i * Kp, xp + i * x.stride(0), static_cast<size_t>(K) * 2);
    std::memset(xs + i * Kp + K, 0, static_cast<size_t>(Kp - K) * 2);
  }
  std::memset(xs + M * Kp, 0, static_cast<size_t>((rows - M) * Kp) * 2);
  g.x = xs;
#if defined(SGL_BF16_LINEAR_AMX)
  if (amx) {
    g.ldx = Kp;
    g.full = rows;
    gemm_amx(g);
    return out;
  }
#endif
  gemm_vec(g);
#endif
#else
  (void)use_amx;
  (void)swiglu;
#endif
  return out;
}

at::Tensor bf16_linear_f32out(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                              const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(bf16_linear_impl() == "amx", "bf16_linear_f32out: needs AMX (this CPU / build: '", bf16_linear_impl(),
              "')");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.stride(1) == 1,
              "bf16_linear_f32out: x must be a float32 [M, K] tensor with contiguous rows");
  check_packed("bf16_linear_f32out", x, packed, N, bias, at::kFloat);
  const int64_t M = x.size(0), K = x.size(1), Kp = (K + 31) / 32 * 32, blocks = (N + 15) / 16;
  auto out = at::empty({M, N}, x.options());
#if defined(SGL_BF16_LINEAR_AMX)
  if (M == 0 || N == 0) return out;
  const int64_t rows = (M + 15) / 16 * 16;
  thread_local std::vector<uint16_t> scratch;
  const size_t plane = static_cast<size_t>(rows * Kp);
  if (scratch.size() < 3 * plane) scratch.resize(3 * plane);
  uint16_t* hi = scratch.data();
  const auto* xp = x.data_ptr<float>();
  for (int64_t i = 0; i < M; ++i)
    split_row(xp + i * x.stride(0), K, Kp, hi + i * Kp, hi + plane + i * Kp, hi + 2 * plane + i * Kp);
  for (int p = 0; p < 3; ++p) std::memset(hi + p * plane + M * Kp, 0, static_cast<size_t>((rows - M) * Kp) * 2);
  const F32Args g{hi,
                  reinterpret_cast<const uint32_t*>(packed.data_ptr<int32_t>()),
                  bias.has_value() ? bias->data_ptr<float>() : nullptr,
                  out.data_ptr<float>(),
                  M,
                  N,
                  Kp,
                  blocks,
                  rows};
  gemm_amx_f32(g);
#endif
  return out;
}
