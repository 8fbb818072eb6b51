// float32 lanes to / from bfloat16 bits with integer ops, shared by sglang_cpu_ops.cpp and
// bf16_linear.cpp (builds without AVX512-BF16's vcvtneps2bf16, and the float32-exact avx512 paths).
// Rounded to nearest even as from_f<uint16_t> does. Include <immintrin.h> first.
//   f_to_bf16_16 (AVX-512): a NaN becomes the quiet 0x7FC0.
//   f_to_bf16_lanes / f_to_bf16_bits (AVX2) leave NaN to the rounding: every value these kernels
//     round is computed from bf16 data, so a NaN in it is the CPU's default NaN or one propagated
//     from a bf16 input (low 16 bits zero); both round to a NaN (a payload that could carry into the
//     sign bit only arises from float32 data, never rounded here).
#pragma once

namespace sgl_vec {

#if defined(__AVX512F__)
inline __m256i f_to_bf16_16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}
#endif

#if defined(__AVX2__)
inline __m256i f_to_bf16_lanes(__m256 x) {  // the bf16 bits in the low half of each 32-bit lane
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
}
inline __m128i f_to_bf16_bits(__m256 x) {
  const __m256i r = f_to_bf16_lanes(x);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));  // each <= 0xFFFF
}
inline __m256 bf16_bits_to_f(__m128i raw) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
#endif

}  // namespace sgl_vec
