// int8_linear: the W8A8-INT8 linear in one call (layers/quantization/w8a8_int8.py defines it):
//   x [M, K] (float32 / bf16) quantized per row: s = amax|x| / 127 (1 for a zero row),
//   q = clamp(round_half_even(x / s), -127, 127); acc[m, n] = sum_k q[m, k] * W[n, k] in int32;
//   out[m, n] = dtype(float(acc) * s[m] * ws[n]) (+ bias, added in x's dtype), written in x's dtype.
//
// The weight is packed once at load (pack_int8_vnni, w8a8_int8.py): blocks of 16 output columns,
// in each block groups of 4 consecutive k with the 16 columns' 4 bytes side by side (one 64-byte
// vector per k group), K padded to a multiple of 4 and N to a multiple of 16 with zeros; `comp`
// [Np] int32 = 128 * sum_k W[n, k] and `ws` [Np] float32 the scales (padding 0).
//
// The products, per build:
//   avx512bf16 (AVX512-VNNI): vpdpbusd on u8 = q + 128 and the s8 weights, minus comp (exact);
//   avx512 (no VNNI) / avx2: vpmaddubsw on |W| (u8 <= 128) and q * sign(W) (s8, |.| <= 127), so a
//     pair sums to at most 32512 (no saturation), then vpmaddwd by ones into int32;
//   portable: int32 loops.
// Tiles of up to 4 rows of x times NB blocks (16 * NB columns); tasks are column ranges (times row
// chunks for large M), split over the OpenMP threads, so a decode call reads every weight byte once
// for all its rows. The epilogue follows the reference's float order ((acc * s) * ws, rounded to the
// dtype, then + bias and rounded again); the file is compiled without FMA contraction.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#pragma GCC optimize("fp-contract=off")

namespace {

constexpr int64_t kLanes = 16;  // output columns per packed block
constexpr int kMaxRows = 4;     // rows of x per tile
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
constexpr bool kUnsignedX = true;  // q + 128 as u8 (vpdpbusd), comp subtracted
constexpr const char* kImpl = "avx512-vnni";
#elif defined(__AVX512F__) && defined(__AVX512BW__)
constexpr bool kUnsignedX = false;
constexpr const char* kImpl = "avx512-maddubs";
#elif defined(__AVX2__) && defined(__FMA__)
constexpr bool kUnsignedX = false;
constexpr const char* kImpl = "avx2-maddubs";
#else
constexpr bool kUnsignedX = false;
constexpr const char* kImpl = "portable";
#endif

inline float to_f(float v) { return v; }
inline float to_f(uint16_t v) {
  const uint32_t b = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
inline uint32_t f_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
// float32 -> bf16 bits, round to nearest even (torch's), NaN -> quiet NaN
inline uint16_t bf16_round(float f) {
  const uint32_t u = f_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline float round_to(float v, float*) { return v; }
inline float round_to(float v, uint16_t*) { return from_bits(static_cast<uint32_t>(bf16_round(v)) << 16); }
inline void put(float* p, float v) { *p = v; }
inline void put(uint16_t* p, float v) { *p = bf16_round(v); }

// ---------------------------------------------------------------------------------- quantization
// amax of |row| (exact in any order: max)
template <typename T>
float row_amax(const T* x, int64_t K) {
  int64_t k = 0;
  float m = 0.f;
#if defined(__AVX512F__)
  __m512 v = _mm512_setzero_ps();
  for (; k + 16 <= K; k += 16) {
    __m512 a;
    if constexpr (sizeof(T) == 4) {
      a = _mm512_loadu_ps(reinterpret_cast<const float*>(x + k));
    } else {
      a = _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + k))), 16));
    }
    v = _mm512_max_ps(v, _mm512_abs_ps(a));
  }
  m = _mm512_reduce_max_ps(v);
#endif
  for (; k < K; ++k) m = std::max(m, std::fabs(to_f(x[k])));
  return m;
}

