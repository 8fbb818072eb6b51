// Python binding of the DSA CPU kernels: argument checks, the instruction-set dispatch, torch's
// thread pool. Which ISA runs is chosen in Python by SGLang's one selector (sglang/srt/kernels/cpu/
// isa.py, SGLANG_CPU_ISA; sgl_kernel_npu/cpu.py passes its choice): here an ISA's translation unit
// is called only where the CPU reports the flags its code needs (never a SIGILL), and "auto" (a
// caller without SGLang) takes the first of them.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>  // the ATen ops this file calls
#include <torch/csrc/utils/pybind.h>  // at::Tensor arguments in pybind11 (torch/extension.h: ~4x the parse time)
#include <ATen/Parallel.h>

#include <string>
#include <vector>

#include "dsa_args.h"

namespace sgl_dsa {
namespace {

// the flags each ISA's code is compiled for (its `#pragma GCC target`), as isa.py names them
bool cpu_has(const std::string& isa) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx2 =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  if (isa == "avx512bf16")
    return avx512 && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vnni");
  if (isa == "avx512vnni") return avx512 && __builtin_cpu_supports("avx512vnni");
  if (isa == "avx512") return avx512;
  if (isa == "avx2vnni") return avx2 && __builtin_cpu_supports("avxvnni");
  if (isa == "avx2") return avx2;
#endif
  return isa == "portable";
}

enum class Isa { Portable, Avx2, Avx2Vnni, Avx512, Avx512Vnni, Avx512Bf16 };

// best first: the vocabulary of sglang/srt/kernels/cpu/isa.py (setup.py checks every name has its
// dsa_isa_<name>.cpp); every CPU with avx512_bf16 has avx512_vnni
constexpr int N_ISAS = 6;
const char* const ISAS[N_ISAS] = {"avx512bf16", "avx512vnni", "avx512", "avx2vnni", "avx2", "portable"};
const Isa ISA_IDS[N_ISAS] = {Isa::Avx512Bf16, Isa::Avx512Vnni, Isa::Avx512, Isa::Avx2Vnni, Isa::Avx2, Isa::Portable};

Isa pick(const std::string& isa) {
  for (int i = 0; i < N_ISAS; ++i) {
    if (isa == "auto" ? cpu_has(ISAS[i]) : isa == ISAS[i]) {
      TORCH_CHECK(cpu_has(ISAS[i]), "this CPU cannot run the ", ISAS[i], " kernels");
      return ISA_IDS[i];
    }
  }
  TORCH_CHECK(false, "unknown instruction set '", isa, "' (auto, avx512bf16, avx512vnni, avx512, avx2vnni, avx2, portable)");
  return Isa::Portable;
}

DType dtype_of(const at::Tensor& t) {
  if (t.scalar_type() == at::kFloat) return DType::F32;
  TORCH_CHECK(t.scalar_type() == at::kBFloat16, "DSA CPU kernels take float32 or bfloat16, got ", t.scalar_type());
  return DType::BF16;
}

bool is_fp8(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat8_e4m3fn || t.scalar_type() == at::kFloat8_e5m2;
}

// rows in the query's dtype, or FP8 (all of one call's rows alike: `st`)
void check_rows(const at::Tensor& rows, const char* name, at::ScalarType st) {
  TORCH_CHECK(rows.dim() == 2 && rows.stride(1) == 1, name, " must be 2-D rows with contiguous columns");
  TORCH_CHECK(rows.scalar_type() == st, name, " dtype ", rows.scalar_type(), " differs from the key's ", st);
}

}  // namespace

std::string pick_isa(const std::string& isa) {
  const Isa which = pick(isa);
  for (int i = 0; i < N_ISAS; ++i)
    if (ISA_IDS[i] == which) return ISAS[i];
  return "portable";
}

bool cpu_supports(const std::string& isa) { return cpu_has(isa); }

std::vector<std::string> isas() {
#if defined(__x86_64__)
  return std::vector<std::string>(ISAS, ISAS + N_ISAS);
#else
  return {"portable"};
#endif
}

