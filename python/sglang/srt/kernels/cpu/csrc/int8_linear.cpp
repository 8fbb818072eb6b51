// int8_linear: the W8A8-INT8 linear in one call (layers/quantization/w8a8_int8.py defines it):
//   x [M, K] (float32 / bf16) quantized per row: s = amax|x| / 127 (1 for a zero row),
//   q = clamp(round_half_even(x / s), -127, 127); acc[m, n] = sum_k q[m, k] * W[n, k] in int32;
//   out[m, n] = dtype(float(acc) * s[m] * ws[n]) (+ bias, added in x's dtype), written in x's dtype.
//
// The weight is packed once at load (pack_int8_vnni, w8a8_int8.py): blocks of 16 output columns,
// in each block groups of 4 consecutive k with the 16 columns' 4 bytes side by side (one 64-byte
// vector per k group), K padded to a multiple of 4 and N to a multiple of 16 with zeros; `comp`
// [Np] int32 = 128 * sum_k W[n, k] and `ws` [Np] float32 the scales (padding 0).
//
// The products, per build:
//   avx512bf16 (AVX512-VNNI): vpdpbusd on u8 = q + 128 and the s8 weights, minus comp (exact);
//   avx512 (no VNNI) / avx2: vpmaddubsw on |W| (u8 <= 128) and q * sign(W) (s8, |.| <= 127), so a
//     pair sums to at most 32512 (no saturation), then vpmaddwd by ones into int32;
//   portable: int32 loops.
// The avx512 and avx2 builds carry the kernel twice (int8_linear_kernel.h): as the build's flags
// compile it (`int8_linear`), and under `#pragma GCC target` with AVX512-VNNI / AVX-VNNI
// (`int8_linear_vnni`: vpdpbusd as above, AVX-VNNI's on 256-bit vectors), which the avx512vnni and
// avx2vnni ISAs (Cascade Lake, Ice Lake; Alder Lake and later) run: isa.py, kernel_dispatch.py.
// Tiles of up to 4 rows of x times NB blocks (16 * NB columns); tasks are column ranges (times row
// chunks for large M), split over the OpenMP threads, so a decode call reads every weight byte once
// for all its rows. The epilogue follows the reference's float order ((acc * s) * ws, rounded to the
// dtype, then + bias and rounded again); the file is compiled without FMA contraction.
// swiglu (bf16 x, a [gate; up] weight): tiles pair gate block j with up block j + N / 32, and the
// epilogue stores silu(gate) * up (silu_vec.h) of the values above: [M, N / 2], the [M, N]
// activation never written (the gate_up layer of a SwiGLU MLP, w8a8_int8.py `apply_swiglu`).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>

#include "vec_exp2.h"
#include "silu_vec.h"
#endif
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512VNNI__)
#define SGL_INT8_AMX 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "amx_tiles.h"
#endif
// the second copy of the kernel (GCC's target pragma)
#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__) && !defined(__AVX512VNNI__)
#define SGL_INT8_VNNI_TARGET "avx512vnni"
#elif defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && !defined(__AVX512F__) && defined(__AVX2__) && \
    defined(__FMA__) && !defined(__AVXVNNI__)
#define SGL_INT8_VNNI_TARGET "avxvnni"
#endif
#if defined(SGL_INT8_VNNI_TARGET) && !defined(SGL_INT8_AMX)
#include <cpuid.h>
#endif

#pragma GCC optimize("fp-contract=off")

