// Multiply-add rates of one core: float32 FMA (vfmadd231ps zmm) vs bf16 pairs (vdpbf16ps zmm), and
// for reference fp16 FMA (vfmadd231ph) and int8 VNNI (vpdpbusd), 24 independent accumulators each,
// thread CPU time (robust to other jobs on the box). Needs a CPU with AVX-512 BF16 / FP16 / VNNI.
//   g++ -O2 -o /tmp/fma_vs_dpbf16 benchmark/dsa/fma_vs_dpbf16.cpp && /tmp/fma_vs_dpbf16
#include <immintrin.h>

#include <cstdio>
#include <ctime>

static double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#pragma GCC target("avx512f,avx512bw,avx512bf16,avx512fp16,avx512vnni")
constexpr int N = 24;

__attribute__((noinline)) float fma_ps(long n, const float* src) {
  __m512 acc[N];
  for (int i = 0; i < N; ++i) acc[i] = _mm512_loadu_ps(src + i);
  const __m512 a = _mm512_loadu_ps(src + 40), b = _mm512_loadu_ps(src + 60);
  for (long k = 0; k < n; ++k) {
#pragma GCC unroll 32
    for (int i = 0; i < N; ++i) acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
  }
  __m512 s = acc[0];
  for (int i = 1; i < N; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((noinline)) float dp_bf16(long n, const float* src) {
  __m512 acc[N];
  for (int i = 0; i < N; ++i) acc[i] = _mm512_loadu_ps(src + i);
  const __m512bh a = (__m512bh)_mm512_loadu_ps(src + 40), b = (__m512bh)_mm512_loadu_ps(src + 60);
  for (long k = 0; k < n; ++k) {
#pragma GCC unroll 32
    for (int i = 0; i < N; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < N; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((noinline)) float fma_ph(long n, const float* src) {
  __m512h acc[N];
  for (int i = 0; i < N; ++i) acc[i] = (__m512h)_mm512_loadu_ps(src + i);
  const __m512h a = (__m512h)_mm512_loadu_ps(src + 40), b = (__m512h)_mm512_loadu_ps(src + 60);
  for (long k = 0; k < n; ++k) {
#pragma GCC unroll 32
    for (int i = 0; i < N; ++i) acc[i] = _mm512_fmadd_ph(a, b, acc[i]);
  }
  __m512 s = (__m512)acc[0];
  for (int i = 1; i < N; ++i) s = _mm512_add_ps(s, (__m512)acc[i]);
  return _mm512_reduce_add_ps(s);
}

// 16 accumulators here: with 24 __m512i ones GCC 12 keeps the array on the stack (a store per
// instruction), which measured vpdpbusd at 189 MAC/ns instead of its 2-per-cycle ~390
constexpr int NI = 16;

__attribute__((noinline)) int dp_u8s8(long n, const int* src) {
  __m512i acc[NI];
  for (int i = 0; i < NI; ++i) acc[i] = _mm512_loadu_si512(src + i);
  const __m512i a = _mm512_loadu_si512(src + 40), b = _mm512_loadu_si512(src + 60);
  for (long k = 0; k < n; ++k) {
#pragma GCC unroll 32
    for (int i = 0; i < NI; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  }
  __m512i s = acc[0];
  for (int i = 1; i < NI; ++i) s = _mm512_add_epi32(s, acc[i]);
  return _mm512_reduce_add_epi32(s);
}

int main() {
  float src[128];
  int isrc[128];
  for (int i = 0; i < 128; ++i) src[i] = 1e-3f * i, isrc[i] = i;
  const long n = 10000000;
  float sink = 0;
  for (int r = 0; r < 2; ++r) {
    double t0 = thread_seconds();
    sink += fma_ps(n, src);
    double t1 = thread_seconds();
    sink += dp_bf16(n, src);
    double t2 = thread_seconds();
    sink += fma_ph(n, src);
    double t3 = thread_seconds();
    sink += float(dp_u8s8(n, isrc));
    double t4 = thread_seconds();
    const double ins = double(n) * N;
    std::printf("vfmadd231ps %.3f ns/instr = %.0f MAC/ns | vdpbf16ps %.3f ns/instr = %.0f MAC/ns | "
                "vfmadd231ph %.0f MAC/ns | vpdpbusd %.0f MAC/ns\n",
                (t1 - t0) / ins * 1e9, ins * 16 / (t1 - t0) / 1e9, (t2 - t1) / ins * 1e9, ins * 32 / (t2 - t1) / 1e9,
                ins * 32 / (t3 - t2) / 1e9, double(n) * NI * 64 / (t4 - t3) / 1e9);
  }
  return sink == 1234.5f;
}
