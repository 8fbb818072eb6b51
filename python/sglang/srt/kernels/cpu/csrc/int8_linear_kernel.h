// The kernel of int8_linear.cpp, included there once per instruction set it is compiled for (the
// build's own, and in the avx512 / avx2 builds a second time under `#pragma GCC target` with
// AVX512-VNNI / AVX-VNNI), each time inside a namespace of its own. No #include here: the includes
// are int8_linear.cpp's. The ISA macros (SGL_I8_AVX512VNNI, SGL_I8_AVXVNNI, ...) select the paths.

// AVX512-VNNI / AVX-VNNI paths: where the build's flags have them, or in the second copy
// (SGL_I8_EXTRA_VNNI: C++ lexes the file before the target pragma is applied, so the pragma does
// not define the ISA's macros itself)
#undef SGL_I8_AVX512VNNI
#undef SGL_I8_AVXVNNI
#if defined(__AVX512F__) && (defined(__AVX512VNNI__) || defined(SGL_I8_EXTRA_VNNI))
#define SGL_I8_AVX512VNNI 1
#endif
#if !defined(__AVX512F__) && defined(__AVX2__) && (defined(__AVXVNNI__) || defined(SGL_I8_EXTRA_VNNI))
#define SGL_I8_AVXVNNI 1
#endif

constexpr int64_t kLanes = 16;  // output columns per packed block
constexpr int kMaxRows = 4;     // rows of x per tile
constexpr int64_t kAmxMinRows = 16;  // AMX-INT8 tiles from this many rows on (where the CPU has them)
#if defined(__AVX512F__) && defined(SGL_I8_AVX512VNNI)
constexpr bool kUnsignedX = true;  // q + 128 as u8 (vpdpbusd), comp subtracted
constexpr const char* kImpl = "avx512-vnni";
#elif defined(__AVX512F__) && defined(__AVX512BW__)
constexpr bool kUnsignedX = false;
constexpr const char* kImpl = "avx512-maddubs";
#elif defined(__AVX2__) && defined(__FMA__) && defined(SGL_I8_AVXVNNI)
constexpr bool kUnsignedX = true;  // q + 128 as u8 (AVX-VNNI vpdpbusd), comp subtracted
constexpr const char* kImpl = "avx2-vnni";
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
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
#endif
// amax of |row| (exact in any order: max)
#if defined(__AVX512F__)
// 16 float32 lanes from float or bf16 (bf16: the 16 bits shifted into the high half)
template <typename T>
inline __m512 load16(const T* x) {
  if constexpr (sizeof(T) == 4) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(x));
  } else {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))), 16));
  }
}
#endif

