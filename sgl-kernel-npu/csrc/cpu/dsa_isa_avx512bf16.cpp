// DSA CPU kernels, AVX-512 + AVX512-BF16 build (16 float lanes; Cooper Lake, Sapphire Rapids and
// later, Zen 4+). The AVX-512 build's kernels plus the indexer's bf16 scoring with vdpbf16ps
// (SGL_DSA_DPBF16). Compiled for that target whatever the compiler's default (the pragma below);
// called only where the CPU reports avx512f and avx512_bf16.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "dsa_args.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")
#endif

namespace sgl_dsa {
namespace avx512bf16 {
namespace {

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
