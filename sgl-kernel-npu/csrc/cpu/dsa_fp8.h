// FP8 rows of the DSA kernels (`--kv-cache-dtype fp8_e4m3 / fp8_e5m2`: the MLA latent cache; FP8
// e4m3 index keys with per-block scales, DeepSeek-V3.2's own indexer-key format), widened to float32
// exactly. Included by each dsa_isa_<name>.cpp INSIDE its anonymous namespace, before its V (every
// function here has internal linkage: see dsa_args.h).
//
// The element types are tags over the code byte. `cvt` is a 256-entry table of the exact values
// (e4m3: bias 7, no infinities, S.1111.111 is NaN; e5m2: the top byte of a float16). The vector
// loads of the SIMD builds (`fp8_half_*` below, V::loadc) go through float16 bits and vcvtph2ps: an
// e5m2 code is a float16's top byte; an e4m3 code moved 7 bits left is the float16 of 2^-8 times its
// value (normal and subnormal alike; the NaN code gets an all-ones exponent), so those loads
// multiply by 256 (exact). Every path gives the same float32 of a code.
#pragma once

struct fp8_e4m3 {
  uint8_t bits;
};
struct fp8_e5m2 {
  uint8_t bits;
};
template <typename T>
inline constexpr bool is_fp8 = std::is_same_v<T, fp8_e4m3> || std::is_same_v<T, fp8_e5m2>;

constexpr float fp8_pow2(int e) {
  float r = 1.f;
  for (; e > 0; --e) r *= 2.f;
  for (; e < 0; ++e) r *= 0.5f;
  return r;
}
// value of code b: sign, `eb` exponent bits of bias 2^(eb-1) - 1, `mb` mantissa bits
constexpr float fp8_value(uint32_t b, int eb, int mb, bool e4m3) {
  const int bias = (1 << (eb - 1)) - 1;
  const uint32_t e = (b >> mb) & ((1u << eb) - 1u), m = b & ((1u << mb) - 1u);
  const bool neg = (b & 0x80u) != 0;
  float v = 0.f;
  if (e4m3 && e == 15u && m == 7u) v = __builtin_nanf("");
  else if (!e4m3 && e == 31u) v = m ? __builtin_nanf("") : __builtin_inff();
  else if (e == 0u) v = float(m) * fp8_pow2(1 - bias - mb);
  else v = float((1u << mb) + m) * fp8_pow2(int(e) - bias - mb);
  return neg ? -v : v;
}
struct Fp8Table {
  float v[256];
};
constexpr Fp8Table fp8_table(bool e4m3) {
  Fp8Table t{};
  for (uint32_t b = 0; b < 256; ++b) t.v[b] = e4m3 ? fp8_value(b, 4, 3, true) : fp8_value(b, 5, 2, false);
  return t;
}
inline constexpr Fp8Table kFp8E4M3 = fp8_table(true);
inline constexpr Fp8Table kFp8E5M2 = fp8_table(false);
inline float cvt(fp8_e4m3 x) { return kFp8E4M3.v[x.bits]; }
inline float cvt(fp8_e5m2 x) { return kFp8E5M2.v[x.bits]; }
// what the vector loads' float16 route yields, before their x 256 (e4m3) or x 1 (e5m2)
template <typename T>
inline constexpr float fp8_half_unit = std::is_same_v<T, fp8_e4m3> ? 256.f : 1.f;