template <typename T>
float row_amax(const T* x, int64_t K) {
  int64_t k = 0;
  float m = 0.f;
#if defined(__AVX512F__)
  // four independent maxima: one would wait on vmaxps' latency at every step
  __m512 v[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int j = 0; k + 16 <= K; k += 16, j = (j + 1) & 3) {
    const __m512 a = load16(x + k);
    v[j] = _mm512_max_ps(v[j], _mm512_abs_ps(a));
  }
  m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(v[0], v[1]), _mm512_max_ps(v[2], v[3])));
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 v = _mm256_setzero_ps();
  for (; k + 8 <= K; k += 8) v = _mm256_max_ps(v, _mm256_and_ps(load8(x + k), abs_mask));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  for (float l : lanes) m = std::max(m, l);
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
  const __m512 vs = _mm512_set1_ps(s), vr = _mm512_set1_ps(1.f / s), near_half = _mm512_set1_ps(0.5f - 1.f / 1024);
  const __m512i off = _mm512_set1_epi8(bias);
  for (; k + 16 <= K; k += 16) {
    const __m512 a = load16(x + k);
    // x * (1 / s) is within 2^-15 of x / s (|x / s| <= 127): it rounds to the same integer unless
    // it lies near a half-integer; only those vectors (a few percent) divide
    __m512 y = _mm512_mul_ps(a, vr);
    const __m512 dist = _mm512_abs_ps(_mm512_sub_ps(y, _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT)));
    if (_mm512_cmp_ps_mask(dist, near_half, _CMP_GT_OQ) != 0) y = _mm512_div_ps(a, vs);
    // MXCSR: round to nearest even; |x / s| <= 127 (1 + 2^-23) rounds into +-127, and vpmovsdb
    // saturates besides (the clamp)
    const __m512i r = _mm512_cvtps_epi32(y);
    const __m128i b = _mm_add_epi8(_mm512_cvtsepi32_epi8(r), _mm512_castsi512_si128(off));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k), b);
  }
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 vs = _mm256_set1_ps(s), vr = _mm256_set1_ps(1.f / s), near_half = _mm256_set1_ps(0.5f - 1.f / 1024);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  for (; k + 8 <= K; k += 8) {
    const __m256 a = load8(x + k);
    __m256 y = _mm256_mul_ps(a, vr);  // as in the AVX-512 loop: divide only near half-integers
    const __m256 dist = _mm256_and_ps(_mm256_sub_ps(y, _mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)),
                                      abs_mask);
    if (_mm256_movemask_ps(_mm256_cmp_ps(dist, near_half, _CMP_GT_OQ)) != 0) y = _mm256_div_ps(a, vs);
    const __m256i r = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(y), lo), hi);
    const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + k), _mm_add_epi8(_mm_packs_epi16(w16, w16), _mm_set1_epi8(bias)));
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
#if !defined(SGL_I8_AVX512VNNI)
  const __m512i ones = _mm512_set1_epi16(1);
  const __m512i zero = _mm512_setzero_si512();
#endif
  for (int64_t g = 0; g < groups; ++g) {
    __m512i wv[NB];
    for (int b = 0; b < NB; ++b) wv[b] = _mm512_loadu_si512(w + (b0 + b) * bstride + g * 64);
#if defined(SGL_I8_AVX512VNNI)
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
#if !defined(SGL_I8_AVXVNNI)
  const __m256i ones = _mm256_set1_epi16(1);
#endif
  for (int64_t g = 0; g < groups; ++g) {
    __m256i wv[2 * NB];
    for (int v = 0; v < 2 * NB; ++v)
      wv[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (b0 + v / 2) * bstride + g * 64 + (v % 2) * 32));
#if defined(SGL_I8_AVXVNNI)
    for (int i = 0; i < RI; ++i) {
      int32_t xi;
      std::memcpy(&xi, xq + i * Kp + g * 4, 4);
      const __m256i xb = _mm256_set1_epi32(xi);
      for (int v = 0; v < 2 * NB; ++v) a[i][v] = _mm256_dpbusd_avx_epi32(a[i][v], xb, wv[v]);
    }
#else
    __m256i wabs[2 * NB];
    for (int v = 0; v < 2 * NB; ++v) wabs[v] = _mm256_abs_epi8(wv[v]);
    for (int i = 0; i < RI; ++i) {
      int32_t xi;
      std::memcpy(&xi, xq + i * Kp + g * 4, 4);
      const __m256i xb = _mm256_set1_epi32(xi);
      for (int v = 0; v < 2 * NB; ++v) {
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs[v], _mm256_sign_epi8(xb, wv[v])), ones);
        a[i][v] = _mm256_add_epi32(a[i][v], p);
      }
    }
#endif
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
  int64_t ldo = 0;  // the output's row stride: N, or N / 2 under the SwiGLU epilogue
  int64_t half = 0;  // the SwiGLU epilogue (gate_up: columns [0, N/2) gate, [N/2, N) up): N / 32 blocks; else 0
};

