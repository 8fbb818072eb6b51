// The DSA CPU kernels, written once over a vector type V; included by each dsa_isa_<name>.cpp
// INSIDE an anonymous namespace after it defines:
//   struct V     the vector of W floats: zero, load, loadc (float / bf16 bits / FP8 codes, exact),
//                store, set1, fmadd, add, mul, max, exp, gt_mask (after dsa_fp8.h: FP8 tags, cvt)
//   HB_IDX, KVB_IDX   indexer register block: heads x key vectors
//   SGL_DSA_DPBF16    (optional macro) the build has AVX512-BF16: bf16 index scoring can use
//                     vdpbf16ps (DpScorer; HB_IDX_DP, IDX_GROUP_DP; IndexerArgs::bf16_dot); else
//                     bf16 scoring rounds the inputs to bf16 and multiplies them with float32 FMAs
//                     (FloatScorer<.., true>: the same exact products, summed in another order)
//   struct VI    int8 index scoring's W int32 lanes: PACK int8 dims per 32-bit word, dot (acc +=
//                the PACK products of each lane's q and k words), QOFF (offset added to the query
//                bytes: vpdpbusd multiplies u8 x s8), load, set1, to_float
//   HB_PV, VB_PV      sparse attention P.V register block: heads x value vectors
// Everything here has internal linkage (see dsa_args.h for why).
//
// Lightning indexer (`indexer_impl`): queries of one request are taken in groups of IDX_GROUP;
// their visible keys are gathered through the block table IDX_TILE at a time into a transposed
// float tile (keys in the vector lanes), scored for every query of the group with a register-
// blocked heads x keys micro-kernel (relu and the head weights applied in registers, so no
// [queries x keys] score matrix exists), and pushed into a per-query streaming top-k: a buffer of
// 4k candidates compacted to the best k when full (radix select of the k-th score), after which
// only scores above the k-th best pass a vector compare. Order: score descending, exact ties to the earlier
// position (a later key never displaces an equal score). Queries that see <= k keys and want no
// values are answered without scoring (all their keys are selected).
// Scorers: FloatScorer (float32, or bf16-rounded inputs), DpScorer (bf16 pairs, vdpbf16ps),
// Int8Scorer (per-row int8, integer dot products). Key rows are float32, bf16, an int8 cache (int8
// scoring) or FP8 e4m3 with per-block scales (DeepSeek-V3.2's index-key cache): each code is widened
// exactly and multiplied by its block's scale in float32 (`key_row`) where the scorers read it, so
// every scorer scores the widened keys (the torch reference's `widen_keys` does the same float32
// multiply).
//
// Sparse flash attention (`sparse_impl`): per query, its selected rows are attended SA_TILE at a
// time with an online softmax. q.k: heads in the vector lanes (the query transposed once,
// scaled), each key element broadcast, 8 keys per pass, rows read in place through their
// pointers (no copy of the gathered rows), the next pass's 8 rows prefetched meanwhile (one pass
// ahead: a whole tile ahead was slower). P.v: value dims in the lanes, a heads x value-vectors
// register block, p broadcast. Output and log-sum-exp in float32. FP8 rows (an FP8 latent cache):
// each code widened exactly (V::loadc, cvt), for q.k once per pass into a float32 scratch, for p.v
// in the vector loads; the layer's scale folded into the query (q.k) and the output (p.v).

constexpr int W = V::W;
constexpr unsigned FULL_MASK = (W == 32) ? ~0u : ((1u << W) - 1);
constexpr int IDX_TILE = 64;
constexpr int IDX_GROUP = 16;
constexpr int SA_TILE = 64;
constexpr int SA_KC = 8;
static_assert(IDX_TILE % (W * KVB_IDX) == 0, "indexer tile must be whole register passes");

template <typename X>
struct ABuf {
  X* p;
  explicit ABuf(size_t n) {
    size_t bytes = ((n * sizeof(X) + 63) / 64) * 64;
    p = static_cast<X*>(std::aligned_alloc(64, bytes ? bytes : 64));
  }
  ~ABuf() { std::free(p); }
  ABuf(const ABuf&) = delete;
  ABuf& operator=(const ABuf&) = delete;
};

