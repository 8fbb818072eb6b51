// kv_store: write the K and V rows of n tokens into one layer's head-major KV pool buffers at
// their slots, in one call (mem_cache/kv_pool.py `MHATokenToKVPool.set_kv_buffer`, the scattered
// writes of decode steps and prefix-cache hits: in torch, two reshapes, two casts, two views and
// two index_copy_ calls, ~14 us a layer at one token; here ~2 us).
//   k_buf [H, rows, D], v_buf [H, rows, Dv]: contiguous, the pool's dtype (any: bytes are copied);
//   loc int64 [n]: slots in [0, rows), checked before anything is written;
//   k [n, H * D] or [n, H, D], v alike: the same dtype as the buffers, each token's values
//   contiguous (any row stride: a slice of a fused qkv output).
// Byte copies: the same values the torch path stores (no rounding; FP8 pools keep that path).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstring>

namespace {
// the row stride (elements) of a token's `width` contiguous values in x, checked
int64_t token_stride(const at::Tensor& x, int64_t n, int64_t width, const char* name) {
  TORCH_CHECK((x.dim() == 2 || x.dim() == 3) && x.size(0) == n, "kv_store: ", name, " must be [n, H * D] or [n, H, D]");
  const int64_t inner = x.dim() == 2 ? x.size(1) : x.size(1) * x.size(2);
  TORCH_CHECK(inner == width, "kv_store: ", name, " holds ", inner, " values a token, the pool ", width);
  TORCH_CHECK(x.stride(-1) == 1 && (x.dim() == 2 || x.stride(1) == x.size(2)),
              "kv_store: each token's ", name, " values must be contiguous");
  return x.stride(0);
}

void check_buffer(const at::Tensor& buf, const at::Tensor& x, const char* name) {
  TORCH_CHECK(buf.device().is_cpu() && x.device().is_cpu(), "kv_store: tensors must be on the CPU");
  TORCH_CHECK(buf.dim() == 3 && buf.is_contiguous(), "kv_store: the ", name, " buffer must be a contiguous [H, rows, D]");
  TORCH_CHECK(buf.scalar_type() == x.scalar_type(), "kv_store: ", name, " is ", x.scalar_type(), ", the pool ",
              buf.scalar_type());
}
}  // namespace

void kv_store(at::Tensor& k_buf, at::Tensor& v_buf, const at::Tensor& loc, const at::Tensor& k, const at::Tensor& v) {
  check_buffer(k_buf, k, "k");
  check_buffer(v_buf, v, "v");
  TORCH_CHECK(loc.scalar_type() == at::kLong && loc.dim() == 1 && loc.is_contiguous() && loc.device().is_cpu(),
              "kv_store: loc must be a contiguous int64 [n] CPU tensor");
  const int64_t n = loc.size(0), heads = k_buf.size(0), rows = k_buf.size(1), dk = k_buf.size(2), dv = v_buf.size(2);
  TORCH_CHECK(v_buf.size(0) == heads && v_buf.size(1) == rows, "kv_store: k and v buffers differ in heads or rows");
  const int64_t ks = token_stride(k, n, heads * dk, "k"), vs = token_stride(v, n, heads * dv, "v");
  const int64_t* slots = loc.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(slots[i] >= 0 && slots[i] < rows, "kv_store: slot ", slots[i], " outside the pool's ", rows, " rows");
  const int64_t es = k.element_size();
  auto* kb = static_cast<char*>(k_buf.data_ptr());
  auto* vb = static_cast<char*>(v_buf.data_ptr());
  const auto* kp = static_cast<const char*>(k.data_ptr());
  const auto* vp = static_cast<const char*>(v.data_ptr());
  auto body = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t h = 0; h < heads; ++h) {
        std::memcpy(kb + ((h * rows + slots[i]) * dk) * es, kp + (i * ks + h * dk) * es, dk * es);
        std::memcpy(vb + ((h * rows + slots[i]) * dv) * es, vp + (i * vs + h * dv) * es, dv * es);
      }
  };
  if (n * heads < 256) {
    body(0, n);  // decode sizes: no parallel region
  } else {
    at::parallel_for(0, n, 64, body);
  }
}
