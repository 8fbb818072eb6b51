// The DSA CPU kernels, written once over a vector type V; included by each dsa_isa_<name>.cpp
// INSIDE an anonymous namespace after it defines:
//   struct V     the vector of W floats: zero, load, loadc (float / bf16 bits), store, set1, fmadd,
//                add, mul, max, exp, gt_mask
//   HB_IDX, KVB_IDX   indexer register block: heads x key vectors
//   HB_PV, VB_PV      sparse attention P.V register block: heads x value vectors
// Everything here has internal linkage (see dsa_args.h for why).
//
// Lightning indexer (`indexer_impl`): queries of one request are taken in groups of IDX_GROUP;
// their visible keys are gathered through the block table IDX_TILE at a time into a transposed
// float tile (keys in the vector lanes), scored for every query of the group with a register-
// blocked heads x keys micro-kernel (relu and the head weights applied in registers, so no
// [queries x keys] score matrix exists), and pushed into a per-query streaming top-k: a buffer of
// 4k candidates compacted to the best k when full (nth_element on the bare scores), after which
// only scores above the k-th best pass a vector compare. Order: score descending, exact ties to the earlier
// position (a later key never displaces an equal score). Queries that see <= k keys and want no
// values are answered without scoring (all their keys are selected).
//
// Sparse flash attention (`sparse_impl`): per query, its selected rows are attended SA_TILE at a
// time with an online softmax. q.k: heads in the vector lanes (the query transposed once,
// scaled), each key element broadcast, 8 keys per pass, rows read in place through their
// pointers (no copy of the gathered rows). P.v: value dims in the lanes, a heads x value-vectors
// register block, p broadcast. Output and log-sum-exp in float32.

constexpr int W = V::W;
constexpr int IDX_TILE = 64;
constexpr int IDX_GROUP = 8;
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

struct FloatGreater {
  bool operator()(float a, float b) const { return a > b; }
};
struct CandEarlier {
  bool operator()(const Cand& a, const Cand& b) const { return a.p < b.p; }
};

// Streaming top-k of one query: candidates collect in a buffer of TOPK_SLACK * k; when it is full
// the k-th best score is found by nth_element on the bare floats, everything above it is kept, and
// of the candidates equal to it the earliest positions fill up to k (later keys never beat an
// equal score, so `thr` then rejects them with a plain compare).
constexpr int TOPK_SLACK = 4;

struct StreamTopK {
  Cand* buf;
  Cand* ties;
  float* tmp;
  int k, cap, cnt;
  float thr;
  void init(Cand* b, Cand* t, float* f, int kk) {
    buf = b;
    ties = t;
    tmp = f;
    k = kk;
    cap = TOPK_SLACK * kk;
    cnt = 0;
    thr = -std::numeric_limits<float>::infinity();
  }
  void push(float v, int32_t p) {
    buf[cnt].v = v;
    buf[cnt].p = p;
    if (++cnt == cap) compact();
  }
  void compact() {
    for (int i = 0; i < cnt; ++i) tmp[i] = buf[i].v;
    std::nth_element(tmp, tmp + (k - 1), tmp + cnt, FloatGreater());
    const float t = tmp[k - 1];
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
    if (cnt > k) compact();
    const int n = cnt < k ? cnt : k;
    for (int i = 0; i < n; ++i) oi[i] = buf[i].p;
    for (int i = n; i < k; ++i) oi[i] = -1;
    if (ov) {
      for (int i = 0; i < n; ++i) ov[i] = buf[i].v;
      for (int i = n; i < k; ++i) ov[i] = -std::numeric_limits<float>::infinity();
    }
  }
};

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

// scores of one query against the tile's first `nvis` keys (rounded up to whole passes)
inline void idx_score_tile(const float* qf, const float* w, int N, int D, const float* kt, float* sc, int nvis) {
  constexpr int PASS = W * KVB_IDX;
  for (int jp = 0; jp < nvis; jp += PASS) {
    typename V::R s[KVB_IDX];
    for (int i = 0; i < KVB_IDX; ++i) s[i] = V::zero();
    int h = 0;
    for (; h + HB_IDX <= N; h += HB_IDX) idx_heads<HB_IDX>(qf, w, h, D, kt + jp, s);
    for (; h < N; ++h) idx_heads<1>(qf, w, h, D, kt + jp, s);
    for (int i = 0; i < KVB_IDX; ++i) V::store(sc + jp + i * W, s[i]);
  }
}

