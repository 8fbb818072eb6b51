// Causal prefill attention on AMX tiles (bfloat16, head dim 64): a flash-attention loop over
// 16-query x 64-key blocks. S^T = K.Q^T and O^T += V^T.P^T run on the tile unit
// (_tile_dpbf16ps); the online softmax runs on AVX-512 with the 16 query rows of a block in the
// 16 lanes of each vector, so it needs no horizontal reductions.
//
// torch's CPU flash kernel spends most of its time in its softmax, which is why this kernel
// exists. What mattered, step by step, with the numbers (benchmark/vs_vllm/profile_notes.md):
// query rows in the vector lanes (no horizontal max / sum); 64-byte aligned K / V scratch (tile
// rows that straddle cache lines make every tile load slow); kv-head-major task order so a
// thread's tasks share one head's K / V in L2; 2^x with one vreduceps, a degree-3 fit and scalef;
// a lazy running max that skips the max pass unless a block's sums overflow 2^8; Q^T and the
// output rows by 16 x 16 vector transposes; 16-row tasks with O^T held in tiles across all key
// blocks (no per-block O^T stores and vector accumulation). Not worth it here: 128- or 256-key
// blocks, a degree-2 fit of 2^x, software-pipelining the next block's scores / the previous
// block's P.V with the softmax.
// Inputs are the fresh q / k / v of one sequence ([n, H, 64] rows, any row stride) and optionally
// a cached prefix in a head-major pool; P is rounded to bf16 for P.V, as in torch's kernel.
//
// AMX needs the kernel's permission to use tile data (arch_prctl ARCH_REQ_XCOMP_PERM); where
// that or the ISA is missing, `prefill_attention_supported()` is false and callers keep SDPA.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>  // the ATen ops this file calls (not torch/extension.h: ~10x the parse time)

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__AVX512DQ__)
#define SGL_HAVE_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "vec_exp2.h"
#endif

