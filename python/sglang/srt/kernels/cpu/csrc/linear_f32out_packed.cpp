// linear_f32out_packed: out[n, N] = x[n, K] . W[N, K]^T (+ bias) in float32, for a bf16 weight
// packed once (pack_bf16_pairs in layers/linear_float32_out.py) so that the vocabulary runs along
// the vector lanes: no horizontal sums, and one 32-bit lane carries two bf16 weights (row r in its
// low half, row r + 16 in its high half), widened by one shift or one mask each.
//
// Layout: packed[b, k, l] (int32) = W[32b + 16 + l, k] << 16 | W[32b + l, k] for l < 16, rows past
// N zero. AVX-512: a tile of RI <= 4 rows of x times two blocks (64 weight rows) keeps 16
// accumulators; each k costs two 64-byte loads, four widenings, RI broadcasts and 4 * RI FMAs, so
// the FMAs dominate from 2 rows on and a single decode row reads each weight byte once. AVX2: the
// same with 8 lanes (two loads per block), RI <= 2, one block. Portable loops elsewhere.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>  // the ATen ops this file calls (not torch/extension.h: ~10x the parse time)

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kBlock = 32;  // weight rows per packed block

inline float lo_f(uint32_t v) {
  const uint32_t b = v << 16;
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
inline float hi_f(uint32_t v) {
  const uint32_t b = v & 0xFFFF0000u;
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

// Stores 16 (or fewer, at the vocabulary's end) results of one row: out[j0 .. j0 + 16) + bias
inline void store_row(float* out, const float* vals, const float* bias, int64_t j0, int64_t N) {
  const int64_t m = std::min<int64_t>(16, N - j0);
  for (int64_t l = 0; l < m; ++l) out[j0 + l] = vals[l] + (bias ? bias[j0 + l] : 0.f);
}

#if defined(__AVX512F__)
constexpr int kMaxRows = 4, kBlocksPerTask = 2;

template <int RI, int NB>
inline __attribute__((always_inline)) void tile(const float* x, int64_t sx, const uint32_t* p, int64_t K,
                                                int64_t b0, const float* bias, float* out, int64_t so, int64_t N) {
  __m512 acc[RI][2 * NB];
#pragma GCC unroll 4
  for (int i = 0; i < RI; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < 2 * NB; ++v) acc[i][v] = _mm512_setzero_ps();
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t k = 0; k < K; ++k) {
    __m512 w[2 * NB];
#pragma GCC unroll 2
    for (int b = 0; b < NB; ++b) {
      const __m512i raw = _mm512_loadu_si512(p + ((b0 + b) * K + k) * 16);
      w[2 * b] = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
      w[2 * b + 1] = _mm512_castsi512_ps(_mm512_and_si512(raw, hi_mask));
    }
#pragma GCC unroll 4
    for (int i = 0; i < RI; ++i) {
      const __m512 xv = _mm512_set1_ps(x[i * sx + k]);
#pragma GCC unroll 4
      for (int v = 0; v < 2 * NB; ++v) acc[i][v] = _mm512_fmadd_ps(xv, w[v], acc[i][v]);
    }
  }
  alignas(64) float buf[16];
  for (int i = 0; i < RI; ++i)
    for (int v = 0; v < 2 * NB; ++v) {
      _mm512_store_ps(buf, acc[i][v]);
      store_row(out + i * so, buf, bias, (b0 + v / 2) * kBlock + (v % 2) * 16, N);
    }
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kMaxRows = 2, kBlocksPerTask = 1;

template <int RI, int NB>
inline __attribute__((always_inline)) void tile(const float* x, int64_t sx, const uint32_t* p, int64_t K,
                                                int64_t b0, const float* bias, float* out, int64_t so, int64_t N) {
  static_assert(NB == 1, "AVX2 tiles hold one block");
  __m256 acc[RI][4];  // rows l 0-7, 8-15 (low halves), 16 + (0-7, 8-15) (high halves)
  for (int i = 0; i < RI; ++i)
    for (int v = 0; v < 4; ++v) acc[i][v] = _mm256_setzero_ps();
  const __m256i hi_mask = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t k = 0; k < K; ++k) {
    const uint32_t* q = p + (b0 * K + k) * 16;
    const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    const __m256i r1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 8));
    const __m256 w[4] = {_mm256_castsi256_ps(_mm256_slli_epi32(r0, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(r1, 16)),
                         _mm256_castsi256_ps(_mm256_and_si256(r0, hi_mask)),
                         _mm256_castsi256_ps(_mm256_and_si256(r1, hi_mask))};
    for (int i = 0; i < RI; ++i) {
      const __m256 xv = _mm256_set1_ps(x[i * sx + k]);
      for (int v = 0; v < 4; ++v) acc[i][v] = _mm256_fmadd_ps(xv, w[v], acc[i][v]);
    }
  }
  alignas(32) float buf[16];
  for (int i = 0; i < RI; ++i)
    for (int h = 0; h < 2; ++h) {
      _mm256_store_ps(buf, acc[i][2 * h]);
      _mm256_store_ps(buf + 8, acc[i][2 * h + 1]);
      store_row(out + i * so, buf, bias, b0 * kBlock + h * 16, N);
    }
}
#else
constexpr int kMaxRows = 4, kBlocksPerTask = 1;

