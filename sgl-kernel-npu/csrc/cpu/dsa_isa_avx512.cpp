// DSA CPU kernels, AVX-512 build (16 float lanes). Compiled for AVX-512F whatever the compiler's
// default target is (the target pragma below); called only where the CPU reports avx512f.
// Included by dsa_isa_avx512vnni.cpp with SGL_DSA_AVX512_VNNI defined: the same build plus
// AVX512-VNNI (Cascade Lake, Ice Lake: VNNI without BF16), whose int8 index scoring uses vpdpbusd.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "dsa_args.h"

#if defined(SGL_DSA_AVX512_VNNI)
#define SGL_DSA_VNNI 1
#define SGL_DSA_NS avx512vnni
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")
#endif
#else
#define SGL_DSA_NS avx512
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")
#endif
#endif

namespace sgl_dsa {
namespace SGL_DSA_NS {
namespace {

#include "dsa_vec_avx512.h"

constexpr int HB_IDX = 4, KVB_IDX = 4;  // 16 accumulators of 32
constexpr int HB_PV = 4, VB_PV = 4;

#include "dsa_kernels_impl.h"

}  // namespace

#include "dsa_isa_entry.h"

}  // namespace SGL_DSA_NS
}  // namespace sgl_dsa

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