inline float cvt(float x) { return x; }
inline float cvt(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline int64_t row_of(const int32_t* bt, int64_t bt_stride, int64_t bs, int32_t b, int64_t pos) {
  if (bs == 1) return bt[b * bt_stride + pos];
  return int64_t(bt[b * bt_stride + pos / bs]) * bs + pos % bs;
}

// ------------------------------------------------------------------------------------ indexer
struct Cand {
  float v;
  int32_t p;
};
struct CandBetter {
  bool operator()(const Cand& a, const Cand& b) const { return a.v > b.v || (a.v == b.v && a.p < b.p); }
};

struct CandEarlier {
  bool operator()(const Cand& a, const Cand& b) const { return a.p < b.p; }
};

// The k-th largest of n floats (1 <= k <= n) by radix select on their order-preserving 32-bit
// keys: three counting passes of 11 / 11 / 10 bits, each keeping only the keys whose digit holds
// the k-th (no comparisons to mispredict; std::nth_element on random scores costs ~3x more).
// `keys` holds n entries of scratch, `hist` 2048.
inline uint32_t order_key(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
inline float key_float(uint32_t k) {
  const uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}
inline float kth_largest(const Cand* c, int n, int k, uint32_t* keys, uint32_t* hist) {
  for (int i = 0; i < n; ++i) keys[i] = order_key(c[i].v);
  static constexpr int SHIFT[3] = {21, 10, 0}, BITS[3] = {11, 11, 10};
  uint32_t result = 0;
  int m = n, need = k;
  for (int pass = 0; pass < 3; ++pass) {
    const int sh = SHIFT[pass], nb = 1 << BITS[pass];
    const uint32_t dm = uint32_t(nb - 1);
    std::memset(hist, 0, sizeof(uint32_t) * size_t(nb));
    for (int i = 0; i < m; ++i) ++hist[(keys[i] >> sh) & dm];
    int b = nb - 1;
    for (; b > 0; --b) {
      if (int(hist[b]) >= need) break;
      need -= int(hist[b]);
    }
    result |= uint32_t(b) << sh;
    if (pass < 2) {  // keep the keys whose digit holds the k-th
      int w = 0;
      for (int i = 0; i < m; ++i) {
        const uint32_t x = keys[i];
        keys[w] = x;
        w += int(((x >> sh) & dm) == uint32_t(b));
      }
      m = w;
    }
  }
  return key_float(result);
}

// Streaming top-k of one query: candidates collect in a buffer of TOPK_SLACK * k; when it is full
// it is cut down to what can still be among the best k, and `thr` rejects later keys with a plain
// compare. A full buffer is cut at an estimated threshold t (`cut_estimate`): any t with at least k
// candidates >= t will do, as every candidate below t has k better ones, and so has every later
// key <= t (the k candidates are all earlier). t is read from a strided sample of the buffer a
// little below the k-th best's quantile and checked by counting; when the check fails (rare) or t
// would keep too many, and at the end (after an estimated cut has shrunk the buffer where it
// can), the cut is exact (`cut_exact`): the k-th best score by
// radix select (above), everything above it kept, and of the candidates equal to it the earliest
// positions up to k (later keys never beat an equal score). The estimate replaced an exact select
// per full buffer, which cost about as much as int8 scoring at k = 2048.
constexpr int TOPK_SLACK = 4;
constexpr int RADIX_HIST = 2048;
constexpr int TOPK_SAMPLE = 256;  // scores sampled per estimated cut (buffers of >= 4 x this)

struct StreamTopK {
  Cand* buf;
  Cand* ties;
  uint32_t* tmp;
  uint32_t* hist;
  int k, cap, cnt;
  float thr;
  void init(Cand* b, Cand* t, uint32_t* f, uint32_t* h, int kk) {
    buf = b;
    ties = t;
    tmp = f;
    hist = h;
    k = kk;
    cap = TOPK_SLACK * kk;
    cnt = 0;
    thr = -std::numeric_limits<float>::infinity();
  }
  void push(float v, int32_t p) {
    buf[cnt].v = v;
    buf[cnt].p = p;
    if (++cnt == cap) cut();
  }
  // n consecutive keys from position p0, all above thr (n <= room())
  void push_run(const float* v, int32_t p0, int n) {
    Cand* dst = buf + cnt;
    for (int i = 0; i < n; ++i) {
      dst[i].v = v[i];
      dst[i].p = p0 + i;
    }
    cnt += n;
    if (cnt == cap) cut();
  }
  int room() const { return cap - cnt; }
  void cut() {
    if (!cut_estimate(cnt / 2)) cut_exact();  // a cut must leave half the buffer free
  }
  // cut at an estimated threshold if that keeps between k and max_keep candidates
  bool cut_estimate(int max_keep) {
    constexpr int S = TOPK_SAMPLE;
    if (cnt < 4 * S) return false;
    float smp[S];
    const int step = cnt / S;
    for (int i = 0; i < S; ++i) smp[i] = buf[i * step + step / 2].v;
    // the sample's (r+1)-th best: expected share of the buffer >= t is (r+1)/S, k/cnt + 1/10 here
    const int r = std::min(S - 1, int((int64_t(S) * k + cnt - 1) / cnt) + S / 10 - 1);
    std::nth_element(smp, smp + r, smp + S, [](float x, float y) { return x > y; });
    const float t = smp[r];
    int ge = 0;
    for (int i = 0; i < cnt; ++i) ge += int(buf[i].v >= t);
    if (ge < k || ge > max_keep) return false;
    int w = 0;
    for (int i = 0; i < cnt; ++i) {
      const Cand c = buf[i];
      buf[w] = c;
      w += int(c.v >= t);
    }
    cnt = w;
    thr = t;
    return true;
  }
  void cut_exact() {
    const float t = kth_largest(buf, cnt, k, tmp, hist);
    int w = 0, nt = 0;
    for (int i = 0; i < cnt; ++i) {
      if (buf[i].v > t) buf[w++] = buf[i];
      else if (buf[i].v == t) ties[nt++] = buf[i];
    }
    const int need = k - w;  // >= 1: t is the k-th best
    if (nt > need) std::nth_element(ties, ties + (need - 1), ties + nt, CandEarlier());
    for (int i = 0; i < need && i < nt; ++i) buf[w++] = ties[i];
    cnt = w;
    thr = t;
  }
  void finish(int32_t* oi, float* ov) {
    if (cnt > k && !(cut_estimate(cnt - cnt / 4) && cnt == k)) cut_exact();  // the estimate shrinks the exact select's input
    const int n = cnt < k ? cnt : k;
    for (int i = 0; i < n; ++i) oi[i] = buf[i].p;
    for (int i = n; i < k; ++i) oi[i] = -1;
    if (ov) {
      for (int i = 0; i < n; ++i) ov[i] = buf[i].v;
      for (int i = n; i < k; ++i) ov[i] = -std::numeric_limits<float>::infinity();
    }
  }
};

// float -> bf16 bits, round to nearest even (what torch's .to(torch.bfloat16) does; NaN stays NaN)
inline uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline uint16_t bf16_bits(uint16_t b) { return b; }
inline float bf16_round(float f) { return cvt(bf16_bits(f)); }

inline float q_elem(const void* q, DType dt, int64_t i) {
  return dt == DType::BF16 ? cvt(static_cast<const uint16_t*>(q)[i]) : static_cast<const float*>(q)[i];
}

// key row r (elements kr) widened to float32: FP8 codes times their block's scale (float32
// multiplies, as the reference's widen_keys; W codes per vector load), other dtypes exactly
template <typename EK>
inline void key_row(const IndexerArgs& a, const EK* kr, int64_t r, int D, float* out) {
  if constexpr (is_fp8<EK>) {
    const float* s = a.key_scale + r * a.key_scale_stride;
    const int blk = a.key_scale_block;
    for (int d0 = 0, i = 0; d0 < D; d0 += blk, ++i) {
      const float sc = s[i];
      const typename V::R sv = V::set1(sc);
      const int e = d0 + blk < D ? d0 + blk : D;
      int d = d0;
      for (; d + W <= e; d += W) V::store(out + d, V::mul(V::loadc(kr + d), sv));
      for (; d < e; ++d) out[d] = cvt(kr[d]) * sc;
    }
  } else {
    for (int d = 0; d < D; ++d) out[d] = cvt(kr[d]);
  }
}

template <int HB>
inline void idx_heads(const float* qf, const float* w, int h0, int D, const float* ktp, typename V::R* s) {
  typename V::R acc[HB][KVB_IDX];
  for (int hb = 0; hb < HB; ++hb)
    for (int i = 0; i < KVB_IDX; ++i) acc[hb][i] = V::zero();
  for (int d = 0; d < D; ++d) {
    typename V::R kv[KVB_IDX];
    for (int i = 0; i < KVB_IDX; ++i) kv[i] = V::load(ktp + d * IDX_TILE + i * W);
    for (int hb = 0; hb < HB; ++hb) {
      typename V::R qb = V::set1(qf[(h0 + hb) * D + d]);
      for (int i = 0; i < KVB_IDX; ++i) acc[hb][i] = V::fmadd(qb, kv[i], acc[hb][i]);
    }
  }
  for (int hb = 0; hb < HB; ++hb) {
    typename V::R wb = V::set1(w[h0 + hb]);
    for (int i = 0; i < KVB_IDX; ++i) s[i] = V::fmadd(V::max(acc[hb][i], V::zero()), wb, s[i]);
  }
}

// Float scoring: q and the key tile in float32 (with SB, values rounded to bf16 first: the
// products of two bf16 values are exact in float32, so this is the bf16 path's math on a build
// without vdpbf16ps, up to the order of the float32 sums).
template <typename EK, bool SB>
struct FloatScorer {
  static constexpr int GROUP = IDX_GROUP;
  int N, D;
  ABuf<float> qf, kt, row;
  FloatScorer(int n, int d, int64_t)
      : N(n), D(d), qf(size_t(GROUP) * n * d), kt(size_t(d) * IDX_TILE), row(is_fp8<EK> ? d : 1) {}
  void query(int gi, const IndexerArgs& a, int64_t t) {
    float* dst = qf.p + size_t(gi) * N * D;
    for (int h = 0; h < N; ++h)
      for (int d = 0; d < D; ++d) {
        const float x = q_elem(a.q, a.q_dtype, t * a.q_stride_t + h * a.q_stride_h + d);
        dst[h * D + d] = SB ? bf16_round(x) : x;
      }
  }
  void tile(const IndexerArgs& a, const EK* keys, int32_t b, int64_t k0, int nk) {
    for (int j = 0; j < nk; ++j) {
      const int64_t r = row_of(a.block_table, a.bt_stride, a.block_size, b, k0 + j);
      const EK* kr = keys + r * a.keys.row_stride;
      if constexpr (is_fp8<EK>) {
        key_row(a, kr, r, D, row.p);
        for (int d = 0; d < D; ++d) kt.p[d * IDX_TILE + j] = SB ? bf16_round(row.p[d]) : row.p[d];
      } else {
        for (int d = 0; d < D; ++d) kt.p[d * IDX_TILE + j] = SB ? cvt(bf16_bits(kr[d])) : cvt(kr[d]);
      }
    }
    if (nk < IDX_TILE)
      for (int d = 0; d < D; ++d)
        for (int j = nk; j < IDX_TILE; ++j) kt.p[d * IDX_TILE + j] = 0.f;
  }
  // scores of query gi against the tile's first `nvis` keys (rounded up to whole passes)
  void score(int gi, const float* w, float* sc, int nvis) const {
    constexpr int PASS = W * KVB_IDX;
    const float* q = qf.p + size_t(gi) * N * D;
    for (int jp = 0; jp < nvis; jp += PASS) {
      typename V::R s[KVB_IDX];
      for (int i = 0; i < KVB_IDX; ++i) s[i] = V::zero();
      int h = 0;
      for (; h + HB_IDX <= N; h += HB_IDX) idx_heads<HB_IDX>(q, w, h, D, kt.p + jp, s);
      for (; h < N; ++h) idx_heads<1>(q, w, h, D, kt.p + jp, s);
      for (int i = 0; i < KVB_IDX; ++i) V::store(sc + jp + i * W, s[i]);
    }
  }
};

#ifdef SGL_DSA_DPBF16
// bf16 scoring with vdpbf16ps: q and keys as bf16 pairs (d = 2p, 2p + 1) in one 32-bit word; the
// tile holds pair p of 64 keys contiguously (keys in the lanes), a query's pair is broadcast, and
// each instruction adds both products of a pair to a float32 accumulator (16 keys x 2 dims).
// Needs an even head dim (the driver falls back to FloatScorer<.., true> otherwise).
template <int HB>
inline void idx_heads_dp(const uint32_t* qp, const float* w, int h0, int P, const uint32_t* ktp, __m512* s) {
  __m512 acc[HB][KVB_IDX];
  for (int hb = 0; hb < HB; ++hb)
    for (int i = 0; i < KVB_IDX; ++i) acc[hb][i] = _mm512_setzero_ps();
  for (int p = 0; p < P; ++p) {
    __m512bh kv[KVB_IDX];
    for (int i = 0; i < KVB_IDX; ++i) kv[i] = (__m512bh)_mm512_load_si512(ktp + p * IDX_TILE + i * W);
    for (int hb = 0; hb < HB; ++hb) {
      const __m512bh qb = (__m512bh)_mm512_set1_epi32(int(qp[(h0 + hb) * P + p]));
      for (int i = 0; i < KVB_IDX; ++i) acc[hb][i] = _mm512_dpbf16_ps(acc[hb][i], kv[i], qb);
    }
  }
  for (int hb = 0; hb < HB; ++hb) {
    const __m512 wb = _mm512_set1_ps(w[h0 + hb]);
    for (int i = 0; i < KVB_IDX; ++i) s[i] = _mm512_fmadd_ps(_mm512_max_ps(acc[hb][i], _mm512_setzero_ps()), wb, s[i]);
  }
}

template <typename EK>
struct DpScorer {
  static constexpr int GROUP = IDX_GROUP_DP;
  int N, D, P;
  ABuf<uint32_t> qp, kt;
  DpScorer(int n, int d, int64_t) : N(n), D(d), P(d / 2), qp(size_t(GROUP) * n * (d / 2)), kt(size_t(d / 2) * IDX_TILE) {}
  void query(int gi, const IndexerArgs& a, int64_t t) {
    uint32_t* dst = qp.p + size_t(gi) * N * P;
    for (int h = 0; h < N; ++h) {
      const int64_t o = t * a.q_stride_t + h * a.q_stride_h;
      for (int p = 0; p < P; ++p) {
        const uint32_t lo = bf16_bits(q_elem(a.q, a.q_dtype, o + 2 * p));
        const uint32_t hi = bf16_bits(q_elem(a.q, a.q_dtype, o + 2 * p + 1));
        dst[h * P + p] = lo | (hi << 16);
      }
    }
  }
  void tile(const IndexerArgs& a, const EK* keys, int32_t b, int64_t k0, int nk) {
    for (int j = 0; j < nk; ++j) {
      const EK* kr = keys + row_of(a.block_table, a.bt_stride, a.block_size, b, k0 + j) * a.keys.row_stride;
      if constexpr (sizeof(EK) == 2) {  // bf16 rows: the pairs are the row's 32-bit words
        for (int p = 0; p < P; ++p) {
          uint32_t u;
          std::memcpy(&u, kr + 2 * p, 4);
          kt.p[p * IDX_TILE + j] = u;
        }
      } else {
        for (int p = 0; p < P; ++p)
          kt.p[p * IDX_TILE + j] = uint32_t(bf16_bits(kr[2 * p])) | (uint32_t(bf16_bits(kr[2 * p + 1])) << 16);
      }
    }
    if (nk < IDX_TILE)
      for (int p = 0; p < P; ++p)
        for (int j = nk; j < IDX_TILE; ++j) kt.p[p * IDX_TILE + j] = 0u;
  }
  void score(int gi, const float* w, float* sc, int nvis) const {
    constexpr int PASS = W * KVB_IDX;
    const uint32_t* q = qp.p + size_t(gi) * N * P;
    for (int jp = 0; jp < nvis; jp += PASS) {
      __m512 s[KVB_IDX];
      for (int i = 0; i < KVB_IDX; ++i) s[i] = _mm512_setzero_ps();
      int h = 0;
      for (; h + HB_IDX_DP <= N; h += HB_IDX_DP) idx_heads_dp<HB_IDX_DP>(q, w, h, P, kt.p + jp, s);
      for (; h < N; ++h) idx_heads_dp<1>(q, w, h, P, kt.p + jp, s);
      for (int i = 0; i < KVB_IDX; ++i) _mm512_store_ps(sc + jp + i * W, s[i]);
    }
  }
};
#endif

// ---------------------------------------------------------------------------- int8 scoring
// Symmetric per-row int8, the float32 ops of the torch reference's `quantize_int8`: scale =
// amax / 127, x8 = round-half-even(x * (127 / amax)) within +-127 (all 0 when amax is 0).
inline float quantize_i8(const float* x, int D, int8_t* out) {
  typename V::R m = V::zero();
  int d = 0;
  for (; d + W <= D; d += W) {
    const typename V::R v = V::load(x + d);
    m = V::max(m, V::max(v, V::sub(V::zero(), v)));
  }
  float lanes[W], amax = 0.f;
  V::store(lanes, m);
  for (int i = 0; i < W; ++i) amax = std::max(amax, lanes[i]);
  for (; d < D; ++d) amax = std::max(amax, std::fabs(x[d]));
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  for (d = 0; d < D; ++d) out[d] = int8_t(std::nearbyint(std::min(127.f, std::max(-127.f, x[d] * inv))));
  return amax / 127.f;
}

// VI::PACK int8 values in one 32-bit word (bytes or int16 halves), each plus `off` (0 or VI::QOFF)
inline int32_t pack_i8(const int8_t* x, int off) {
  if constexpr (VI::PACK == 4) {  // the bytes as they lie (little-endian); + 128 flips each byte's top bit
    uint32_t u;
    std::memcpy(&u, x, 4);
    return int32_t(off == 128 ? u ^ 0x80808080u : u);
  }
  constexpr int B = 32 / VI::PACK;
  constexpr uint32_t M = (1u << B) - 1u;
  uint32_t u = 0;
  for (int i = 0; i < VI::PACK; ++i) u |= (uint32_t(int32_t(x[i]) + off) & M) << (i * B);
  return int32_t(u);
}

template <int HB>
inline void idx_heads_i8(const int32_t* qw, const float* ws, int h0, int P, const int32_t* ktp, const int32_t* kcp,
                         typename V::R* s) {
  typename VI::R acc[HB][KVB_IDX];
  for (int hb = 0; hb < HB; ++hb)
    for (int i = 0; i < KVB_IDX; ++i) acc[hb][i] = VI::load(kcp + i * W);
  for (int p = 0; p < P; ++p) {
    typename VI::R kv[KVB_IDX];
    for (int i = 0; i < KVB_IDX; ++i) kv[i] = VI::load(ktp + p * IDX_TILE + i * W);
    for (int hb = 0; hb < HB; ++hb) {
      const typename VI::R qb = VI::set1(qw[(h0 + hb) * P + p]);
      for (int i = 0; i < KVB_IDX; ++i) acc[hb][i] = VI::dot(acc[hb][i], qb, kv[i]);
    }
  }
  for (int hb = 0; hb < HB; ++hb) {
    const typename V::R wb = V::set1(ws[h0 + hb]);
    for (int i = 0; i < KVB_IDX; ++i) s[i] = V::fmadd(V::max(VI::to_float(acc[hb][i]), V::zero()), wb, s[i]);
  }
}

// int8 scoring: every query head row and key row quantized (quantize_i8; an int8 key cache brings
// its rows' scales), exact integer dot products (VI), and score = s_k * sum_h (w_h * s_qh) *
// relu(dot_h) in float32 (the scales are positive, so relu commutes with them). A request's keys
// are quantized and packed once, the first time a query group reaches them, and kept for the next
// groups of the same request (O(keys) memory: 64 + 8 bytes per key at D = 64 with vpdpbusd): tile
// i holds word p of its 64 keys contiguously (keys in the lanes), each key's scale, and each key's
// accumulator start -QOFF * sum(k) (which takes the query bytes' offset back out).
template <typename EK>
struct Int8Scorer {
  static constexpr int GROUP = IDX_GROUP;
  int N, D, P;
  int64_t tiles;
  ABuf<int32_t> qw, kt, kc;
  ABuf<float> ws, ks, row;
  ABuf<int8_t> r8;
  int32_t req = -1;    // the request whose keys kt / kc / ks hold
  int64_t built = 0;   // ... positions [0, built) of it
  int64_t cur = 0;     // the tile `score` reads
  Int8Scorer(int n, int d, int64_t max_keys)
      : N(n), D(d), P((d + VI::PACK - 1) / VI::PACK), tiles((max_keys + IDX_TILE - 1) / IDX_TILE),
        qw(size_t(GROUP) * n * P), kt(size_t(tiles) * P * IDX_TILE), kc(size_t(tiles) * IDX_TILE),
        ws(size_t(GROUP) * n), ks(size_t(tiles) * IDX_TILE), row(d), r8(size_t(P) * VI::PACK) {
    std::memset(r8.p, 0, size_t(P) * VI::PACK);  // the pad past D stays 0
  }
  void query(int gi, const IndexerArgs& a, int64_t t) {
    for (int h = 0; h < N; ++h) {
      const int64_t o = t * a.q_stride_t + h * a.q_stride_h;
      for (int d = 0; d < D; ++d) row.p[d] = q_elem(a.q, a.q_dtype, o + d);
      ws.p[gi * N + h] = a.w[t * N + h] * quantize_i8(row.p, D, r8.p);
      int32_t* dst = qw.p + (size_t(gi) * N + h) * P;
      for (int p = 0; p < P; ++p) dst[p] = pack_i8(r8.p + p * VI::PACK, VI::QOFF);
    }
  }
  void key(const IndexerArgs& a, const EK* keys, int32_t b, int64_t pos) {
    const int64_t r = row_of(a.block_table, a.bt_stride, a.block_size, b, pos);
    const EK* kr = keys + r * a.keys.row_stride;
    const int64_t ti = pos / IDX_TILE, j = ti * IDX_TILE + pos % IDX_TILE;
    if constexpr (std::is_same_v<EK, int8_t>) {  // an int8 key cache
      std::memcpy(r8.p, kr, size_t(D));
      ks.p[j] = a.key_scale[r * a.key_scale_stride];
    } else {  // (FP8 keys: the widened row, quantized like any other)
      key_row(a, kr, r, D, row.p);
      ks.p[j] = quantize_i8(row.p, D, r8.p);
    }
    int32_t sum = 0;
    for (int d = 0; d < D; ++d) sum += r8.p[d];
    kc.p[j] = -VI::QOFF * sum;
    int32_t* dst = kt.p + ti * P * IDX_TILE + pos % IDX_TILE;
    for (int p = 0; p < P; ++p) dst[p * IDX_TILE] = pack_i8(r8.p + p * VI::PACK, 0);
  }
  void tile(const IndexerArgs& a, const EK* keys, int32_t b, int64_t k0, int nk) {
    if (b != req) {
      req = b;
      built = 0;
    }
    for (; built < k0 + nk; ++built) key(a, keys, b, built);  // k0 <= built: tiles come in order from 0
    cur = k0 / IDX_TILE;  // lanes past nk hold another request's keys or garbage: their scores are unused
  }
  void score(int gi, const float*, float* sc, int nvis) const {  // the head weights are in ws
    constexpr int PASS = W * KVB_IDX;
    const int32_t* q = qw.p + size_t(gi) * N * P;
    const float* w = ws.p + size_t(gi) * N;
    const int32_t* kt0 = kt.p + cur * P * IDX_TILE;
    const int32_t* kc0 = kc.p + cur * IDX_TILE;
    const float* ks0 = ks.p + cur * IDX_TILE;
    for (int jp = 0; jp < nvis; jp += PASS) {
      typename V::R s[KVB_IDX];
      for (int i = 0; i < KVB_IDX; ++i) s[i] = V::zero();
      int h = 0;
      for (; h + HB_IDX <= N; h += HB_IDX) idx_heads_i8<HB_IDX>(q, w, h, P, kt0 + jp, kc0 + jp, s);
      for (; h < N; ++h) idx_heads_i8<1>(q, w, h, P, kt0 + jp, kc0 + jp, s);
      for (int i = 0; i < KVB_IDX; ++i) V::store(sc + jp + i * W, V::mul(s[i], V::load(ks0 + jp + i * W)));
    }
  }
};

template <typename EK, typename Scorer>
void indexer_run(const IndexerArgs& a, int64_t t0, int64_t t1) {
  constexpr int G = Scorer::GROUP;
  const int N = a.n_heads, D = a.head_dim, K = a.topk;
  const EK* keys = static_cast<const EK*>(a.keys.base);
  int64_t max_keys = 0;  // of any query in the range (Int8Scorer keeps a request's quantized keys)
  for (int64_t t = t0; t < t1; ++t) max_keys = a.kv_end[t] > max_keys ? a.kv_end[t] : max_keys;
  Scorer sc_(N, D, max_keys);
  ABuf<float> sc(IDX_TILE);
  ABuf<Cand> cands(size_t(G) * TOPK_SLACK * K), ties(size_t(TOPK_SLACK) * K);
  ABuf<uint32_t> tmp(size_t(TOPK_SLACK) * K), hist(RADIX_HIST);
  StreamTopK tk[G];
  int64_t ts[G];
  int64_t t = t0;
  while (t < t1) {
    const int32_t end0 = a.kv_end[t];
    if (end0 <= K && a.out_val == nullptr) {  // every visible key is selected
      int32_t* oi = a.out_idx + t * K;
      for (int i = 0; i < K; ++i) oi[i] = i < end0 ? i : -1;
      ++t;
      continue;
    }
    const int32_t b = a.q_batch[t];
    int g = 0;
    int32_t kmax = 0;
    while (t < t1 && g < G && a.q_batch[t] == b && (a.kv_end[t] > K || a.out_val != nullptr)) {
      ts[g] = t;
      if (a.kv_end[t] > kmax) kmax = a.kv_end[t];
      ++g;
      ++t;
    }
    for (int gi = 0; gi < g; ++gi) {
      sc_.query(gi, a, ts[gi]);
      tk[gi].init(cands.p + size_t(gi) * TOPK_SLACK * K, ties.p, tmp.p, hist.p, K);
    }
    for (int64_t k0 = 0; k0 < kmax; k0 += IDX_TILE) {
      const int nk = int(kmax - k0 < IDX_TILE ? kmax - k0 : IDX_TILE);
      sc_.tile(a, keys, b, k0, nk);
      for (int gi = 0; gi < g; ++gi) {
        const int64_t vis = a.kv_end[ts[gi]] - k0;
        if (vis <= 0) continue;
        const int nvis = int(vis < nk ? vis : nk);
        sc_.score(gi, a.w + ts[gi] * N, sc.p, nvis);
        StreamTopK& s = tk[gi];
        for (int jv = 0; jv < nvis; jv += W) {
          unsigned mask = V::gt_mask(V::load(sc.p + jv), V::set1(s.thr));
          if (mask == FULL_MASK && jv + W <= nvis && s.room() >= W) {  // e.g. every key until the first cut
            s.push_run(sc.p + jv, int32_t(k0 + jv), W);
            continue;
          }
          while (mask) {
            const int j = jv + __builtin_ctz(mask);
            mask &= mask - 1;
            if (j >= nvis) break;
            s.push(sc.p[j], int32_t(k0 + j));
          }
        }
      }
    }
    for (int gi = 0; gi < g; ++gi)
      tk[gi].finish(a.out_idx + ts[gi] * K, a.out_val ? a.out_val + ts[gi] * K : nullptr);
  }
}

template <typename EK>
void indexer_keys(const IndexerArgs& a, int64_t t0, int64_t t1) {
  if constexpr (std::is_same_v<EK, int8_t>) {  // int8 key rows: int8 scoring only (the binding checks)
    return indexer_run<EK, Int8Scorer<EK>>(a, t0, t1);
  } else {
    if (a.score == Score::INT8) return indexer_run<EK, Int8Scorer<EK>>(a, t0, t1);
    if (a.score == Score::F32) return indexer_run<EK, FloatScorer<EK, false>>(a, t0, t1);
#ifdef SGL_DSA_DPBF16
    if constexpr (!is_fp8<EK>)  // (FP8 keys: their widened, scaled values rounded by FloatScorer)
      if (a.bf16_dot && a.head_dim % 2 == 0) return indexer_run<EK, DpScorer<EK>>(a, t0, t1);
#endif
    indexer_run<EK, FloatScorer<EK, true>>(a, t0, t1);
  }
}

inline void indexer_impl(const IndexerArgs& a, int64_t t0, int64_t t1) {
  if (a.topk <= 0) return;
  if (a.k_dtype == DType::I8) indexer_keys<int8_t>(a, t0, t1);
  else if (a.k_dtype == DType::E4M3) indexer_keys<fp8_e4m3>(a, t0, t1);
  else if (a.k_dtype == DType::BF16) indexer_keys<uint16_t>(a, t0, t1);
  else indexer_keys<float>(a, t0, t1);
}

// ------------------------------------------------------------------------- sparse attention
template <typename KR>
inline void sa_qk_chunk(const float* qT, int Hp, int HV, int Dk, int Dr, const KR* const* kr, const KR* const* rr,
                        float* S, int kc, const KR* const* pk, const KR* const* pr) {
  constexpr int LINE = 64 / int(sizeof(KR));
  for (int hv = 0; hv < HV; ++hv) {
    typename V::R acc[SA_KC];
    for (int c = 0; c < SA_KC; ++c) acc[c] = V::zero();
    const float* qp = qT + hv * W;
    for (int d = 0; d < Dk; ++d) {
      if (hv == 0 && d % LINE == 0)
        for (int c = 0; c < SA_KC; ++c) __builtin_prefetch(pk[c] + d);
      typename V::R qv = V::load(qp + size_t(d) * Hp);
      for (int c = 0; c < SA_KC; ++c) acc[c] = V::fmadd(qv, V::set1(cvt(kr[c][d])), acc[c]);
    }
    qp += size_t(Dk) * Hp;
    for (int d = 0; d < Dr; ++d) {
      if (hv == 0 && d % LINE == 0)
        for (int c = 0; c < SA_KC; ++c) __builtin_prefetch(pr[c] + d);
      typename V::R qv = V::load(qp + size_t(d) * Hp);
      for (int c = 0; c < SA_KC; ++c) acc[c] = V::fmadd(qv, V::set1(cvt(rr[c][d])), acc[c]);
    }
    for (int c = 0; c < kc; ++c) V::store(S + size_t(c) * Hp + hv * W, acc[c]);
  }
}

template <int HB, typename KR>
inline void sa_pv_block(float* O, int Dv, int h0, const float* P, int Hp, const KR* const* vr, int nk) {
  int v = 0;
  for (; v + VB_PV * W <= Dv; v += VB_PV * W) {
    typename V::R acc[HB][VB_PV];
    for (int hb = 0; hb < HB; ++hb)
      for (int i = 0; i < VB_PV; ++i) acc[hb][i] = V::load(O + size_t(h0 + hb) * Dv + v + i * W);
    for (int j = 0; j < nk; ++j) {
      typename V::R vv[VB_PV];
      for (int i = 0; i < VB_PV; ++i) vv[i] = V::loadc(vr[j] + v + i * W);
      for (int hb = 0; hb < HB; ++hb) {
        typename V::R pb = V::set1(P[size_t(j) * Hp + h0 + hb]);
        for (int i = 0; i < VB_PV; ++i) acc[hb][i] = V::fmadd(pb, vv[i], acc[hb][i]);
      }
    }
    for (int hb = 0; hb < HB; ++hb)
      for (int i = 0; i < VB_PV; ++i) V::store(O + size_t(h0 + hb) * Dv + v + i * W, acc[hb][i]);
  }
  for (; v + W <= Dv; v += W) {
    typename V::R acc[HB];
    for (int hb = 0; hb < HB; ++hb) acc[hb] = V::load(O + size_t(h0 + hb) * Dv + v);
    for (int j = 0; j < nk; ++j) {
      typename V::R vv = V::loadc(vr[j] + v);
      for (int hb = 0; hb < HB; ++hb) acc[hb] = V::fmadd(V::set1(P[size_t(j) * Hp + h0 + hb]), vv, acc[hb]);
    }
    for (int hb = 0; hb < HB; ++hb) V::store(O + size_t(h0 + hb) * Dv + v, acc[hb]);
  }
  for (; v < Dv; ++v)
    for (int hb = 0; hb < HB; ++hb) {
      float s = O[size_t(h0 + hb) * Dv + v];
      for (int j = 0; j < nk; ++j) s += P[size_t(j) * Hp + h0 + hb] * cvt(vr[j][v]);
      O[size_t(h0 + hb) * Dv + v] = s;
    }
}

// FP8 codes [n] widened to float32 (W per vector load), for the q.k of a chunk of FP8 rows
template <typename F>
inline void widen_fp8(const F* src, int n, float* dst) {
  int d = 0;
  for (; d + W <= n; d += W) V::store(dst + d, V::loadc(src + d));
  for (; d < n; ++d) dst[d] = cvt(src[d]);
}

// E: the query's element type; KR: the rows' (E, or an FP8 tag: then times a.kv_scale; q.k runs on
// each chunk's rows widened once into a float32 scratch, p.v widens in its vector loads)
template <typename E, typename KR>
void sparse_impl(const SparseAttnArgs& a, int64_t t0, int64_t t1) {
  const int N = a.n_heads, Dk = a.dk, Dr = a.key_rope.base ? a.dr : 0, Dv = a.dv, K = a.topk;
  const int Hp = (N + W - 1) / W * W, HV = Hp / W, Dq = Dk + Dr;
  const float ninf = -std::numeric_limits<float>::infinity();
  const E* q = static_cast<const E*>(a.q);
  const E* qr = static_cast<const E*>(a.q_rope);
  const KR* kbase = static_cast<const KR*>(a.key.base);
  const KR* rbase = static_cast<const KR*>(a.key_rope.base);
  const KR* vbase = static_cast<const KR*>(a.value.base);
  const float qk_scale = a.scale * a.kv_scale;  // the rows' scale: into the query here, the output below
  ABuf<float> qT(size_t(Dq) * Hp), S(size_t(SA_TILE) * Hp), O(size_t(N) * Dv), m(Hp), l(Hp), alpha(Hp);
  ABuf<int64_t> rows(K > 0 ? K : 1);
  ABuf<float> wide(is_fp8<KR> ? size_t(SA_KC) * Dq : 1);  // FP8: a chunk's widened [latent ; rope] rows
  const KR* kr[SA_TILE + SA_KC];
  const KR* rr[SA_TILE + SA_KC];
  const KR* vr[SA_TILE];
  for (int64_t t = t0; t < t1; ++t) {
    const int32_t b = a.q_batch[t];
    const int64_t kvl = a.kv_limit[t];
    const int32_t* idx = a.indices + t * a.idx_stride;
    int nvalid = 0;
    for (int i = 0; i < K; ++i) {
      const int64_t p = idx[i];
      if (p >= 0 && p < kvl) rows.p[nvalid++] = row_of(a.block_table, a.bt_stride, a.block_size, b, p);
    }
    float* out_t = a.out + t * int64_t(N) * Dv;
    float* lse_t = a.lse + t * int64_t(N);
    if (nvalid == 0) {
      std::memset(out_t, 0, sizeof(float) * size_t(N) * Dv);
      for (int h = 0; h < N; ++h) lse_t[h] = ninf;
      continue;
    }
    const E* qt = q + t * a.q_stride_t;
    const E* qrt = qr ? qr + t * a.qr_stride_t : nullptr;
    for (int d = 0; d < Dq; ++d)
      for (int h = 0; h < Hp; ++h) {
        float x = 0.f;
        if (h < N) x = d < Dk ? cvt(qt[h * a.q_stride_h + d]) : cvt(qrt[h * a.qr_stride_h + (d - Dk)]);
        qT.p[size_t(d) * Hp + h] = x * qk_scale;
      }
    std::memset(O.p, 0, sizeof(float) * size_t(N) * Dv);
    for (int h = 0; h < Hp; ++h) {
      m.p[h] = ninf;
      l.p[h] = 0.f;
    }
    for (int i0 = 0; i0 < nvalid; i0 += SA_TILE) {
      const int nk = nvalid - i0 < SA_TILE ? nvalid - i0 : SA_TILE;
      for (int j = 0; j < nk; ++j) {
        const int64_t r = rows.p[i0 + j];
        kr[j] = kbase + r * a.key.row_stride;
        rr[j] = rbase ? rbase + r * a.key_rope.row_stride : kr[j];
        vr[j] = vbase + r * a.value.row_stride;
      }
      for (int j = nk; j < nk + SA_KC; ++j) {  // padding pointers for the last partial chunk
        kr[j] = kr[0];
        rr[j] = rr[0];
      }
      for (int j0 = 0; j0 < nk; j0 += SA_KC) {
        const int kc = nk - j0 < SA_KC ? nk - j0 : SA_KC;
        // prefetch the next chunk's rows (the next tile's first rows after the last chunk) while
        // this one computes: the rows come from all over the latent cache (L3 / memory)
        const KR* pk[SA_KC];
        const KR* pr[SA_KC];
        for (int c = 0; c < SA_KC; ++c) {
          const int nj = i0 + j0 + SA_KC + c;
          const int64_t r = nj < nvalid ? rows.p[nj] : rows.p[i0];
          pk[c] = kbase + r * a.key.row_stride;
          pr[c] = rbase ? rbase + r * a.key_rope.row_stride : pk[c];
        }
        if constexpr (is_fp8<KR>) {
          const float* fk[SA_KC];
          const float* fr[SA_KC];
          for (int c = 0; c < SA_KC; ++c) {
            for (int d = 0; d < Dk + Dr; d += 64) __builtin_prefetch(d < Dk ? pk[c] + d : pr[c] + (d - Dk));
            float* w = wide.p + size_t(c) * Dq;
            widen_fp8(kr[j0 + c], Dk, w);
            widen_fp8(rr[j0 + c], Dr, w + Dk);
            fk[c] = w;
            fr[c] = w + Dk;
          }
          sa_qk_chunk<float>(qT.p, Hp, HV, Dk, Dr, fk, fr, S.p + size_t(j0) * Hp, kc, fk, fr);
        } else {
          sa_qk_chunk<KR>(qT.p, Hp, HV, Dk, Dr, kr + j0, rr + j0, S.p + size_t(j0) * Hp, kc, pk, pr);
        }
      }
      // online softmax over the tile (heads in lanes)
      for (int hv = 0; hv < HV; ++hv) {
        float* sp = S.p + hv * W;
        typename V::R mt = V::set1(ninf);
        for (int j = 0; j < nk; ++j) mt = V::max(mt, V::load(sp + size_t(j) * Hp));
        typename V::R mold = V::load(m.p + hv * W);
        typename V::R mnew = V::max(mold, mt);
        typename V::R al = V::exp(V::sub(mold, mnew));
        typename V::R ls = V::zero();
        for (int j = 0; j < nk; ++j) {
          typename V::R p = V::exp(V::sub(V::load(sp + size_t(j) * Hp), mnew));
          V::store(sp + size_t(j) * Hp, p);
          ls = V::add(ls, p);
        }
        V::store(l.p + hv * W, V::add(V::mul(V::load(l.p + hv * W), al), ls));
        V::store(m.p + hv * W, mnew);
        V::store(alpha.p + hv * W, al);
      }
      if (i0 > 0)
        for (int h = 0; h < N; ++h) {
          typename V::R ah = V::set1(alpha.p[h]);
          float* o = O.p + size_t(h) * Dv;
          int v = 0;
          for (; v + W <= Dv; v += W) V::store(o + v, V::mul(V::load(o + v), ah));
          for (; v < Dv; ++v) o[v] *= alpha.p[h];
        }
      int h = 0;
      for (; h + HB_PV <= N; h += HB_PV) sa_pv_block<HB_PV, KR>(O.p, Dv, h, S.p, Hp, vr, nk);
      for (; h < N; ++h) sa_pv_block<1, KR>(O.p, Dv, h, S.p, Hp, vr, nk);
    }
    for (int hh = 0; hh < N; ++hh) {
      const float inv = a.kv_scale / l.p[hh];
      const float* o = O.p + size_t(hh) * Dv;
      float* dst = out_t + size_t(hh) * Dv;
      typename V::R iv = V::set1(inv);
      int v = 0;
      for (; v + W <= Dv; v += W) V::store(dst + v, V::mul(V::load(o + v), iv));
      for (; v < Dv; ++v) dst[v] = o[v] * inv;
      lse_t[hh] = m.p[hh] + std::log(l.p[hh]);
    }
  }
}

// ------------------------------------------------------------------------------------ merge
inline void merge_impl(const MergeArgs& a, int64_t r0, int64_t r1) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const int P = a.parts;
  const int64_t D = a.dim;
  ABuf<float> wts(P > 0 ? P : 1);
  for (int64_t r = r0; r < r1; ++r) {
    float mx = ninf;
    for (int p = 0; p < P; ++p) mx = a.lses[p][r] > mx ? a.lses[p][r] : mx;
    float* o = a.out + r * D;
    if (mx == ninf) {
      std::memset(o, 0, sizeof(float) * size_t(D));
      a.lse[r] = ninf;
      continue;
    }
    float total = 0.f;
    for (int p = 0; p < P; ++p) {
      wts.p[p] = std::exp(a.lses[p][r] - mx);
      total += wts.p[p];
    }
    const float inv = 1.f / total;
    int64_t d = 0;
    for (; d + W <= D; d += W) {
      typename V::R acc = V::zero();
      for (int p = 0; p < P; ++p) acc = V::fmadd(V::set1(wts.p[p] * inv), V::load(a.outs[p] + r * D + d), acc);
      V::store(o + d, acc);
    }
    for (; d < D; ++d) {
      float s = 0.f;
      for (int p = 0; p < P; ++p) s += wts.p[p] * inv * a.outs[p][r * D + d];
      o[d] = s;
    }
    a.lse[r] = mx + std::log(total);
  }
}