// q = clamp(rint(x / s), +-127) as int8, or its u8 + 128 for VNNI; the K..Kp padding is q = 0
template <typename T>
void quantize_row(const T* x, int64_t K, int64_t Kp, float s, uint8_t* q) {
  const uint8_t bias = kUnsignedX ? 128 : 0;
  int64_t k = 0;
#if defined(__AVX512F__)
  const __m512 vs = _mm512_set1_ps(s);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127), off = _mm512_set1_epi8(bias);
  for (; k + 16 <= K; k += 16) {
    __m512 a;
    if constexpr (sizeof(T) == 4) {
      a = _mm512_loadu_ps(reinterpret_cast<const float*>(x + k));
    } else {
      a = _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + k))), 16));
    }
    __m512i r = _mm512_cvtps_epi32(_mm512_div_ps(a, vs));  // MXCSR: round to nearest even
    r = _mm512_min_epi32(_mm512_max_epi32(r, lo), hi);
    const __m128i b = _mm_add_epi8(_mm512_cvtepi32_epi8(r), _mm512_castsi512_si128(off));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k), b);
  }
#endif
  for (; k < K; ++k) {
    float r = std::nearbyint(to_f(x[k]) / s);
    r = std::min(127.f, std::max(-127.f, r));
    q[k] = static_cast<uint8_t>(static_cast<int8_t>(r)) + bias;
  }
  for (; k < Kp; ++k) q[k] = bias;
}

// ------------------------------------------------------------------------------------ int32 tiles
// acc[i][b * 16 + l] = sum over the k groups of x row i . column (b0 + b) * 16 + l
template <int RI, int NB>
inline __attribute__((always_inline)) void tile(const uint8_t* xq, int64_t Kp, const int8_t* w, int64_t b0,
                                                int32_t (*acc)[NB * kLanes]) {
  const int64_t groups = Kp / 4, bstride = Kp * kLanes;
#if defined(__AVX512F__)
  __m512i a[RI][NB];
  for (int i = 0; i < RI; ++i)
    for (int b = 0; b < NB; ++b) a[i][b] = _mm512_setzero_si512();
#if !defined(__AVX512VNNI__)
  const __m512i ones = _mm512_set1_epi16(1);
  const __m512i zero = _mm512_setzero_si512();
#endif
  for (int64_t g = 0; g < groups; ++g) {
    __m512i wv[NB];
    for (int b = 0; b < NB; ++b) wv[b] = _mm512_loadu_si512(w + (b0 + b) * bstride + g * 64);
#if defined(__AVX512VNNI__)
    for (int i = 0; i < RI; ++i) {
      int32_t xi;
      std::memcpy(&xi, xq + i * Kp + g * 4, 4);
      const __m512i xb = _mm512_set1_epi32(xi);
      for (int b = 0; b < NB; ++b) a[i][b] = _mm512_dpbusd_epi32(a[i][b], xb, wv[b]);
    }
#else
    __m512i wabs[NB];
    __mmask64 neg[NB];
    for (int b = 0; b < NB; ++b) {
      wabs[b] = _mm512_abs_epi8(wv[b]);
      neg[b] = _mm512_movepi8_mask(wv[b]);
    }
    for (int i = 0; i < RI; ++i) {
      int32_t xi;
      std::memcpy(&xi, xq + i * Kp + g * 4, 4);
      const __m512i xb = _mm512_set1_epi32(xi);
      for (int b = 0; b < NB; ++b) {
        const __m512i xs = _mm512_mask_sub_epi8(xb, neg[b], zero, xb);
        const __m512i p = _mm512_madd_epi16(_mm512_maddubs_epi16(wabs[b], xs), ones);
        a[i][b] = _mm512_add_epi32(a[i][b], p);
      }
    }
#endif
  }
  for (int i = 0; i < RI; ++i)
    for (int b = 0; b < NB; ++b) _mm512_storeu_si512(acc[i] + b * kLanes, a[i][b]);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256i a[RI][2 * NB];
  for (int i = 0; i < RI; ++i)
    for (int v = 0; v < 2 * NB; ++v) a[i][v] = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < groups; ++g) {
    __m256i wv[2 * NB], wabs[2 * NB];
    for (int v = 0; v < 2 * NB; ++v) {
      wv[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (b0 + v / 2) * bstride + g * 64 + (v % 2) * 32));
      wabs[v] = _mm256_abs_epi8(wv[v]);
    }
    for (int i = 0; i < RI; ++i) {
      int32_t xi;
      std::memcpy(&xi, xq + i * Kp + g * 4, 4);
      const __m256i xb = _mm256_set1_epi32(xi);
      for (int v = 0; v < 2 * NB; ++v) {
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs[v], _mm256_sign_epi8(xb, wv[v])), ones);
        a[i][v] = _mm256_add_epi32(a[i][v], p);
      }
    }
  }
  for (int i = 0; i < RI; ++i)
    for (int v = 0; v < 2 * NB; ++v) _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc[i] + v * 8), a[i][v]);
