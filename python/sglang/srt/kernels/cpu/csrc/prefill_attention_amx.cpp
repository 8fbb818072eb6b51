// Causal prefill attention on AMX tiles (bfloat16, head dim 64): a flash-attention loop over
// 16-query x 64-key blocks. S^T = K.Q^T and O^T += V^T.P^T run on the tile unit
// (_tile_dpbf16ps); the online softmax runs on AVX-512 with the 16 query rows of a block in the
// 16 lanes of each vector, so it needs no horizontal reductions.
//
// torch's CPU flash kernel spends most of its time in its softmax (a 4096-token layer takes
// 28.7 ms at head dim 16 and 34.7 ms at 64), which is why this kernel exists: the same layer
// takes 27.7 ms here (2 threads). A first version with the rows along the vectors (horizontal
// max / sum per row) took 44 ms. Inputs are the fresh q / k / v of one sequence ([n, H, 64] rows,
// any row stride); keys are causal from 0; P is rounded to bf16 for P.V, as in torch's kernel.
//
// AMX needs the kernel's permission to use tile data (arch_prctl ARCH_REQ_XCOMP_PERM); where
// that or the ISA is missing, `prefill_attention_supported()` is false and callers keep SDPA.

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__)
#define SGL_HAVE_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace sgl_amx {

#if defined(SGL_HAVE_AMX)

constexpr int kHeadDim = 64;
constexpr int kQ = 16;   // query rows per block (tile rows)
constexpr int kK = 64;   // keys per block (4 score tiles of 16)
constexpr long kArchReqXcompPerm = 0x1023;
constexpr long kXfeatureXtiledata = 18;

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

bool request_amx() {
  static const bool ok = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return ok;
}

// every tile register: 16 rows x 64 bytes (A: 16 x 32 bf16, B: 16 x 16 bf16 pairs, C: 16 x 16 fp32)
void configure_tiles() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int i = 0; i < 8; ++i) {
    cfg.rows[i] = 16;
    cfg.colsb[i] = 64;
  }
  // the compiler does not see ldtilecfg read cfg and drops the stores above without this
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

inline __m512 exp512(__m512 x) {
  // e^x = 2^n e^r, n = round(x / ln 2); degree-6 series for e^r; inputs clamped to [-87, 88]
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.f)), _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 720.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

// 16 floats -> their bf16 bits (round to nearest even) in the low half of each 32-bit lane
inline __m512i bf16_bits(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  return _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
}

// e^x for x <= 0 to about bf16 precision (P is rounded to bf16 for P.V anyway): 2^n e^r with
// n = round(x / ln 2), degree-5 series for e^r (|rel err| < 3e-6), 2^n by scalef (-> 0 below range)
inline __m512 exp512_fast(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.6931471805599453f), x);
  __m512 p = _mm512_set1_ps(1.f / 120.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}


// Tiles 4 + c (c < 4) = A0_c . B0 + A1_c . B1 with B0 / B1 = tiles 2 / 3 (two 1 KB tiles at b),
// A0_c = a0 + c * a_step, A1_c = a1 + c * a_step (rows a_stride bytes apart); the four 16 x 16
// float results are stored one after another at dst. The tile intrinsics paste their tile numbers
// into assembly text, so they must be literals: hence a macro, not a template.
#define SGL_TILE_PAIR_DOT(c, tile)                 \
  _tile_loadd(0, a0 + (c) * a_step, a_stride);     \
  _tile_loadd(1, a1 + (c) * a_step, a_stride);     \
  _tile_dpbf16ps(tile, 0, 2);                      \
  _tile_dpbf16ps(tile, 1, 3)

inline void four_tile_products(const uint32_t* b, const uint16_t* a0, const uint16_t* a1, int64_t a_step,
                               int a_stride, float* dst) {
  _tile_loadd(2, b, 64);
  _tile_loadd(3, b + 256, 64);
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  SGL_TILE_PAIR_DOT(0, 4);
  SGL_TILE_PAIR_DOT(1, 5);
  SGL_TILE_PAIR_DOT(2, 6);
  SGL_TILE_PAIR_DOT(3, 7);
  _tile_stored(4, dst, 64);
  _tile_stored(5, dst + 256, 64);
  _tile_stored(6, dst + 512, 64);
  _tile_stored(7, dst + 768, 64);
}
#undef SGL_TILE_PAIR_DOT

