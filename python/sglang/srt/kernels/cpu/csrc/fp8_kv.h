// FP8 KV cache elements (`--kv-cache-dtype fp8_e4m3 / fp8_e5m2`) as the fused attention kernels read
// them: the code's bits, widened to float32 exactly. e5m2 is the top byte of a float16; e4m3 (bias
// 7, no infinities, S.1111.111 is NaN) moved 7 bits left is the float16 (bias 15) of 2^-8 times its
// value (normal and subnormal alike), with the NaN code given an all-ones exponent. to_f of an e4m3
// is therefore value * 2^-8, on every path (this scalar table and the kernels' vector loads): the
// kernels multiply by kv_unit<KV> = 256 where they apply the layer's scale.
#pragma once

#include <cstdint>
#include <type_traits>

namespace sgl_fp8 {

struct fp8_e4m3 {
  uint8_t bits;
};
struct fp8_e5m2 {
  uint8_t bits;
};
template <typename KV>
inline constexpr bool is_fp8_kv = std::is_same_v<KV, fp8_e4m3> || std::is_same_v<KV, fp8_e5m2>;
template <typename KV>
inline constexpr float kv_unit = 1.f;
template <>
inline constexpr float kv_unit<fp8_e4m3> = 256.f;

constexpr uint16_t e4m3_half_bits(uint32_t b) {
  const uint32_t h = ((b & 0x80u) << 8) | ((b & 0x7Fu) << 7);
  return static_cast<uint16_t>((b & 0x7Fu) == 0x7Fu ? h | 0x7C00u : h);
}
constexpr float half_bits_to_f(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u;
  if (e == 31u) return __builtin_bit_cast(float, sign | 0x7F800000u | (m << 13));  // inf / NaN
  if (e == 0u) {  // subnormal: m * 2^-24
    const float v = static_cast<float>(m) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return __builtin_bit_cast(float, sign | ((e + 112u) << 23) | (m << 13));
}
struct Fp8Table {
  float v[256];
};
constexpr Fp8Table fp8_table(bool e4m3) {
  Fp8Table t{};
  for (uint32_t b = 0; b < 256; ++b) t.v[b] = half_bits_to_f(e4m3 ? e4m3_half_bits(b) : b << 8);
  return t;
}
inline constexpr Fp8Table kE4M3 = fp8_table(true);
inline constexpr Fp8Table kE5M2 = fp8_table(false);
inline float to_f(fp8_e4m3 x) { return kE4M3.v[x.bits]; }
inline float to_f(fp8_e5m2 x) { return kE5M2.v[x.bits]; }

// The bf16 bits of each code's magnitude (codes 0..127, to_f's value, sign cleared): exact, every
// e4m3 / e5m2 value (e4m3's times 2^-8) being a normal bf16 or zero; the vector kernels look them
// up 32 codes at a time and put the sign bit back.
struct Bf16Mags {
  uint16_t v[128];
};
constexpr Bf16Mags bf16_mags(const Fp8Table& t) {
  Bf16Mags m{};
  for (uint32_t b = 0; b < 128; ++b) m.v[b] = static_cast<uint16_t>(__builtin_bit_cast(uint32_t, t.v[b]) >> 16);
  return m;
}
inline constexpr Bf16Mags kE4M3Bf16 = bf16_mags(kE4M3);
inline constexpr Bf16Mags kE5M2Bf16 = bf16_mags(kE5M2);
inline const uint16_t* bf16_mags_of(fp8_e4m3) { return kE4M3Bf16.v; }
inline const uint16_t* bf16_mags_of(fp8_e5m2) { return kE5M2Bf16.v; }

}  // namespace sgl_fp8