namespace {
namespace base {
#include "int8_linear_kernel.h"
}  // namespace base

#if defined(SGL_INT8_VNNI_TARGET)
#pragma GCC push_options
#if defined(__AVX512F__)
#pragma GCC target("avx512vnni")
#else
#pragma GCC target("avxvnni")
#endif
#define SGL_I8_EXTRA_VNNI 1
namespace vnni {
#include "int8_linear_kernel.h"
}  // namespace vnni
#undef SGL_I8_EXTRA_VNNI
#pragma GCC pop_options
#endif

// x, the packed weight, its sums and scales, bias as int8_linear takes them; returns Kp
int64_t check_args(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& comp, const at::Tensor& ws,
                   int64_t N, const std::optional<at::Tensor>& bias) {
  constexpr int64_t kLanes = base::kLanes;
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu(), "int8_linear: tensors must be on the CPU");
  TORCH_CHECK((x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) && x.dim() == 2 && x.stride(1) == 1,
              "int8_linear: x must be a float32 / bfloat16 [M, K] tensor with contiguous rows");
  const int64_t K = x.size(1), Kp = (K + 3) / 4 * 4, blocks = (N + kLanes - 1) / kLanes;
  TORCH_CHECK(packed.scalar_type() == at::kChar && packed.is_contiguous() && packed.numel() == blocks * Kp * kLanes,
              "int8_linear: packed must be the contiguous int8 [ceil(N / 16), ceil(K / 4), 16, 4] of pack_int8_vnni");
  TORCH_CHECK(comp.scalar_type() == at::kInt && comp.is_contiguous() && comp.numel() == blocks * kLanes,
              "int8_linear: comp must be a contiguous int32 [ceil(N / 16) * 16] tensor");
  TORCH_CHECK(ws.scalar_type() == at::kFloat && ws.is_contiguous() && ws.numel() == blocks * kLanes,
              "int8_linear: weight_scale must be a contiguous float32 [ceil(N / 16) * 16] tensor");
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == x.scalar_type() && bias->dim() == 1 && bias->size(0) == N &&
                    bias->is_contiguous(),
                "int8_linear: bias must be a contiguous [N] tensor of x's dtype");
  }
  return Kp;
}

using RunF = void (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const std::optional<at::Tensor>&, at::Tensor&, int64_t, int64_t, bool);

// swiglu: the weight is a gate_up projection ([gate; up], N / 2 columns each): out [M, N / 2] =
// silu(gate) * up of the values the plain call would return
at::Tensor linear_with(RunF run_float, RunF run_bf16, const at::Tensor& x, const at::Tensor& packed,
                       const at::Tensor& comp, const at::Tensor& ws, int64_t N, const std::optional<at::Tensor>& bias,
                       bool swiglu) {
  const int64_t Kp = check_args(x, packed, comp, ws, N, bias);
  TORCH_CHECK(!swiglu || (x.scalar_type() == at::kBFloat16 && N % (2 * base::kLanes) == 0),
              "int8_linear: swiglu needs a bfloat16 x and N a multiple of 32 (each half whole 16-column blocks), got N = ",
              N, " and x ", x.scalar_type());
  auto out = at::empty({x.size(0), swiglu ? N / 2 : N}, x.options());
  if (x.size(0) == 0 || N == 0) return out;
  (x.scalar_type() == at::kFloat ? run_float : run_bf16)(x, packed, comp, ws, bias, out, N, Kp, swiglu);
  return out;
}
}  // namespace

std::string int8_linear_impl() {
#if defined(SGL_INT8_AMX)
  if (base::amx_int8_ready()) return std::string(base::kImpl) + "+amx";
#endif
  return base::kImpl;
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& comp, const at::Tensor& ws,
                       int64_t N, const std::optional<at::Tensor>& bias, bool swiglu) {
  return linear_with(&base::run<float>, &base::run<uint16_t>, x, packed, comp, ws, N, bias, swiglu);
}

// "" where this build has no VNNI copy
std::string int8_linear_vnni_impl() {
#if defined(SGL_INT8_VNNI_TARGET)
  return vnni::kImpl;
#else
  return "";
#endif
}

at::Tensor int8_linear_vnni(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& comp,
                            const at::Tensor& ws, int64_t N, const std::optional<at::Tensor>& bias, bool swiglu) {
#if defined(SGL_INT8_VNNI_TARGET)
  // CPUID (not __builtin_cpu_supports: GCC 11 does not know "avxvnni"): AVX512-VNNI is leaf 7.0
  // ECX bit 11, AVX-VNNI leaf 7.1 EAX bit 4; the OS saves the vector state the build needs already.
  // Asked once: under a hypervisor every CPUID is a VM exit (asked per call, ~18 us of a 7 us call)
  static const bool has = [] {
    unsigned int a = 0, b = 0, c = 0, d = 0;
#if defined(__AVX512F__)
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 11)) != 0;
#else
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4)) != 0;
#endif
  }();
  TORCH_CHECK(has, "int8_linear_vnni: this CPU lacks " SGL_INT8_VNNI_TARGET " (use int8_linear)");
  return linear_with(&vnni::run<float>, &vnni::run<uint16_t>, x, packed, comp, ws, N, bias, swiglu);
#else
  TORCH_CHECK(false, "int8_linear_vnni: this build has no VNNI copy (use int8_linear)");
#endif
}