template <typename E>
void indexer_impl(const IndexerArgs& a, int64_t t0, int64_t t1) {
  const int N = a.n_heads, D = a.head_dim, K = a.topk;
  if (K <= 0) return;
  const E* q = static_cast<const E*>(a.q);
  const E* keys = static_cast<const E*>(a.keys.base);
  ABuf<float> qf(size_t(IDX_GROUP) * N * D), kt(size_t(D) * IDX_TILE), sc(IDX_TILE);
  ABuf<Cand> cands(size_t(IDX_GROUP) * TOPK_SLACK * K), ties(size_t(TOPK_SLACK) * K);
  ABuf<float> tmp(size_t(TOPK_SLACK) * K);
  StreamTopK tk[IDX_GROUP];
  int64_t ts[IDX_GROUP];
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
    while (t < t1 && g < IDX_GROUP && a.q_batch[t] == b && (a.kv_end[t] > K || a.out_val != nullptr)) {
      ts[g] = t;
      if (a.kv_end[t] > kmax) kmax = a.kv_end[t];
      ++g;
      ++t;
    }
    for (int gi = 0; gi < g; ++gi) {
      const E* qt = q + ts[gi] * a.q_stride_t;
      float* dst = qf.p + size_t(gi) * N * D;
      for (int h = 0; h < N; ++h)
        for (int d = 0; d < D; ++d) dst[h * D + d] = cvt(qt[h * a.q_stride_h + d]);
      tk[gi].init(cands.p + size_t(gi) * TOPK_SLACK * K, ties.p, tmp.p, K);
    }
    for (int64_t k0 = 0; k0 < kmax; k0 += IDX_TILE) {
      const int nk = int(kmax - k0 < IDX_TILE ? kmax - k0 : IDX_TILE);
      for (int j = 0; j < nk; ++j) {
        const E* kr = keys + row_of(a.block_table, a.bt_stride, a.block_size, b, k0 + j) * a.keys.row_stride;
        for (int d = 0; d < D; ++d) kt.p[d * IDX_TILE + j] = cvt(kr[d]);
      }
      if (nk < IDX_TILE)
        for (int d = 0; d < D; ++d)
          for (int j = nk; j < IDX_TILE; ++j) kt.p[d * IDX_TILE + j] = 0.f;
      for (int gi = 0; gi < g; ++gi) {
        const int64_t vis = a.kv_end[ts[gi]] - k0;
        if (vis <= 0) continue;
        const int nvis = int(vis < nk ? vis : nk);
        idx_score_tile(qf.p + size_t(gi) * N * D, a.w + ts[gi] * N, N, D, kt.p, sc.p, nvis);
        StreamTopK& s = tk[gi];
        for (int jv = 0; jv < nvis; jv += W) {
          unsigned mask = V::gt_mask(V::load(sc.p + jv), V::set1(s.thr));
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

// ------------------------------------------------------------------------- sparse attention
template <typename E>
inline void sa_qk_chunk(const float* qT, int Hp, int HV, int Dk, int Dr, const E* const* kr, const E* const* rr,
                        float* S, int kc) {
  for (int hv = 0; hv < HV; ++hv) {
    typename V::R acc[SA_KC];
    for (int c = 0; c < SA_KC; ++c) acc[c] = V::zero();
    const float* qp = qT + hv * W;
    for (int d = 0; d < Dk; ++d) {
      typename V::R qv = V::load(qp + size_t(d) * Hp);
      for (int c = 0; c < SA_KC; ++c) acc[c] = V::fmadd(qv, V::set1(cvt(kr[c][d])), acc[c]);
    }
    qp += size_t(Dk) * Hp;
    for (int d = 0; d < Dr; ++d) {
      typename V::R qv = V::load(qp + size_t(d) * Hp);
      for (int c = 0; c < SA_KC; ++c) acc[c] = V::fmadd(qv, V::set1(cvt(rr[c][d])), acc[c]);
    }
    for (int c = 0; c < kc; ++c) V::store(S + size_t(c) * Hp + hv * W, acc[c]);
  }
}

template <int HB, typename E>
inline void sa_pv_block(float* O, int Dv, int h0, const float* P, int Hp, const E* const* vr, int nk) {
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

template <typename E>
void sparse_impl(const SparseAttnArgs& a, int64_t t0, int64_t t1) {
  const int N = a.n_heads, Dk = a.dk, Dr = a.key_rope.base ? a.dr : 0, Dv = a.dv, K = a.topk;
  const int Hp = (N + W - 1) / W * W, HV = Hp / W, Dq = Dk + Dr;
  const float ninf = -std::numeric_limits<float>::infinity();
  const E* q = static_cast<const E*>(a.q);
  const E* qr = static_cast<const E*>(a.q_rope);
  const E* kbase = static_cast<const E*>(a.key.base);
  const E* rbase = static_cast<const E*>(a.key_rope.base);
  const E* vbase = static_cast<const E*>(a.value.base);
  ABuf<float> qT(size_t(Dq) * Hp), S(size_t(SA_TILE) * Hp), O(size_t(N) * Dv), m(Hp), l(Hp), alpha(Hp);
  ABuf<int64_t> rows(K > 0 ? K : 1);
  const E* kr[SA_TILE + SA_KC];
  const E* rr[SA_TILE + SA_KC];
  const E* vr[SA_TILE];
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
        qT.p[size_t(d) * Hp + h] = x * a.scale;
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
        sa_qk_chunk<E>(qT.p, Hp, HV, Dk, Dr, kr + j0, rr + j0, S.p + size_t(j0) * Hp, kc);
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
      for (; h + HB_PV <= N; h += HB_PV) sa_pv_block<HB_PV, E>(O.p, Dv, h, S.p, Hp, vr, nk);
      for (; h < N; ++h) sa_pv_block<1, E>(O.p, Dv, h, S.p, Hp, vr, nk);
    }
    for (int hh = 0; hh < N; ++hh) {
      const float inv = 1.f / l.p[hh];
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