// q [T, N, D]; w [T, N] float32; key_rows [R, D]; block_table [B, M] int32; q_batch, kv_end [T] int32.
// q and key_rows are float32 or bfloat16, each its own, or key_rows int8 with key_scale [R] float32
// (an int8 key cache, int8 scoring only), or float8_e4m3fn with key_scale [R, ceil(D / scale_block)]
// float32 (columns contiguous, rows strided: an FP8 index-key cache, any scoring). score (Score): 0 the products of the values as given, in
// float32; 1 both rounded to bf16 before the products (float32 sums); 2 per-row int8 (dsa_args.h).
std::vector<at::Tensor> indexer_topk(const at::Tensor& q, const at::Tensor& w, const at::Tensor& key_rows,
                                     const c10::optional<at::Tensor>& key_scale, const at::Tensor& block_table,
                                     int64_t block_size, const at::Tensor& q_batch, const at::Tensor& kv_end,
                                     int64_t topk, bool want_values, int64_t score, bool bf16_dot,
                                     int64_t scale_block, const std::string& isa) {
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "query must be [T, N, D] with contiguous D");
  TORCH_CHECK(key_rows.dim() == 2 && key_rows.stride(1) == 1, "key must be 2-D rows with contiguous columns");
  TORCH_CHECK(key_rows.size(1) == q.size(2), "key dim ", key_rows.size(1), " != query dim ", q.size(2));
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.is_contiguous() && w.size(0) == q.size(0) && w.size(1) == q.size(1),
              "weights must be contiguous float32 [T, N]");
  TORCH_CHECK(block_table.scalar_type() == at::kInt && block_table.stride(1) == 1, "block_table must be int32");
  TORCH_CHECK(q_batch.scalar_type() == at::kInt && kv_end.scalar_type() == at::kInt && q_batch.is_contiguous() &&
                  kv_end.is_contiguous(),
              "q_batch / kv_end must be contiguous int32");
  TORCH_CHECK(score >= 0 && score <= 2, "score must be 0 (float32), 1 (bf16) or 2 (int8), got ", score);
  const bool i8 = key_rows.scalar_type() == at::kChar;
  const bool f8 = key_rows.scalar_type() == at::kFloat8_e4m3fn;
  TORCH_CHECK(key_rows.scalar_type() != at::kFloat8_e5m2, "FP8 index keys are float8_e4m3fn (DeepSeek's format)");
  const bool scaled = key_scale.has_value() && key_scale->defined();
  TORCH_CHECK((i8 || f8) == scaled && (!i8 || score == 2),
              "int8 key rows (int8 scoring only) and FP8 key rows come with key_scale, other rows without");
  int64_t scale_stride = 0;
  int blk = int(q.size(2));
  if (i8)
    TORCH_CHECK(key_scale->scalar_type() == at::kFloat && key_scale->dim() == 1 && key_scale->stride(0) == 1 &&
                    key_scale->numel() == key_rows.size(0),
                "key_scale of int8 rows must be contiguous float32 [R], one scale per key row");
  if (i8) scale_stride = 1;
  if (f8) {
    TORCH_CHECK(scale_block > 0, "scale_block must be > 0");
    blk = int(scale_block);
    TORCH_CHECK(key_scale->scalar_type() == at::kFloat && key_scale->dim() == 2 && key_scale->stride(1) == 1 &&
                    key_scale->size(0) == key_rows.size(0) && key_scale->size(1) == (q.size(2) + blk - 1) / blk,
                "key_scale of FP8 rows must be float32 [R, ceil(D / scale_block)] with contiguous columns");
    scale_stride = key_scale->stride(0);
  }
  const int64_t T = q.size(0);
  auto idx = at::empty({T, topk}, q.options().dtype(at::kInt));
  at::Tensor val = want_values ? at::empty({T, topk}, q.options().dtype(at::kFloat)) : at::Tensor();
  IndexerArgs a{dtype_of(q), i8 ? DType::I8 : f8 ? DType::E4M3 : dtype_of(key_rows), Score(score), bf16_dot,
                q.data_ptr(), q.stride(0), q.stride(1), w.data_ptr<float>(),
                Rows{key_rows.data_ptr(), key_rows.stride(0)}, scaled ? key_scale->data_ptr<float>() : nullptr,
                scale_stride, blk, block_table.data_ptr<int32_t>(), block_table.stride(0),
                block_size, q_batch.data_ptr<int32_t>(), kv_end.data_ptr<int32_t>(), T, int(q.size(1)),
                int(q.size(2)), int(topk), idx.data_ptr<int32_t>(), want_values ? val.data_ptr<float>() : nullptr};
  const Isa which = pick(isa);
  at::parallel_for(0, T, 8, [&](int64_t t0, int64_t t1) {
    if (false) {
#if defined(__x86_64__)
    } else if (which == Isa::Avx512Bf16) { avx512bf16::indexer_topk(a, t0, t1);
    } else if (which == Isa::Avx512Vnni) { avx512vnni::indexer_topk(a, t0, t1);
    } else if (which == Isa::Avx512) { avx512::indexer_topk(a, t0, t1);
    } else if (which == Isa::Avx2Vnni) { avx2vnni::indexer_topk(a, t0, t1);
    } else if (which == Isa::Avx2) { avx2::indexer_topk(a, t0, t1);
#endif
    } else { portable::indexer_topk(a, t0, t1); }
  });
  return {idx, val};
}