#if defined(__AVX512F__)
inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const uint16_t* p, __mmask16 m) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
inline __m512i bf16_bits16(__m512 v) {  // round to nearest even, NaN -> quiet (bf16_round's)
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                               _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
}
// v's 16 bf16 values (as bf16_bits16), in one vcvtneps2bf16 where the build has AVX512-BF16: it rounds
// to nearest even and quiets NaN alike, but reads denormal inputs as zero, so a vector holding one
// (|v| < 2^-126: never from real scales) takes bf16_bits16
inline __m256i bf16_16(__m512 v) {
#if defined(__AVX512BF16__)
  if (_mm512_fpclass_ps_mask(v, 0x20) == 0) return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
#endif
  return _mm512_cvtepi32_epi16(bf16_bits16(v));
}
inline __m512 round16(__m512 v, float*) { return v; }
inline __m512 round16(__m512 v, uint16_t*) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16_16(v)), 16));
}
inline void store16(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
inline void store16(uint16_t* p, __m512 v, __mmask16 m) { _mm256_mask_storeu_epi16(p, m, bf16_16(v)); }

template <typename T>
inline void epilogue(const int32_t* acc, const int32_t* comp, float s, const float* ws, const T* bias, T* out,
                     int64_t n) {
  const __mmask16 m = n >= kLanes ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
  __m512i a = _mm512_loadu_si512(acc);
  if (kUnsignedX) a = _mm512_sub_epi32(a, _mm512_loadu_si512(comp));
  __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(a), _mm512_set1_ps(s)), _mm512_loadu_ps(ws));
  if (bias != nullptr) v = _mm512_add_ps(round16(v, out), load16(bias, m));
  store16(out, v, m);
}

// 16 whole columns' values as the plain epilogue stores them (rounded to T), kept in float32
template <typename T>
inline __m512 scaled16(const int32_t* acc, const int32_t* comp, float s, const float* ws, const T* bias, T* tag) {
  __m512i a = _mm512_loadu_si512(acc);
  if (kUnsignedX) a = _mm512_sub_epi32(a, _mm512_loadu_si512(comp));
  __m512 v = round16(_mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(a), _mm512_set1_ps(s)), _mm512_loadu_ps(ws)), tag);
  if (bias != nullptr) v = round16(_mm512_add_ps(v, load16(bias, static_cast<__mmask16>(0xFFFF))), tag);
  return v;
}

// the SwiGLU epilogue of 16 columns: silu(gate) * up on the values the plain epilogue would have
// stored (so the same bits as the gate_up linear followed by silu_and_mul, bf16 output only)
inline void epilogue_swiglu(const int32_t* acc_g, const int32_t* acc_u, const Args& g, int64_t cg, float s,
                            const uint16_t* bias, uint16_t* out) {
  const int64_t cu = cg + g.half * kLanes;
  const __m512 gv = scaled16(acc_g, g.comp + cg, s, g.ws + cg, bias ? bias + cg : nullptr, out);
  const __m512 uv = scaled16(acc_u, g.comp + cu, s, g.ws + cu, bias ? bias + cu : nullptr, out);
  store16(out, sgl_vec::silu_mul16(gv, uv), static_cast<__mmask16>(0xFFFF));
}
#else
template <typename T>
inline void epilogue(const int32_t* acc, const int32_t* comp, float s, const float* ws, const T* bias, T* out,
                     int64_t n) {
  T* tag = nullptr;
  for (int64_t l = 0; l < n; ++l) {
    float v = static_cast<float>(acc[l] - (kUnsignedX ? comp[l] : 0)) * s * ws[l];
    if (bias != nullptr) v = round_to(v, tag) + to_f(bias[l]);
    put(out + l, v);
  }
}