namespace sgl_amx {

#if defined(SGL_HAVE_AMX)
#include "amx_tiles.h"

// GCC's tile intrinsics are `asm volatile` without memory operands or a "memory" clobber, so the
// compiler may move ordinary loads and stores across them: vector loads of the scores above the
// tile store that writes them, stores of P below the tile load that reads them. Every tile load
// and store goes through these, which fence the compiler (no instruction is emitted).
#define SGL_TILE_LOAD(t, base, stride) \
  do {                                 \
    asm volatile("" ::: "memory");     \
    _tile_loadd(t, base, stride);      \
    asm volatile("" ::: "memory");     \
  } while (0)
#define SGL_TILE_STORE(t, base, stride) \
  do {                                  \
    asm volatile("" ::: "memory");      \
    _tile_stored(t, base, stride);      \
    asm volatile("" ::: "memory");      \
  } while (0)

constexpr int kHeadDim = 64;
constexpr int kQ = 16;   // query rows per block (tile rows)
constexpr int kK = 64;   // keys per block (4 score tiles of 16)
constexpr long kArchReqXcompPerm = 0x1023;
constexpr long kXfeatureXtiledata = 18;

// zero-filled, 64-byte aligned scratch memory
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t bytes) : p_(static_cast<uint16_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64))) {
    TORCH_CHECK(p_ != nullptr, "prefill_attention: out of memory");
    std::memset(p_, 0, bytes);
  }
  ~AlignedBuffer() { std::free(p_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  uint16_t* data() const { return p_; }

 private:
  uint16_t* p_;
};

bool request_amx() {
  static const bool ok = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return ok;
}

// every tile register: 16 rows x 64 bytes (A: 16 x 32 bf16, B: 16 x 16 bf16 pairs, C: 16 x 16 fp32)
void configure_tiles() { sgl_amx::configure_full_tiles(); }

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

// 16 x 16 transpose of 32-bit lanes: r[i] = row i in, r[j] = column j out (unpack within lanes,
// then 64-bit interleave, then 128-bit lane shuffles)
inline void transpose16x16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // r[4i + j], 128-bit lane L: column 4L + j of rows 4i .. 4i + 3
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int j = 0; j < 4; ++j) {
    const __m512 lo01 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x44), hi01 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xEE);
    const __m512 lo23 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x44), hi23 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xEE);
    t[j] = _mm512_shuffle_f32x4(lo01, lo23, 0x88);
    t[4 + j] = _mm512_shuffle_f32x4(lo01, lo23, 0xDD);
    t[8 + j] = _mm512_shuffle_f32x4(hi01, hi23, 0x88);
    t[12 + j] = _mm512_shuffle_f32x4(hi01, hi23, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

using sgl_vec::exp2_fast;

// One task: 16 query rows of one q head against keys 0 .. its last row, transposed so that the 16
// rows are the 16 lanes of every AVX-512 vector (the softmax needs no horizontal ops):
//   S^T [16 keys x 16 rows]  = K_16 . Q^T          (A: K rows, B: Q^T in d pairs)
//   O^T [16 d x 16 rows]    += V^T_16x32 . P^T     (A: V^T rows, B: P^T in key pairs)
// O^T stays in tiles 4..7 over all key blocks: with the lazy running max (below) the scale of p
// rarely changes, and when it does the four tiles are stored, scaled and reloaded. Tiles 1 / 2
// hold Q^T (d 0..31 / 32..63) in the score phase and V^T rows in the P.V phase, tile 0 stages A
// operands, tile 3 holds a score sub-tile, then a P^T chunk.
void attend_rows(const uint32_t* qt, const uint16_t* kpad, const uint16_t* vt, int64_t n, int64_t r0,
                 int64_t prefix, float scale, uint16_t* out, int64_t so0) {
  alignas(64) float st[kK * 16];
  alignas(64) uint32_t pt[(kK / 2) * 16];
  alignas(64) float o[kHeadDim * 16];
  const int64_t rows = std::min<int64_t>(kQ, n - r0);
  const int64_t last_key = prefix + r0 + rows - 1;
  const __m512 vscale = _mm512_set1_ps(scale * 1.44269504088896341f);
  const __m512 vln2 = _mm512_set1_ps(0.6931471805599453f);
  __m512 m = _mm512_set1_ps(-1e30f), l = _mm512_setzero_ps();
  alignas(64) static const uint16_t kPairIdx[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                                    8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i pair_idx = _mm512_load_si512(kPairIdx);
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  for (int64_t k0 = 0; k0 <= last_key; k0 += kK) {
    // S^T of the block, 16 keys at a time (tile 0: K rows, d 0..31 then 32..63)
    const uint16_t* kb = kpad + k0 * kHeadDim;
    SGL_TILE_LOAD(1, qt, 64);
    SGL_TILE_LOAD(2, qt + 256, 64);
    for (int c = 0; c < kK / 16; ++c) {
      SGL_TILE_LOAD(0, kb + c * 16 * kHeadDim, kHeadDim * 2);
      _tile_zero(3);
      _tile_dpbf16ps(3, 0, 1);
      SGL_TILE_LOAD(0, kb + c * 16 * kHeadDim + 32, kHeadDim * 2);
      _tile_dpbf16ps(3, 0, 2);
      SGL_TILE_STORE(3, st + c * 256, 64);
    }
    // causal: key k0 + kk is visible to lane r iff kk <= full + r; keys from kend on to no lane
    const int64_t full = prefix + r0 - k0;
    const int kend = static_cast<int>(std::min<int64_t>(kK, full + 16));
    // P^T of the block against the running max m (keys every row sees, then the diagonal);
    // returns the rows' sums of p
    auto exponentials = [&]() {
      __m512 sum[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
      // keys kk, kk + 1 -> one 32-bit row of P^T; `diagonal`: key kk + e reaches lanes >= kk + e - full
      auto key_pair = [&](int kk, bool diagonal) {
        __m512 p[2];
        for (int e = 0; e < 2; ++e) {
          p[e] = exp2_fast(_mm512_fmsub_ps(_mm512_load_ps(st + (kk + e) * 16), vscale, m));
          const int64_t first = kk + e - full;
          if (diagonal && first > 0) {
            p[e] = first < 16 ? _mm512_maskz_mov_ps(static_cast<__mmask16>(0xFFFFu << first), p[e]) : _mm512_setzero_ps();
          }
          sum[e] = _mm512_add_ps(sum[e], p[e]);
        }
        // 32 bf16 = [p1 (16) | p0 (16)] -> interleaved pairs (p0[r], p1[r]) per 32-bit lane r
        const __m512i packed = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(p[1], p[0]));
        _mm512_store_si512(pt + (kk / 2) * 16, _mm512_permutexvar_epi16(pair_idx, packed));
      };
      int kk = 0;
      const int nfull = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(kend, full + 1))) & ~1;
      for (; kk < nfull; kk += 2) key_pair(kk, false);  // keys every row sees
      for (; kk < kend; kk += 2) key_pair(kk, true);
      for (; kk < kK; kk += 2) _mm512_store_si512(pt + (kk / 2) * 16, _mm512_setzero_si512());
      return _mm512_add_ps(sum[0], sum[1]);
    };
    // Lazy max: after the first block, p is taken against the running max m without looking at
    // the block's scores first; only when some row's sum exceeds 2^8 (a score more than 8 units
    // of log2 above m, or many close to it) is the block's max taken, O^T and l rescaled and the
    // block redone. p stays <= 2^8 otherwise, far inside fp32 / bf16 range.
    __m512 bsum = _mm512_setzero_ps();
    bool redo = k0 == 0;
    if (!redo) {
      bsum = exponentials();
      redo = _mm512_cmp_ps_mask(bsum, _mm512_set1_ps(256.f), _CMP_NLE_UQ) != 0;
    }
    if (redo) {
      __m512 raw = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      for (int kk = 0; kk < kK; ++kk) {
        const int64_t first = kk - full;
        if (first >= 16) break;
        const __mmask16 vis = first <= 0 ? 0xFFFF : static_cast<__mmask16>(0xFFFFu << first);
        raw = _mm512_mask_max_ps(raw, vis, raw, _mm512_load_ps(st + kk * 16));
      }
      // scale > 0: the max of the scaled scores is the scaled max
      const __m512 mx = _mm512_max_ps(m, _mm512_mul_ps(raw, vscale));
      const __m512 alpha = exp512(_mm512_mul_ps(_mm512_sub_ps(m, mx), vln2));
      m = mx;
      l = _mm512_mul_ps(l, alpha);
      if (k0 > 0) {  // rescale the O^T accumulators (rows = lanes = tile columns)
        SGL_TILE_STORE(4, o, 64);
        SGL_TILE_STORE(5, o + 256, 64);
        SGL_TILE_STORE(6, o + 512, 64);
        SGL_TILE_STORE(7, o + 768, 64);
        for (int d = 0; d < kHeadDim; ++d) _mm512_store_ps(o + d * 16, _mm512_mul_ps(_mm512_load_ps(o + d * 16), alpha));
        SGL_TILE_LOAD(4, o, 64);
        SGL_TILE_LOAD(5, o + 256, 64);
        SGL_TILE_LOAD(6, o + 512, 64);
        SGL_TILE_LOAD(7, o + 768, 64);
      }
      bsum = exponentials();
    }
    l = _mm512_add_ps(l, bsum);
    // O^T += V^T P^T, 32 keys at a time: B = P^T chunk (tile 3), A = the 4 d tiles of V^T
    const uint16_t* vb = vt + (k0 / 32) * kHeadDim * 32;  // [key block of 32][64 d][32 keys]
    for (int kc = 0; kc < kK / 32; ++kc) {
      const uint16_t* av = vb + kc * kHeadDim * 32;
      SGL_TILE_LOAD(3, pt + kc * 256, 64);
      SGL_TILE_LOAD(0, av, 64);
      SGL_TILE_LOAD(1, av + 16 * 32, 64);
      SGL_TILE_LOAD(2, av + 32 * 32, 64);
      _tile_dpbf16ps(4, 0, 3);
      _tile_dpbf16ps(5, 1, 3);
      _tile_dpbf16ps(6, 2, 3);
      SGL_TILE_LOAD(0, av + 48 * 32, 64);
      _tile_dpbf16ps(7, 0, 3);
    }
  }
  SGL_TILE_STORE(4, o, 64);
  SGL_TILE_STORE(5, o + 256, 64);
  SGL_TILE_STORE(6, o + 512, 64);
  SGL_TILE_STORE(7, o + 768, 64);
  // O^T [16 d][16 rows] x 1 / l -> 16 rows of 16 d, bf16
  const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.f), l);
  for (int c = 0; c < kHeadDim / 16; ++c) {
    __m512 r[16];
    for (int dd = 0; dd < 16; ++dd) r[dd] = _mm512_mul_ps(_mm512_load_ps(o + (c * 16 + dd) * 16), inv);
    transpose16x16(r);
    for (int64_t i = 0; i < rows; ++i) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (r0 + i) * so0 + c * 16), _mm512_cvtepi32_epi16(bf16_bits(r[i])));
    }
  }
}