// One task: 16 query rows of one q head against keys 0 .. last row, transposed so that the 16
// query rows are the 16 lanes of every AVX-512 vector (the softmax needs no horizontal ops):
//   S^T [64 keys x 16 rows] = K_blk . Q^T   (A: K rows, B: Q^T in d pairs)
//   O^T [64 d x 16 rows]   += V^T_blk . P^T (A: V^T rows, B: P^T in key pairs)
void attend_block_rows(const uint32_t* qt, const uint16_t* kpad, const uint16_t* vt, int64_t n, int64_t r0,
                       int64_t prefix, float scale, uint16_t* out, int64_t so0) {
  alignas(64) float st[kK * 16];
  alignas(64) uint32_t pt[(kK / 2) * 16];
  alignas(64) float ot[kHeadDim * 16];
  alignas(64) float o[kHeadDim * 16];
  std::memset(o, 0, sizeof(o));
  const int64_t rows = std::min<int64_t>(kQ, n - r0);
  const int64_t last_key = prefix + r0 + rows - 1;  // query row r sits at position prefix + r
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 m = _mm512_set1_ps(-1e30f);  // running max per row (finite: exp stays exact 0 for "none yet")
  __m512 l = _mm512_setzero_ps();
  alignas(64) static const uint16_t kPairIdx[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                                    8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i pair_idx = _mm512_load_si512(kPairIdx);
  for (int64_t k0 = 0; k0 <= last_key; k0 += kK) {
    // S^T = K.Q^T: A = 64 K rows (4 x 16 keys, d 0..31 / 32..63), B = Q^T in d pairs
    const uint16_t* kb = kpad + k0 * kHeadDim;
    four_tile_products(qt, kb, kb + 32, 16 * kHeadDim, kHeadDim * 2, st);
    // causal: key k visible to lane r iff k <= r0 + r, i.e. lanes >= k - r0. The scale is applied
    // inside the exponent (p = exp(x * scale - m)); the max is taken over unscaled scores.
    const int64_t full = prefix + r0 - k0;  // keys k0 + kk with kk <= full are visible to every lane
    // scale > 0: the max of the scaled scores is the scaled max
    __m512 raw = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    if (full >= kK - 1) {
      for (int kk = 0; kk < kK; ++kk) raw = _mm512_max_ps(raw, _mm512_load_ps(st + kk * 16));
    } else {
      for (int kk = 0; kk < kK; ++kk) {
        const int64_t first = kk - full;  // first visible lane
        if (first >= 16) break;
        const __mmask16 vis = first <= 0 ? 0xFFFF : static_cast<__mmask16>(0xFFFFu << first);
        raw = _mm512_mask_max_ps(raw, vis, raw, _mm512_load_ps(st + kk * 16));
      }
    }
    const __m512 mx = _mm512_max_ps(m, _mm512_mul_ps(raw, vscale));
    const bool same_max = _mm512_cmp_ps_mask(mx, m, _CMP_NEQ_OQ) == 0;
    const __m512 alpha = same_max ? _mm512_set1_ps(1.f) : exp512(_mm512_sub_ps(m, mx));
    m = mx;
    __m512 sum = _mm512_setzero_ps();
    for (int kk = 0; kk < kK; kk += 2) {
      __m512 p[2];
      for (int e = 0; e < 2; ++e) {
        p[e] = exp512_fast(_mm512_fmsub_ps(_mm512_load_ps(st + (kk + e) * 16), vscale, m));
        const int64_t first = kk + e - full;
        if (first > 0) {
          p[e] = first < 16 ? _mm512_maskz_mov_ps(static_cast<__mmask16>(0xFFFFu << first), p[e]) : _mm512_setzero_ps();
        }
        sum = _mm512_add_ps(sum, p[e]);
      }
      // 32 bf16 = [p1 (16) | p0 (16)] -> interleaved pairs (p0[r], p1[r]) per 32-bit lane r
      const __m512i packed = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(p[1], p[0]));
      _mm512_store_si512(pt + (kk / 2) * 16, _mm512_permutexvar_epi16(pair_idx, packed));
    }
    l = same_max ? _mm512_add_ps(l, sum) : _mm512_fmadd_ps(l, alpha, sum);
    // O^T += V^T P^T: B = P^T (2 tiles of 16 key pairs), A = V^T rows (16 d x 32 keys)
    const uint16_t* vb = vt + (k0 / 32) * kHeadDim * 32;  // [key block of 32][64 d][32 keys]
    four_tile_products(pt, vb, vb + kHeadDim * 32, 16 * 32, 64, ot);
    if (same_max) {
      for (int d = 0; d < kHeadDim; ++d) _mm512_store_ps(o + d * 16, _mm512_add_ps(_mm512_load_ps(o + d * 16), _mm512_load_ps(ot + d * 16)));
    } else {
      for (int d = 0; d < kHeadDim; ++d) {
        _mm512_store_ps(o + d * 16, _mm512_fmadd_ps(_mm512_load_ps(o + d * 16), alpha, _mm512_load_ps(ot + d * 16)));
      }
    }
  }
  const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.f), l);
  for (int d = 0; d < kHeadDim; ++d) {
    _mm512_store_si512(reinterpret_cast<uint32_t*>(ot) + d * 16, bf16_bits(_mm512_mul_ps(_mm512_load_ps(o + d * 16), inv)));
  }
  const uint32_t* ob = reinterpret_cast<const uint32_t*>(ot);
  for (int64_t i = 0; i < rows; ++i) {
    uint16_t* orow = out + (r0 + i) * so0;
    for (int d = 0; d < kHeadDim; ++d) orow[d] = static_cast<uint16_t>(ob[d * 16 + i]);
  }
}

