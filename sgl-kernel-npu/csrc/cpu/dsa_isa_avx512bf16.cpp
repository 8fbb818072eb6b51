// DSA CPU kernels, AVX-512 + AVX512-BF16 + AVX512-VNNI build (16 float lanes; Cooper Lake,
// Sapphire Rapids and later, Zen 4+: every CPU with avx512_bf16 has avx512_vnni). The AVX-512
// build's kernels plus the indexer's bf16 scoring with vdpbf16ps (SGL_DSA_DPBF16) and int8 scoring
// with vpdpbusd (SGL_DSA_VNNI). Compiled for that target whatever the compiler's default (the
// pragma below); called only where the CPU reports avx512f, avx512_bf16 and avx512_vnni.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "dsa_args.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vnni,avx2,fma"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vnni,avx2,fma")
#endif

namespace sgl_dsa {
namespace avx512bf16 {
namespace {

#define SGL_DSA_VNNI 1
#include "dsa_vec_avx512.h"

constexpr int HB_IDX = 4, KVB_IDX = 4;  // 16 accumulators of 32
constexpr int HB_PV = 4, VB_PV = 4;
constexpr int HB_IDX_DP = 4;      // dp micro-kernel: 4 heads x 4 vectors of 16 keys
constexpr int IDX_GROUP_DP = 16;  // queries per key tile
#define SGL_DSA_DPBF16 1

#include "dsa_kernels_impl.h"

}  // namespace

#include "dsa_isa_entry.h"

}  // namespace avx512bf16
}  // namespace sgl_dsa

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