#endif  // SGL_HAVE_AMX

}  // namespace sgl_amx

bool prefill_attention_supported() {
#if defined(SGL_HAVE_AMX)
  // the CPU must have the tiles (CPUID leaf 7: EDX bit 24 AMX-TILE, bit 22 AMX-BF16; this build
  // also runs on AVX-512 CPUs without them) and the kernel must grant their use
  static const bool cpu_has_amx = [] {
    unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    return (edx & (1u << 24)) != 0 && (edx & (1u << 22)) != 0;
  }();
  return cpu_has_amx && sgl_amx::request_amx();
#else
  return false;
#endif
}

at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                             const std::optional<at::Tensor>& k_cache, const std::optional<at::Tensor>& v_cache,
                             const std::optional<at::Tensor>& prefix_slots, const std::optional<at::Tensor>& out_opt) {
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
  // `out` (optional): where the rows go, e.g. this sequence's rows of the batch's output
  at::Tensor out;
  if (out_opt.has_value() && out_opt->defined()) {
    out = *out_opt;
    TORCH_CHECK(out.scalar_type() == at::kBFloat16 && out.dim() == 3 && out.size(0) == n && out.size(1) == H &&
                    out.size(2) == kHeadDim && out.stride(2) == 1 && out.stride(1) == kHeadDim,
                "prefill_attention: out must be bfloat16 [n, heads, 64] with contiguous heads");
  } else {
    out = at::empty({n, H, kHeadDim}, q.options());
  }
  if (n == 0) return out;
  const int64_t G = H / Hk;
  const int64_t L = P + n;  // keys: the prefix, then the fresh ones
  const int64_t lpad = (L + kK - 1) / kK * kK;
  // Per kv head: K rows padded with zeros to lpad ([lpad][64] bf16) and V^T in blocks of 32 keys
  // ([lpad / 32][64 d][32 keys] bf16); per task, Q^T in d pairs ([32][16 rows] bf16 pairs).
  // 64-byte aligned: a tile row that straddles two cache lines makes every tile load slower
  const size_t buf_bytes = static_cast<size_t>(Hk * lpad * kHeadDim) * sizeof(uint16_t);
  AlignedBuffer kpad(buf_bytes), vt(buf_bytes);
  const uint16_t* kp = reinterpret_cast<const uint16_t*>(k.data_ptr<at::BFloat16>());
  const uint16_t* vp = reinterpret_cast<const uint16_t*>(v.data_ptr<at::BFloat16>());
  const int64_t sk0 = k.stride(0), sv0 = v.stride(0);
  at::parallel_for(0, Hk * (lpad / 32), 4, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t h = t / (lpad / 32), blk = t % (lpad / 32);
      uint16_t* vth = vt.data() + (h * (lpad / 32) + blk) * kHeadDim * 32;
      for (int g = 0; g < 2; ++g) {  // 16 keys at a time
        const uint16_t* vrows[16];
        for (int i = 0; i < 16; ++i) {
          const int64_t key = blk * 32 + g * 16 + i;
          vrows[i] = nullptr;
          if (key >= L) continue;
          const uint16_t* krow = key < P ? kc + (h * cache_rows + slots[key]) * kHeadDim : kp + (key - P) * sk0 + h * kHeadDim;
          vrows[i] = key < P ? vc + (h * cache_rows + slots[key]) * kHeadDim : vp + (key - P) * sv0 + h * kHeadDim;
          std::memcpy(kpad.data() + (h * lpad + key) * kHeadDim, krow, kHeadDim * 2);
        }
        // V^T: the 16 keys' rows as 32-bit d pairs, transposed, then split into even / odd d
        for (int wb = 0; wb < 2; ++wb) {
          __m512 r[16];
          for (int i = 0; i < 16; ++i) r[i] = vrows[i] ? _mm512_loadu_ps(vrows[i] + wb * 32) : _mm512_setzero_ps();
          transpose16x16(r);
          for (int w = 0; w < 16; ++w) {
            const int d = (wb * 16 + w) * 2;
            const __m512i pairs = _mm512_castps_si512(r[w]);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(vth + d * 32 + g * 16), _mm512_cvtepi32_epi16(pairs));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(vth + (d + 1) * 32 + g * 16),
                                _mm512_cvtepi32_epi16(_mm512_srli_epi32(pairs, 16)));
          }
        }
      }
    }
  });
  const int64_t nqb = (n + kQ - 1) / kQ;  // 16-row tasks
  std::vector<int64_t> order(nqb);
  for (int64_t i = 0, lo = 0, hi = nqb - 1; i < nqb; ++i) order[i] = (i % 2 == 0) ? lo++ : hi--;
  const uint16_t* qp = reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const int64_t sq0 = q.stride(0), so0 = out.stride(0);
  const float fscale = static_cast<float>(scale);
  at::parallel_for(0, H * nqb, 1, [&](int64_t b, int64_t e) {
    configure_tiles();
    // flush denormals to zero here: far-below-max scores give p ~ 2^-126 and below, where
    // denormal arithmetic would take microcode assists
    const unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);
    alignas(64) uint32_t qt[32 * 16];  // Q^T of the task's rows, in d pairs
    for (int64_t t = b; t < e; ++t) {
      // kv-head-major task order: a thread's consecutive tasks share one kv head's K / V (L2)
      const int64_t h = t / (G * nqb), rem = t % (G * nqb);
      const int64_t hq = h * G + rem % G, r0 = order[rem / G] * kQ;
      for (int wb = 0; wb < 2; ++wb) {  // Q^T in d pairs: 16 rows x 32 pairs -> 32 x 16
        __m512 r[16];
        for (int i = 0; i < kQ; ++i) {
          const int64_t row = r0 + i;
          r[i] = row < n ? _mm512_loadu_ps(qp + row * sq0 + hq * kHeadDim + wb * 32) : _mm512_setzero_ps();
        }
        transpose16x16(r);
        for (int w = 0; w < 16; ++w) _mm512_store_ps(reinterpret_cast<float*>(qt + (wb * 16 + w) * 16), r[w]);
      }
      attend_rows(qt, kpad.data() + h * lpad * kHeadDim, vt.data() + h * lpad * kHeadDim, n, r0, P, fscale,
                    op + hq * kHeadDim, so0);
    }
    _tile_release();
    _mm_setcsr(csr);
  });
  return out;
#else
  return at::Tensor();
#endif
}