#endif  // SGL_HAVE_AMX

}  // namespace sgl_amx

bool prefill_attention_supported() {
#if defined(SGL_HAVE_AMX)
  return sgl_amx::request_amx();
#else
  return false;
#endif
}

at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                             const std::optional<at::Tensor>& k_cache, const std::optional<at::Tensor>& v_cache,
                             const std::optional<at::Tensor>& prefix_slots) {
  TORCH_CHECK(prefill_attention_supported(), "prefill_attention: AMX is not available on this CPU / build");
#if defined(SGL_HAVE_AMX)
  using namespace sgl_amx;
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "prefill_attention: CPU tensors");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 && v.scalar_type() == at::kBFloat16,
              "prefill_attention: bfloat16 q / k / v");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && q.size(2) == kHeadDim && k.size(2) == kHeadDim &&
                  v.size(2) == kHeadDim,
              "prefill_attention: [n, heads, 64] inputs");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1 && q.stride(1) == kHeadDim &&
                  k.stride(1) == kHeadDim && v.stride(1) == kHeadDim,
              "prefill_attention: heads of a row must be contiguous");
  const int64_t n = q.size(0), H = q.size(1), Hk = k.size(1);
  TORCH_CHECK(k.size(0) == n && v.size(0) == n && v.size(1) == Hk && H % Hk == 0, "prefill_attention: shapes");
  // optional cached prefix: keys / values of pool rows prefix_slots from head-major [Hk, rows, 64]
  // buffers, before the fresh ones (the chunk of a chunked prefill, or a prompt with a cache hit)
  const bool has_prefix = prefix_slots.has_value() && prefix_slots->numel() > 0;
  const int64_t P = has_prefix ? prefix_slots->numel() : 0;
  const uint16_t* kc = nullptr;
  const uint16_t* vc = nullptr;
  const int64_t* slots = nullptr;
  int64_t cache_rows = 0;
  if (has_prefix) {
    TORCH_CHECK(k_cache.has_value() && v_cache.has_value(), "prefill_attention: prefix_slots needs k_cache / v_cache");
    for (const at::Tensor* c : {&*k_cache, &*v_cache}) {
      TORCH_CHECK(c->scalar_type() == at::kBFloat16 && c->dim() == 3 && c->is_contiguous() && c->size(0) == Hk &&
                      c->size(2) == kHeadDim && c->size(1) == k_cache->size(1),
                  "prefill_attention: caches must be contiguous head-major [Hk, rows, 64] bfloat16");
    }
    TORCH_CHECK(prefix_slots->scalar_type() == at::kLong && prefix_slots->dim() == 1 && prefix_slots->is_contiguous(),
                "prefill_attention: prefix_slots must be contiguous int64 [P]");
    cache_rows = k_cache->size(1);
    kc = reinterpret_cast<const uint16_t*>(k_cache->data_ptr<at::BFloat16>());
    vc = reinterpret_cast<const uint16_t*>(v_cache->data_ptr<at::BFloat16>());
    slots = prefix_slots->data_ptr<int64_t>();
    for (int64_t j = 0; j < P; ++j) {
      TORCH_CHECK(slots[j] >= 0 && slots[j] < cache_rows, "prefill_attention: prefix slot ", slots[j], " outside the cache");
    }
  }
  auto out = at::empty({n, H, kHeadDim}, q.options());
  if (n == 0) return out;
  const int64_t G = H / Hk;
  const int64_t L = P + n;  // keys: the prefix, then the fresh ones
  const int64_t lpad = (L + kK - 1) / kK * kK;
  // Per kv head: K rows padded with zeros to lpad ([lpad][64] bf16) and V^T in blocks of 32 keys
  // ([lpad / 32][64 d][32 keys] bf16); per task, Q^T in d pairs ([32][16 rows] bf16 pairs).
  std::vector<uint16_t> kpad(Hk * lpad * kHeadDim, 0), vt(Hk * lpad * kHeadDim, 0);
  const uint16_t* kp = reinterpret_cast<const uint16_t*>(k.data_ptr<at::BFloat16>());
  const uint16_t* vp = reinterpret_cast<const uint16_t*>(v.data_ptr<at::BFloat16>());
  const int64_t sk0 = k.stride(0), sv0 = v.stride(0);
  at::parallel_for(0, Hk * (lpad / 32), 4, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t h = t / (lpad / 32), blk = t % (lpad / 32);
      uint16_t* vth = vt.data() + (h * (lpad / 32) + blk) * kHeadDim * 32;
      for (int64_t kk = 0; kk < 32; ++kk) {
        const int64_t key = blk * 32 + kk;
        if (key >= L) break;
        const uint16_t* krow = key < P ? kc + (h * cache_rows + slots[key]) * kHeadDim : kp + (key - P) * sk0 + h * kHeadDim;
        const uint16_t* vrow = key < P ? vc + (h * cache_rows + slots[key]) * kHeadDim : vp + (key - P) * sv0 + h * kHeadDim;
        std::memcpy(kpad.data() + (h * lpad + key) * kHeadDim, krow, kHeadDim * 2);
        for (int d = 0; d < kHeadDim; ++d) vth[d * 32 + kk] = vrow[d];
      }
    }
  });
  const int64_t nqb = (n + kQ - 1) / kQ;
  std::vector<int64_t> order(nqb);
  for (int64_t i = 0, lo = 0, hi = nqb - 1; i < nqb; ++i) order[i] = (i % 2 == 0) ? lo++ : hi--;
  const uint16_t* qp = reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const int64_t sq0 = q.stride(0), so0 = out.stride(0);
  const float fscale = static_cast<float>(scale);
  at::parallel_for(0, H * nqb, 1, [&](int64_t b, int64_t e) {
    configure_tiles();
    alignas(64) uint32_t qt[32 * 16];
    for (int64_t t = b; t < e; ++t) {
      const int64_t hq = t % H, r0 = order[t / H] * kQ;
      const int64_t h = hq / G;
      for (int64_t i = 0; i < kQ; ++i) {
        const uint32_t* qrow = reinterpret_cast<const uint32_t*>(qp + (r0 + i) * sq0 + hq * kHeadDim);
        for (int w = 0; w < 32; ++w) qt[w * 16 + i] = r0 + i < n ? qrow[w] : 0u;
      }
      attend_block_rows(qt, kpad.data() + h * lpad * kHeadDim, vt.data() + h * lpad * kHeadDim, n, r0, P, fscale,
                        op + hq * kHeadDim, so0);
    }
    _tile_release();
  });
  return out;
#else
  return at::Tensor();
#endif
}