inline void epilogue_swiglu(const int32_t* acc_g, const int32_t* acc_u, const Args& g, int64_t cg, float s,
                            const uint16_t* bias, uint16_t* out) {
  const int64_t cu = cg + g.half * kLanes;
  uint16_t* tag = nullptr;
  alignas(32) float gv[kLanes], uv[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) {
    float a = round_to(static_cast<float>(acc_g[l] - (kUnsignedX ? g.comp[cg + l] : 0)) * s * g.ws[cg + l], tag);
    float b = round_to(static_cast<float>(acc_u[l] - (kUnsignedX ? g.comp[cu + l] : 0)) * s * g.ws[cu + l], tag);
    if (bias != nullptr) {
      a = round_to(a + to_f(bias[cg + l]), tag);
      b = round_to(b + to_f(bias[cu + l]), tag);
    }
    gv[l] = a;
    uv[l] = b;
  }
#if defined(__AVX2__) && defined(__FMA__)
  for (int64_t l = 0; l < kLanes; l += 8) {
    alignas(32) float y[8];
    _mm256_store_ps(y, sgl_vec::silu_mul8_bf16(_mm256_load_ps(gv + l), _mm256_load_ps(uv + l)));
    for (int j = 0; j < 8; ++j) out[l + j] = bf16_round(y[j]);
  }
#else
  // silu_and_mul's scalar form: e^-g overflows to inf below g = -88, and g / inf is -0
  for (int64_t l = 0; l < kLanes; ++l) out[l] = bf16_round(gv[l] / (1.f + std::exp(-gv[l])) * uv[l]);
#endif
}
#endif

