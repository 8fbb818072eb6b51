// DSA CPU kernels, AVX2 + FMA + AVX-VNNI build (8 float lanes; Alder Lake and later clients, Sierra
// Forest: VNNI without AVX-512): the AVX2 build with int8 index scoring by vpdpbusd (VEX). Called
// only where the CPU reports avx2, fma and avx_vnni.
#define SGL_DSA_AVX2_VNNI 1
#include "dsa_isa_avx2.cpp"
