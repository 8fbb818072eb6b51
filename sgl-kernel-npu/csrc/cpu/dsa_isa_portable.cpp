// DSA CPU kernels, portable build: the same algorithms over an 8-float array type, compiled for the
// compiler's baseline target (any x86-64, aarch64, ...). The reference for the SIMD builds' logic.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "dsa_args.h"

namespace sgl_dsa {
namespace portable {
namespace {

#include "dsa_fp8.h"

struct V {
  static constexpr int W = 8;
  struct R {
    float v[8];
  };
  static R zero() { R r; for (int i = 0; i < W; ++i) r.v[i] = 0.f; return r; }
  static R load(const float* p) { R r; for (int i = 0; i < W; ++i) r.v[i] = p[i]; return r; }
  static R loadc(const float* p) { return load(p); }
  static R loadc(const uint16_t* p) {
    R r;
    for (int i = 0; i < W; ++i) {
      uint32_t u = uint32_t(p[i]) << 16;
      std::memcpy(&r.v[i], &u, 4);
    }
    return r;
  }
  template <typename F, typename = std::enable_if_t<is_fp8<F>>>
  static R loadc(const F* p) { R r; for (int i = 0; i < W; ++i) r.v[i] = cvt(p[i]); return r; }
  static void store(float* p, R x) { for (int i = 0; i < W; ++i) p[i] = x.v[i]; }
  static R set1(float x) { R r; for (int i = 0; i < W; ++i) r.v[i] = x; return r; }
  static R fmadd(R a, R b, R c) { for (int i = 0; i < W; ++i) c.v[i] = std::fma(a.v[i], b.v[i], c.v[i]); return c; }
  static R add(R a, R b) { for (int i = 0; i < W; ++i) a.v[i] += b.v[i]; return a; }
  static R sub(R a, R b) { for (int i = 0; i < W; ++i) a.v[i] -= b.v[i]; return a; }
  static R mul(R a, R b) { for (int i = 0; i < W; ++i) a.v[i] *= b.v[i]; return a; }
  static R max(R a, R b) { for (int i = 0; i < W; ++i) a.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i]; return a; }
  static unsigned gt_mask(R a, R b) {
    unsigned m = 0;
    for (int i = 0; i < W; ++i) m |= unsigned(a.v[i] > b.v[i]) << i;
    return m;
  }
  static R exp(R x) { for (int i = 0; i < W; ++i) x.v[i] = std::exp(x.v[i]); return x; }
};

// int8 index scoring: 4 signed bytes per word, products summed per lane
struct VI {
  struct R {
    int32_t v[8];
  };
  static constexpr int PACK = 4, QOFF = 0;
  static R dot(R acc, R q, R k) {
    for (int i = 0; i < V::W; ++i)
      for (int b = 0; b < 4; ++b)
        acc.v[i] += int32_t(int8_t(uint32_t(q.v[i]) >> (8 * b))) * int32_t(int8_t(uint32_t(k.v[i]) >> (8 * b)));
    return acc;
  }
  static R load(const int32_t* p) { R r; for (int i = 0; i < V::W; ++i) r.v[i] = p[i]; return r; }
  static R set1(int32_t x) { R r; for (int i = 0; i < V::W; ++i) r.v[i] = x; return r; }
  static V::R to_float(R x) { V::R r; for (int i = 0; i < V::W; ++i) r.v[i] = float(x.v[i]); return r; }
};

constexpr int HB_IDX = 2, KVB_IDX = 4;
constexpr int HB_PV = 2, VB_PV = 2;

#include "dsa_kernels_impl.h"

}  // namespace

#include "dsa_isa_entry.h"

}  // namespace portable
}  // namespace sgl_dsa