template <int RI, int NB, typename T>
void run_tile(const Args& g, int64_t i0, int64_t b0, const T* bias, T* out) {
  alignas(64) int32_t acc[RI][NB * kLanes];
  tile<RI, NB>(g.xq + i0 * g.Kp, g.Kp, g.w, b0, acc);
  if constexpr (sizeof(T) == 2) {
    if (g.half > 0) {  // gate blocks b0.., then their up blocks b0 + half..
      alignas(64) int32_t up[RI][NB * kLanes];
      tile<RI, NB>(g.xq + i0 * g.Kp, g.Kp, g.w, b0 + g.half, up);
      for (int i = 0; i < RI; ++i)
        for (int b = 0; b < NB && b0 + b < g.half; ++b) {
          const int64_t c0 = (b0 + b) * kLanes;
          epilogue_swiglu(acc[i] + b * kLanes, up[i] + b * kLanes, g, c0, g.xs[i0 + i], bias,
                          out + (i0 + i) * g.ldo + c0);
        }
      return;
    }
  }
  for (int i = 0; i < RI; ++i)
    for (int b = 0; b < NB; ++b) {
      const int64_t c0 = (b0 + b) * kLanes;
      if (c0 >= g.N) break;
      epilogue(acc[i] + b * kLanes, g.comp + c0, g.xs[i0 + i], g.ws + c0, bias ? bias + c0 : nullptr,
               out + (i0 + i) * g.ldo + c0, std::min<int64_t>(kLanes, g.N - c0));
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
  // the SwiGLU epilogue: tasks over the gate blocks, each tile computing its up blocks too
  const int64_t blocks = g.half > 0 ? g.half : (g.N + kLanes - 1) / kLanes;
  const int64_t threads = at::get_num_threads();
  constexpr int64_t kChunk = 128;  // rows per task when M is large
  const int64_t chunks = (g.M + kChunk - 1) / kChunk;
  int64_t nb = 4;
  while (nb > 1 && ((blocks + nb - 1) / nb) * chunks < 8 * threads) nb /= 2;
  const int64_t col_tasks = (blocks + nb - 1) / nb;
  // task t: row chunk t / col_tasks, column task t % col_tasks: a thread's consecutive tasks share
  // their rows of x, which stay in L2 while the weights stream past (a decode call: one row chunk,
  // every weight byte read once for all its rows)
  at::parallel_for(0, col_tasks * chunks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b0 = (t % col_tasks) * nb, r0 = (t / col_tasks) * kChunk, r1 = std::min(g.M, r0 + kChunk);
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


// ------------------------------------------------------------------------------ AMX-INT8 tiles
#if defined(SGL_INT8_AMX)
// the avx512bf16 build also runs on AVX-512 CPUs without AMX: CPUID leaf 7 EDX bit 24 (AMX-TILE)
// and bit 25 (AMX-INT8), and the kernel's permission for the tile data (arch_prctl)
bool amx_int8_ready() {
  static const bool ok = [] {
    unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    if ((edx & (1u << 24)) == 0 || (edx & (1u << 25)) == 0) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

// tile intrinsics are asm volatile without memory clobbers: fence the compiler around them
#define SGL_I8_FENCE() asm volatile("" ::: "memory")

void configure_int8_tiles() { sgl_amx::configure_full_tiles(); }

// rows [r0, r0 + 32) (padded to 16s in xq; a second row tile past M is skipped) x blocks b0, b1
// (b1: b0 + 1, which may be past the last: skipped; under the SwiGLU epilogue b0's up block)
template <typename T>
void amx_tile(const Args& g, int64_t r0, int64_t b0, int64_t b1, int64_t blocks, const T* bias, T* out) {
  alignas(64) int32_t acc[4][16 * 16];
  const int64_t bstride = g.Kp * kLanes;
  const bool two = b1 < blocks, low = r0 + 16 < g.M;  // a second block / row tile to compute
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  SGL_I8_FENCE();
  for (int64_t k0 = 0; k0 < g.Kp; k0 += 64) {
    _tile_loadd(0, g.xq + r0 * g.Kp + k0, g.Kp);
    _tile_loadd(2, g.w + b0 * bstride + k0 * 16, 64);
    _tile_dpbusd(4, 0, 2);
    if (low) {
      _tile_loadd(1, g.xq + (r0 + 16) * g.Kp + k0, g.Kp);
      _tile_dpbusd(5, 1, 2);
    }
    if (two) {
      _tile_loadd(3, g.w + b1 * bstride + k0 * 16, 64);
      _tile_dpbusd(6, 0, 3);
      if (low) _tile_dpbusd(7, 1, 3);
    }
  }
  _tile_stored(4, acc[0], 64);
  _tile_stored(5, acc[1], 64);
  _tile_stored(6, acc[2], 64);
  _tile_stored(7, acc[3], 64);
  SGL_I8_FENCE();
  const int64_t c0 = b0 * kLanes;
  if constexpr (sizeof(T) == 2) {
    if (g.half > 0) {
      for (int h = 0; h < 2; ++h)
        for (int64_t i = 0; i < 16 && r0 + h * 16 + i < g.M; ++i) {
          const int64_t row = r0 + h * 16 + i;
          epilogue_swiglu(acc[h] + i * 16, acc[2 + h] + i * 16, g, c0, g.xs[row], bias, out + row * g.ldo + c0);
        }
      return;
    }
    if (two && g.N - c0 >= 2 * kLanes) {  // both blocks whole: one 64-byte row store
      const auto* bp = bias ? bias + c0 : nullptr;
      for (int h = 0; h < 2; ++h)
        for (int64_t i = 0; i < 16 && r0 + h * 16 + i < g.M; ++i) {
          const int64_t row = r0 + h * 16 + i;
          const float s = g.xs[row];
          const __m512 lo = scaled16(acc[h] + i * 16, g.comp + c0, s, g.ws + c0, bp, out);
          const __m512 hi = scaled16(acc[2 + h] + i * 16, g.comp + c0 + kLanes, s, g.ws + c0 + kLanes,
                                     bp ? bp + kLanes : nullptr, out);
          _mm512_storeu_si512(out + row * g.ldo + c0,
                              _mm512_inserti64x4(_mm512_castsi256_si512(bf16_16(lo)), bf16_16(hi), 1));
        }
      return;
    }
  }
  for (int b = 0; b < (two ? 2 : 1); ++b) {
    const int64_t cb = (b0 + b) * kLanes, n = std::min<int64_t>(kLanes, g.N - cb);
    for (int h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 16 && r0 + h * 16 + i < g.M; ++i) {
        const int64_t row = r0 + h * 16 + i;
        epilogue(acc[2 * b + h] + i * 16, g.comp + cb, g.xs[row], g.ws + cb, bias ? bias + cb : nullptr,
                 out + row * g.ldo + cb, n);
      }
  }
}

template <typename T>
void gemm_amx(const Args& g, const T* bias, T* out) {
  // units: pairs of neighbouring blocks, or under the SwiGLU epilogue a gate block and its up block
  const bool sw = g.half > 0;  // unit p: blocks p * step and p * step + off
  const int64_t blocks = (g.N + kLanes - 1) / kLanes, pairs = sw ? g.half : (blocks + 1) / 2;
  const int64_t step = sw ? 1 : 2, off = sw ? g.half : 1;
  // tasks: 128 rows x 8 column pairs (256 columns); x's rows and the weights' columns a task reads
  // stay in L2 while its output streams past (row-major over the whole output, x would be evicted
  // by the output before its next pair and come from L3: half the speed)
  constexpr int64_t kRows = 128, kPairs = 8;
  const int64_t row_blocks = (g.M + kRows - 1) / kRows, groups = (pairs + kPairs - 1) / kPairs;
  at::parallel_for(0, row_blocks * groups, 1, [&](int64_t t0, int64_t t1) {
    configure_int8_tiles();
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = (t / groups) * kRows, r1 = std::min(g.M, r0 + kRows);
      const int64_t p0 = (t % groups) * kPairs, p1 = std::min(pairs, p0 + kPairs);
      for (int64_t r = r0; r < r1; r += 32)  // a row tile meets the task's pairs in turn (bf16_linear's order)
        for (int64_t p = p0; p < p1; ++p) amx_tile(g, r, p * step, p * step + off, blocks, bias, out);
    }
    _tile_release();
  });
}
#endif

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
         const std::optional<at::Tensor>& bias, at::Tensor& out, int64_t N, int64_t Kp, bool swiglu) {
  const int64_t M = x.size(0), K = x.size(1);
#if defined(SGL_INT8_AMX)
  const bool amx = M >= kAmxMinRows && Kp % 64 == 0 && amx_int8_ready();
#else
  const bool amx = false;
#endif
  const int64_t rows = amx ? (M + 15) / 16 * 16 : M;  // AMX reads whole 16-row tiles
  // the quantized rows in a scratch buffer kept by the calling thread (a fresh prefill-sized one
  // each call costs its page faults: ~1/3 of a 512-row call); rows past M: q = 0
  thread_local std::vector<uint8_t> q_scratch;
  thread_local std::vector<float> xs_scratch;
  const size_t q_bytes = static_cast<size_t>(rows * Kp);
  if (q_scratch.size() < q_bytes) q_scratch.resize(q_bytes);
  if (xs_scratch.size() < static_cast<size_t>(M)) xs_scratch.resize(static_cast<size_t>(M));
  uint8_t* q = q_scratch.data();
  float* xs = xs_scratch.data();
  std::memset(q + M * Kp, kUnsignedX ? 128 : 0, static_cast<size_t>((rows - M) * Kp));
  const T* xp = reinterpret_cast<const T*>(x.data_ptr());
  quantize(xp, x.stride(0), M, K, Kp, q, xs);
  const Args g{q,  xs, packed.data_ptr<int8_t>(), comp.data_ptr<int32_t>(), ws.data_ptr<float>(),
               M,  N,  Kp,
               out.size(1), swiglu ? N / (2 * kLanes) : 0};
  const T* bp = bias.has_value() ? reinterpret_cast<const T*>(bias->data_ptr()) : nullptr;
#if defined(SGL_INT8_AMX)
  if (amx) return gemm_amx(g, bp, reinterpret_cast<T*>(out.data_ptr()));
#endif
  gemm(g, bp, reinterpret_cast<T*>(out.data_ptr()));
}