#else
  for (int i = 0; i < RI; ++i)
    for (int l = 0; l < NB * kLanes; ++l) acc[i][l] = 0;
  for (int b = 0; b < NB; ++b) {
    const int8_t* wb = w + (b0 + b) * bstride;
    for (int64_t g = 0; g < groups; ++g) {
      const int8_t* wg = wb + g * 64;
      for (int i = 0; i < RI; ++i) {
        const int8_t* xg = reinterpret_cast<const int8_t*>(xq + i * Kp + g * 4);
        int32_t* ai = acc[i] + b * kLanes;
        for (int l = 0; l < kLanes; ++l)
          for (int j = 0; j < 4; ++j) ai[l] += static_cast<int32_t>(xg[j]) * wg[l * 4 + j];
      }
    }
  }
#endif
}

// ------------------------------------------------------------------------------------ epilogue
struct Args {
  const uint8_t* xq;
  const float* xs;
  const int8_t* w;
  const int32_t* comp;
  const float* ws;
  int64_t M, N, Kp;
};

template <typename T>
inline void epilogue(const int32_t* acc, const int32_t* comp, float s, const float* ws, const T* bias, T* out,
                     int64_t n) {
  T* tag = nullptr;
  if (n == kLanes) {
    float v[kLanes];
    for (int l = 0; l < kLanes; ++l) v[l] = static_cast<float>(acc[l] - (kUnsignedX ? comp[l] : 0)) * s * ws[l];
    if (bias != nullptr)
      for (int l = 0; l < kLanes; ++l) v[l] = round_to(v[l], tag) + to_f(bias[l]);
    for (int l = 0; l < kLanes; ++l) put(out + l, v[l]);
    return;
  }
  for (int64_t l = 0; l < n; ++l) {
    float v = static_cast<float>(acc[l] - (kUnsignedX ? comp[l] : 0)) * s * ws[l];
    if (bias != nullptr) v = round_to(v, tag) + to_f(bias[l]);
    put(out + l, v);
  }
}

template <int RI, int NB, typename T>
void run_tile(const Args& g, int64_t i0, int64_t b0, const T* bias, T* out) {
  alignas(64) int32_t acc[RI][NB * kLanes];
  tile<RI, NB>(g.xq + i0 * g.Kp, g.Kp, g.w, b0, acc);
  for (int i = 0; i < RI; ++i)
    for (int b = 0; b < NB; ++b) {
      const int64_t c0 = (b0 + b) * kLanes;
      if (c0 >= g.N) break;
      epilogue(acc[i] + b * kLanes, g.comp + c0, g.xs[i0 + i], g.ws + c0, bias ? bias + c0 : nullptr,
               out + (i0 + i) * g.N + c0, std::min<int64_t>(kLanes, g.N - c0));
    }
}

template <int NB, typename T>
void rows(const Args& g, int64_t r0, int64_t r1, int64_t b0, const T* bias, T* out) {
  int64_t i = r0;
  for (; i + kMaxRows <= r1; i += kMaxRows) run_tile<kMaxRows, NB>(g, i, b0, bias, out);
  switch (r1 - i) {
    case 3: return run_tile<3, NB>(g, i, b0, bias, out);
    case 2: return run_tile<2, NB>(g, i, b0, bias, out);
    case 1: return run_tile<1, NB>(g, i, b0, bias, out);
    default: return;
  }
}