// q [T, N, Dk], q_rope [T, N, Dr] (optional); key/key_rope/value rows [R, *]; indices [T, K] int32.
// The rows are in the query's dtype, or all FP8 (e4m3 / e5m2: an FP8 latent cache, real value = code
// x kv_scale).
std::vector<at::Tensor> sparse_attention(const at::Tensor& q, const c10::optional<at::Tensor>& q_rope,
                                         const at::Tensor& key_rows, const c10::optional<at::Tensor>& key_rope_rows,
                                         const at::Tensor& value_rows, const at::Tensor& block_table,
                                         int64_t block_size, const at::Tensor& q_batch, const at::Tensor& kv_limit,
                                         const at::Tensor& indices, double scale, double kv_scale,
                                         const std::string& isa) {
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "query must be [T, N, Dk] with contiguous Dk");
  const at::ScalarType row_type = is_fp8(key_rows) ? key_rows.scalar_type() : q.scalar_type();
  TORCH_CHECK(is_fp8(key_rows) || kv_scale == 1.0, "kv_scale applies to FP8 rows only");
  check_rows(key_rows, "key", row_type);
  check_rows(value_rows, "value", row_type);
  TORCH_CHECK(key_rows.size(1) == q.size(2), "key dim ", key_rows.size(1), " != query dim ", q.size(2));
  const bool rope = q_rope.has_value() && q_rope->defined();
  TORCH_CHECK(rope == (key_rope_rows.has_value() && key_rope_rows->defined()),
              "query_rope and key_rope come together");
  if (rope) {
    TORCH_CHECK(q_rope->dim() == 3 && q_rope->stride(2) == 1 && q_rope->size(0) == q.size(0) &&
                    q_rope->size(1) == q.size(1) && q_rope->scalar_type() == q.scalar_type(),
                "query_rope must be [T, N, Dr] like the query");
    check_rows(*key_rope_rows, "key_rope", row_type);
    TORCH_CHECK(key_rope_rows->size(1) == q_rope->size(2), "key_rope dim != query_rope dim");
  }
  TORCH_CHECK(indices.scalar_type() == at::kInt && indices.dim() == 2 && indices.stride(1) == 1 &&
                  indices.size(0) == q.size(0),
              "indices must be int32 [T, K]");
  TORCH_CHECK(block_table.scalar_type() == at::kInt && block_table.stride(1) == 1, "block_table must be int32");
  TORCH_CHECK(q_batch.scalar_type() == at::kInt && kv_limit.scalar_type() == at::kInt && q_batch.is_contiguous() &&
                  kv_limit.is_contiguous() && kv_limit.numel() == q.size(0),
              "q_batch / kv_limit must be contiguous int32 [T]");
  const int64_t T = q.size(0), N = q.size(1), Dv = value_rows.size(1);
  auto out = at::empty({T, N, Dv}, q.options().dtype(at::kFloat));
  auto lse = at::empty({T, N}, q.options().dtype(at::kFloat));
  SparseAttnArgs a{};
  a.dtype = dtype_of(q);
  a.kv_dtype = row_type == at::kFloat8_e4m3fn ? DType::E4M3 : row_type == at::kFloat8_e5m2 ? DType::E5M2 : a.dtype;
  a.kv_scale = float(kv_scale);
  a.q = q.data_ptr();
  a.q_stride_t = q.stride(0);
  a.q_stride_h = q.stride(1);
  a.q_rope = rope ? q_rope->data_ptr() : nullptr;
  a.qr_stride_t = rope ? q_rope->stride(0) : 0;
  a.qr_stride_h = rope ? q_rope->stride(1) : 0;
  a.key = Rows{key_rows.data_ptr(), key_rows.stride(0)};
  a.key_rope = rope ? Rows{key_rope_rows->data_ptr(), key_rope_rows->stride(0)} : Rows{nullptr, 0};
  a.value = Rows{value_rows.data_ptr(), value_rows.stride(0)};
  a.block_table = block_table.data_ptr<int32_t>();
  a.bt_stride = block_table.stride(0);
  a.block_size = block_size;
  a.q_batch = q_batch.data_ptr<int32_t>();
  a.kv_limit = kv_limit.data_ptr<int32_t>();
  a.indices = indices.data_ptr<int32_t>();
  a.idx_stride = indices.stride(0);
  a.num_tokens = T;
  a.n_heads = int(N);
  a.dk = int(q.size(2));
  a.dr = rope ? int(q_rope->size(2)) : 0;
  a.dv = int(Dv);
  a.topk = int(indices.size(1));
  a.scale = float(scale);
  a.out = out.data_ptr<float>();
  a.lse = lse.data_ptr<float>();
  const Isa which = pick(isa);
  at::parallel_for(0, T, 4, [&](int64_t t0, int64_t t1) {
    if (false) {
#if defined(__x86_64__)
    } else if (which == Isa::Avx512Bf16) { avx512bf16::sparse_attention(a, t0, t1);
    } else if (which == Isa::Avx512Vnni) { avx512vnni::sparse_attention(a, t0, t1);
    } else if (which == Isa::Avx512) { avx512::sparse_attention(a, t0, t1);
    } else if (which == Isa::Avx2Vnni) { avx2vnni::sparse_attention(a, t0, t1);
    } else if (which == Isa::Avx2) { avx2::sparse_attention(a, t0, t1);
#endif
    } else { portable::sparse_attention(a, t0, t1); }
  });
  return {out, lse};
}

