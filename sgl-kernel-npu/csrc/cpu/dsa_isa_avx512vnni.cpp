// DSA CPU kernels, AVX-512 + AVX512-VNNI build (16 float lanes; Cascade Lake, Ice Lake, ...: VNNI
// without BF16): the AVX-512 build with int8 index scoring by vpdpbusd. Called only where the CPU
// reports avx512f and avx512_vnni.
#define SGL_DSA_AVX512_VNNI 1
#include "dsa_isa_avx512.cpp"