template <typename T>
void gemm(const Args& g, const T* bias, T* out) {
  const int64_t blocks = (g.N + kLanes - 1) / kLanes;
  const int64_t threads = at::get_num_threads();
  constexpr int64_t kChunk = 64;  // rows per task when M is large
  const int64_t chunks = (g.M + kChunk - 1) / kChunk;
  int64_t nb = 4;
  while (nb > 1 && ((blocks + nb - 1) / nb) * chunks < 8 * threads) nb /= 2;
  const int64_t col_tasks = (blocks + nb - 1) / nb;
  // task t: column task t / chunks, row chunk t % chunks (a thread keeps its weight panel hot)
  at::parallel_for(0, col_tasks * chunks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b0 = (t / chunks) * nb, r0 = (t % chunks) * kChunk, r1 = std::min(g.M, r0 + kChunk);
      const int64_t left = blocks - b0;
      if (nb == 4 && left >= 4) {
        rows<4>(g, r0, r1, b0, bias, out);
      } else if (nb >= 2 && left >= 2) {
        rows<2>(g, r0, r1, b0, bias, out);
        if (nb == 4 && left > 2) rows<1>(g, r0, r1, b0 + 2, bias, out);
      } else {
        rows<1>(g, r0, r1, b0, bias, out);
      }
    }
  });
}

template <typename T>
void quantize(const T* x, int64_t sx, int64_t M, int64_t K, int64_t Kp, uint8_t* q, float* xs) {
  auto body = [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const float amax = row_amax(x + m * sx, K);
      const float s = amax > 0.f ? amax / 127.f : 1.f;
      xs[m] = s;
      quantize_row(x + m * sx, K, Kp, s, q + m * Kp);
    }
  };
  if (M * K < 65536) {
    body(0, M);  // one parallel region per call at decode sizes
  } else {
    at::parallel_for(0, M, std::max<int64_t>(1, 16384 / K), body);
  }
}

template <typename T>
void run(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& comp, const at::Tensor& ws,
         const std::optional<at::Tensor>& bias, at::Tensor& out, int64_t N, int64_t Kp) {
  const int64_t M = x.size(0), K = x.size(1);
  std::vector<uint8_t> q(static_cast<size_t>(M * Kp));
  std::vector<float> xs(static_cast<size_t>(M));
  const T* xp = reinterpret_cast<const T*>(x.data_ptr());
  quantize(xp, x.stride(0), M, K, Kp, q.data(), xs.data());
  const Args g{q.data(), xs.data(), packed.data_ptr<int8_t>(), comp.data_ptr<int32_t>(), ws.data_ptr<float>(),
               M, N, Kp};
  const T* bp = bias.has_value() ? reinterpret_cast<const T*>(bias->data_ptr()) : nullptr;
  gemm(g, bp, reinterpret_cast<T*>(out.data_ptr()));
}

}  // namespace

std::string int8_linear_impl() { return kImpl; }

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& comp, const at::Tensor& ws,
                       int64_t N, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu(), "int8_linear: tensors must be on the CPU");
  TORCH_CHECK((x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) && x.dim() == 2 && x.stride(1) == 1,
              "int8_linear: x must be a float32 / bfloat16 [M, K] tensor with contiguous rows");
  const int64_t K = x.size(1), Kp = (K + 3) / 4 * 4, blocks = (N + kLanes - 1) / kLanes;
  TORCH_CHECK(packed.scalar_type() == at::kChar && packed.is_contiguous() && packed.numel() == blocks * Kp * kLanes,
              "int8_linear: packed must be the contiguous int8 [ceil(N / 16), ceil(K / 4), 16, 4] of pack_int8_vnni");
  TORCH_CHECK(comp.scalar_type() == at::kInt && comp.is_contiguous() && comp.numel() == blocks * kLanes,
              "int8_linear: comp must be a contiguous int32 [ceil(N / 16) * 16] tensor");
  TORCH_CHECK(ws.scalar_type() == at::kFloat && ws.is_contiguous() && ws.numel() == blocks * kLanes,
              "int8_linear: weight_scale must be a contiguous float32 [ceil(N / 16) * 16] tensor");
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == x.scalar_type() && bias->dim() == 1 && bias->size(0) == N &&
                    bias->is_contiguous(),
                "int8_linear: bias must be a contiguous [N] tensor of x's dtype");
  }
  auto out = at::empty({x.size(0), N}, x.options());
  if (x.size(0) == 0 || N == 0) return out;
  if (x.scalar_type() == at::kFloat) {
    run<float>(x, packed, comp, ws, bias, out, N, Kp);
  } else {
    run<uint16_t>(x, packed, comp, ws, bias, out, N, Kp);
  }
  return out;
}