// outs: parts x [rows, D] float32 contiguous; lses: parts x [rows] float32 contiguous.
std::vector<at::Tensor> merge_states(const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& lses,
                                     const std::string& isa) {
  TORCH_CHECK(!outs.empty() && outs.size() == lses.size(), "merge needs as many outputs as lses (>= 1)");
  const int64_t rows = outs[0].size(0), dim = outs[0].size(1);
  std::vector<const float*> op, lp;
  for (size_t i = 0; i < outs.size(); ++i) {
    TORCH_CHECK(outs[i].scalar_type() == at::kFloat && outs[i].is_contiguous() && outs[i].dim() == 2 &&
                    outs[i].size(0) == rows && outs[i].size(1) == dim,
                "merge outputs must be contiguous float32 [rows, D] of one shape");
    TORCH_CHECK(lses[i].scalar_type() == at::kFloat && lses[i].is_contiguous() && lses[i].numel() == rows,
                "merge lses must be contiguous float32 [rows]");
    op.push_back(outs[i].data_ptr<float>());
    lp.push_back(lses[i].data_ptr<float>());
  }
  auto out = at::empty({rows, dim}, outs[0].options());
  auto lse = at::empty({rows}, lses[0].options());
  MergeArgs a{int(outs.size()), op.data(), lp.data(), rows, dim, out.data_ptr<float>(), lse.data_ptr<float>()};
  const Isa which = pick(isa);
  at::parallel_for(0, rows, 64, [&](int64_t r0, int64_t r1) {
    if (false) {
#if defined(__x86_64__)
    } else if (which == Isa::Avx512Bf16) { avx512bf16::merge_states(a, r0, r1);
    } else if (which == Isa::Avx512Vnni) { avx512vnni::merge_states(a, r0, r1);
    } else if (which == Isa::Avx512) { avx512::merge_states(a, r0, r1);
    } else if (which == Isa::Avx2Vnni) { avx2vnni::merge_states(a, r0, r1);
    } else if (which == Isa::Avx2) { avx2::merge_states(a, r0, r1);
#endif
    } else { portable::merge_states(a, r0, r1); }
  });
  return {out, lse};
}

}  // namespace sgl_dsa

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "DSA CPU kernels (lightning indexer, sparse flash attention, LSE merge)";
  m.def("pick_isa", &sgl_dsa::pick_isa, "the instruction set a request resolves to ('auto' -> the best)");
  m.def("cpu_supports", &sgl_dsa::cpu_supports, "whether this CPU has the flags an ISA's code is compiled for");
  m.def("isas", &sgl_dsa::isas, "the ISAs compiled in, best first");
  // the kernels run without the GIL (tensors converted before the call, results after): another
  // Python thread of the process (HiCache's storage prefetch, the KV warmer) runs meanwhile, as
  // with sglang's own CPU kernels (python/sglang/srt/kernels/cpu/csrc/sglang_cpu_ops.cpp)
  const auto no_gil = py::call_guard<py::gil_scoped_release>();
  m.def("indexer_topk", &sgl_dsa::indexer_topk, no_gil);
  m.def("sparse_attention", &sgl_dsa::sparse_attention, no_gil);
  m.def("merge_states", &sgl_dsa::merge_states, no_gil);
}