template <int RI, int NB>
void tile(const float* x, int64_t sx, const uint32_t* p, int64_t K, int64_t b0, const float* bias, float* out,
          int64_t so, int64_t N) {
  for (int i = 0; i < RI; ++i) {
    float lo[16] = {}, hi[16] = {};
    for (int64_t k = 0; k < K; ++k) {
      const float xv = x[i * sx + k];
      const uint32_t* q = p + (b0 * K + k) * 16;
      for (int l = 0; l < 16; ++l) {
        lo[l] += xv * lo_f(q[l]);
        hi[l] += xv * hi_f(q[l]);
      }
    }
    store_row(out + i * so, lo, bias, b0 * kBlock, N);
    store_row(out + i * so, hi, bias, b0 * kBlock + 16, N);
  }
}
#endif

template <int NB>
void rows_tile(int ri, const float* x, int64_t sx, const uint32_t* p, int64_t K, int64_t b0, const float* bias,
               float* out, int64_t so, int64_t N) {
  switch (ri) {
    case 1: return tile<1, NB>(x, sx, p, K, b0, bias, out, so, N);
    case 2: return tile<std::min(2, kMaxRows), NB>(x, sx, p, K, b0, bias, out, so, N);
    case 3: return tile<std::min(3, kMaxRows), NB>(x, sx, p, K, b0, bias, out, so, N);
    default: return tile<kMaxRows, NB>(x, sx, p, K, b0, bias, out, so, N);
  }
}

}  // namespace

at::Tensor linear_f32out_packed(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                                const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu(), "linear_f32out_packed: tensors must be on the CPU");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.stride(1) == 1,
              "linear_f32out_packed: x must be a float32 [n, K] tensor with contiguous rows");
  const int64_t n = x.size(0), K = x.size(1), blocks = (N + kBlock - 1) / kBlock;
  TORCH_CHECK(packed.scalar_type() == at::kInt && packed.is_contiguous() && packed.dim() == 3 &&
                  packed.size(0) == blocks && packed.size(1) == K && packed.size(2) == 16,
              "linear_f32out_packed: packed must be the contiguous int32 [ceil(N / 32), K, 16] of pack_bf16_pairs");
  const float* bp = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->size(0) == N && bias->is_contiguous(),
                "linear_f32out_packed: bias must be a contiguous float32 [N] tensor");
    bp = bias->data_ptr<float>();
  }
  auto out = at::empty({n, N}, x.options());
  if (n == 0 || N == 0) return out;
  const float* xp = x.data_ptr<float>();
  const auto* pp = reinterpret_cast<const uint32_t*>(packed.data_ptr<int32_t>());
  float* op = out.data_ptr<float>();
  const int64_t sx = x.stride(0);
  const int64_t tasks = (blocks + kBlocksPerTask - 1) / kBlocksPerTask;
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, K * kBlock * kBlocksPerTask * 2));
  at::parallel_for(0, tasks, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b0 = t * kBlocksPerTask;
      const bool full = b0 + kBlocksPerTask <= blocks;
      for (int64_t i0 = 0; i0 < n; i0 += kMaxRows) {
        const int ri = static_cast<int>(std::min<int64_t>(kMaxRows, n - i0));
        if (full) {
          rows_tile<kBlocksPerTask>(ri, xp + i0 * sx, sx, pp, K, b0, bp, op + i0 * N, N, N);
        } else {
          rows_tile<1>(ri, xp + i0 * sx, sx, pp, K, b0, bp, op + i0 * N, N, N);
        }
      }
    }
  });
  return out;
}
