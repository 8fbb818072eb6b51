// 2^t for 16 float lanes to about 1e-4 relative error (|rel err| < 8e-5), for results that are
// rounded to bfloat16 anyway (the prefill kernel's P, the SiLU gate): 2^floor(t) * q(f) with
// f = t - floor(t) in [0, 1) by one vreduceps, q a degree-3 fit of 2^f, and scalef for 2^floor(t)
// (which goes to 0 far below range and to inf far above). Shared by sglang_cpu_ops.cpp and
// prefill_attention_amx.cpp; its text is part of the sources' tag (kernels/cpu/isa.py), so a
// build older than an edit of it is not loaded.
#pragma once

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>

namespace sgl_vec {

inline __m512 exp2_fast(__m512 t) {
  const __m512 f = _mm512_reduce_ps(t, 0x09);  // t - floor(t), precision exception suppressed
  __m512 q = _mm512_set1_ps(0.07802402973175049f);
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(0.22606706619262695f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(0.6958339810371399f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(0.9999251365661621f));
  return _mm512_scalef_ps(q, t);
}

}  // namespace sgl_vec
#endif
