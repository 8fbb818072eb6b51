// linear_f32out: out[n, N] = x[n, K] . w[N, K]^T (+ bias), accumulated and returned in float32 for
// float32 / bfloat16 x and w (bf16 widened by a shift, never rounded). Every weight row is read from
// memory once per call whatever n: the output is computed in register tiles of RJ weight rows x RI
// rows of x, the weight tile staying in L1 while every row tile of x passes over it. This is the
// memory-bound shape of an LM head at decode (n = the requests of a step, N = the vocabulary):
// float32 logits from a bf16 weight at the bytes of a bf16 GEMM (--enable-fp32-lm-head, on by
// default on CPU). Tiles: 4 x 4 on AVX-512 (16 accumulators of 16 lanes), 4 x 2 on AVX2 (8 of 8
// lanes: AVX2 has 16 registers), portable loops elsewhere. Reference: kernels/cpu/reference.py.

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace {

inline float to_float(float v) { return v; }
inline float to_float(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

#if defined(__AVX512F__)
constexpr int kLanes = 16, kMaxRowsX = 4;
using vec_t = __m512;
inline vec_t vzero() { return _mm512_setzero_ps(); }
inline vec_t vload(const float* p) { return _mm512_loadu_ps(p); }
inline vec_t vload(const uint16_t* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline vec_t vfma(vec_t a, vec_t b, vec_t c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(vec_t v) { return _mm512_reduce_add_ps(v); }
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kLanes = 8, kMaxRowsX = 2;
using vec_t = __m256;
inline vec_t vzero() { return _mm256_setzero_ps(); }
inline vec_t vload(const float* p) { return _mm256_loadu_ps(p); }
inline vec_t vload(const uint16_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
inline vec_t vfma(vec_t a, vec_t b, vec_t c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(vec_t v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#else
constexpr int kLanes = 0, kMaxRowsX = 4;
#endif
constexpr int kRowsW = 4;

// One tile: RI (<= kMaxRowsX) rows of x against rj (<= kRowsW) rows of w. Weight rows past rj read
// the tile's first row again (in bounds) and are not stored, so the vocabulary's tail needs no
// other code path; RI is a template argument so that a single decode row does no extra work.
template <int RI, typename TX, typename TW>
inline __attribute__((always_inline)) void tile(const TX* x, int64_t sx, const TW* w, int64_t sw, int rj, int64_t K, const float* bias, float* out,
          int64_t so) {
  constexpr int kRowsX = RI;
  const TX* xr[kRowsX];
  const TW* wr[kRowsW];
  for (int i = 0; i < kRowsX; ++i) xr[i] = x + i * sx;
  for (int r = 0; r < kRowsW; ++r) wr[r] = w + (r < rj ? r : 0) * sw;
  float s[kRowsX][kRowsW] = {};
  int64_t k = 0;
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  vec_t acc[kRowsX][kRowsW];
#pragma GCC unroll 4
  for (int i = 0; i < kRowsX; ++i)
#pragma GCC unroll 4
    for (int r = 0; r < kRowsW; ++r) acc[i][r] = vzero();
  for (; k + kLanes <= K; k += kLanes) {
    vec_t wv[kRowsW];
#pragma GCC unroll 4
    for (int r = 0; r < kRowsW; ++r) wv[r] = vload(wr[r] + k);
#pragma GCC unroll 4
    for (int i = 0; i < kRowsX; ++i) {
      const vec_t xv = vload(xr[i] + k);
#pragma GCC unroll 4
      for (int r = 0; r < kRowsW; ++r) acc[i][r] = vfma(xv, wv[r], acc[i][r]);
    }
  }
  for (int i = 0; i < kRowsX; ++i)
    for (int r = 0; r < kRowsW; ++r) s[i][r] = vsum(acc[i][r]);
#endif
  for (; k < K; ++k)
    for (int i = 0; i < kRowsX; ++i)
      for (int r = 0; r < kRowsW; ++r) s[i][r] += to_float(xr[i][k]) * to_float(wr[r][k]);
  for (int i = 0; i < kRowsX; ++i)
    for (int r = 0; r < rj; ++r) out[i * so + r] = s[i][r] + (bias ? bias[r] : 0.f);
}

// the rows of x left (ri of them, 1 <= ri <= kMaxRowsX) against one tile of weight rows
template <typename TX, typename TW>
void tile_rows(int ri, const TX* x, int64_t sx, const TW* w, int64_t sw, int rj, int64_t K, const float* bias,
               float* out, int64_t so) {
  switch (ri) {
    case 1: return tile<1>(x, sx, w, sw, rj, K, bias, out, so);
    case 2: return tile<std::min(2, kMaxRowsX)>(x, sx, w, sw, rj, K, bias, out, so);
    case 3: return tile<std::min(3, kMaxRowsX)>(x, sx, w, sw, rj, K, bias, out, so);
    default: return tile<kMaxRowsX>(x, sx, w, sw, rj, K, bias, out, so);
  }
}

template <typename TX, typename TW>
void linear_impl(const TX* x, int64_t sx, const TW* w, int64_t sw, const float* bias, float* out, int64_t n,
                 int64_t N, int64_t K) {
  const int64_t blocks = (N + kRowsW - 1) / kRowsW;
  // ~64 KB of weight per task: whole tiles of the vocabulary go to each thread
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, kRowsW * K * int64_t(sizeof(TW))));
  at::parallel_for(0, blocks, grain, [&](int64_t b, int64_t e) {
    for (int64_t blk = b; blk < e; ++blk) {
      const int64_t j0 = blk * kRowsW;
      const int rj = static_cast<int>(std::min<int64_t>(kRowsW, N - j0));
      for (int64_t i0 = 0; i0 < n; i0 += kMaxRowsX) {
        const int ri = static_cast<int>(std::min<int64_t>(kMaxRowsX, n - i0));
        tile_rows(ri, x + i0 * sx, sx, w + j0 * sw, sw, rj, K, bias ? bias + j0 : nullptr, out + i0 * N + j0, N);
      }
    }
  });
}

template <typename TX>
void dispatch_w(const TX* xp, int64_t sx, const at::Tensor& w, const float* bp, float* op, int64_t n, int64_t K) {
  const int64_t N = w.size(0), sw = w.stride(0);
  if (w.scalar_type() == at::kFloat) {
    linear_impl(xp, sx, w.data_ptr<float>(), sw, bp, op, n, N, K);
  } else {
    linear_impl(xp, sx, reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()), sw, bp, op, n, N, K);
  }
}

}  // namespace

at::Tensor linear_f32out(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  for (const at::Tensor* t : {&x, &w}) {
    TORCH_CHECK(t->device().is_cpu(), "linear_f32out: tensors must be on the CPU");
    TORCH_CHECK(t->scalar_type() == at::kFloat || t->scalar_type() == at::kBFloat16,
                "linear_f32out: x and w must be float32 or bfloat16, got ", t->scalar_type());
    TORCH_CHECK(t->dim() == 2 && t->stride(1) == 1, "linear_f32out: x and w must be 2-D with contiguous rows");
  }
  const int64_t n = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(w.size(1) == K, "linear_f32out: x has ", K, " columns but w has ", w.size(1));
  const float* bp = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->size(0) == N && bias->is_contiguous(),
                "linear_f32out: bias must be a contiguous float32 [N] tensor");
    bp = bias->data_ptr<float>();
  }
  auto out = at::empty({n, N}, x.options().dtype(at::kFloat));
  if (n == 0 || N == 0) return out;
  if (K == 0) return bias.has_value() ? out.copy_(bias->unsqueeze(0).expand({n, N})) : out.zero_();
  float* op = out.data_ptr<float>();
  if (x.scalar_type() == at::kFloat) {
    dispatch_w(x.data_ptr<float>(), x.stride(0), w, bp, op, n, K);
  } else {
    dispatch_w(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), x.stride(0), w, bp, op, n, K);
  }
  return out;
}
