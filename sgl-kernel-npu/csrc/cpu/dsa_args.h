// Plain argument blocks shared by the binding (dsa_ops.cpp) and the per-instruction-set kernel
// translation units (dsa_isa_*.cpp). No torch headers here or in the kernel units: they are
// compiled with different -m flags, and an inline function from a shared header compiled with
// AVX-512 could be the copy the linker keeps for an AVX2 machine.
#pragma once
#include <cstdint>
#include <type_traits>

namespace sgl_dsa {

// I8: index keys only (an int8 key cache); E4M3 / E5M2: FP8 rows (dsa_fp8.h): the latent rows of
// the sparse attention (either, with one scale), e4m3 index keys with per-block scales
enum class DType : int { F32 = 0, BF16 = 1, I8 = 2, E4M3 = 3, E5M2 = 4 };
// the indexer's scoring precision (cpu.py passes the value)
enum class Score : int { F32 = 0, BF16 = 1, INT8 = 2 };

// Paged rows: position j of request b is row block_table[b * bt_stride + j / block_size] *
// block_size + j % block_size; a row starts at base + row * row_stride (elements).
struct Rows {
  const void* base;
  int64_t row_stride;
};

struct IndexerArgs {
  DType q_dtype;        // of q
  DType k_dtype;        // of the key rows (need not be q's)
  Score score;          // BF16: q and keys rounded to bf16 (round-to-nearest-even) before the
                        // products; products exact, sums in float32. INT8: q rows (per token and
                        // head) and key rows quantized to symmetric int8 (scale amax / 127), exact
                        // int32 dot products, scales and head weights applied in float32
  bool bf16_dot;        // with Score::BF16 on the avx512bf16 build: vdpbf16ps instead of float32 FMAs on
                        // the rounded values (same products; on Sapphire / Emerald Rapids vdpbf16ps
                        // does half the multiply-adds per cycle of two FMA ports, so off by default)
  const void* q;        // [T, N, D], d contiguous
  int64_t q_stride_t, q_stride_h;
  const float* w;       // [T, N] float32 contiguous
  Rows keys;            // [R, D]
  const float* key_scale;  // int8 key rows (k_dtype I8, Score::INT8): one scale per row; FP8 key rows
                           // (E4M3): one per block of key_scale_block elements; else nullptr
  int64_t key_scale_stride;  // floats between two rows' scales
  int key_scale_block;       // elements per scale (int8: the head dim)
  const int32_t* block_table;
  int64_t bt_stride;
  int64_t block_size;
  const int32_t* q_batch;  // [T]
  const int32_t* kv_end;   // [T]
  int64_t num_tokens;
  int n_heads, head_dim, topk;
  int32_t* out_idx;     // [T, topk]
  float* out_val;       // [T, topk] or nullptr
};

struct SparseAttnArgs {
  DType dtype;            // of q and q_rope (and of the rows unless they are FP8)
  DType kv_dtype;         // of the key, key_rope and value rows: dtype, or E4M3 / E5M2
  float kv_scale;         // FP8 rows: real value = code x kv_scale (1 otherwise)
  const void* q;          // [T, N, Dk]
  int64_t q_stride_t, q_stride_h;
  const void* q_rope;     // [T, N, Dr] or nullptr
  int64_t qr_stride_t, qr_stride_h;
  Rows key, key_rope, value;  // key_rope.base may be nullptr
  const int32_t* block_table;
  int64_t bt_stride;
  int64_t block_size;
  const int32_t* q_batch;  // [T]
  const int32_t* kv_limit; // [T] a query's valid positions are [0, kv_limit)
  const int32_t* indices;  // [T, K] positions, -1 = none
  int64_t idx_stride;
  int64_t num_tokens;
  int n_heads, dk, dr, dv, topk;
  float scale;
  float* out;   // [T, N, Dv] float32
  float* lse;   // [T, N] float32
};

struct MergeArgs {
  int parts;
  const float* const* outs;  // parts x [rows, D] float32 contiguous
  const float* const* lses;  // parts x [rows]
  int64_t rows;
  int64_t dim;
  float* out;  // [rows, D]
  float* lse;  // [rows]
};

// One entry per instruction set, defined in dsa_isa_<name>.cpp.
#define SGL_DSA_DECLARE(isa)                                                  \
  namespace isa {                                                             \
  void indexer_topk(const IndexerArgs& a, int64_t t0, int64_t t1);            \
  void sparse_attention(const SparseAttnArgs& a, int64_t t0, int64_t t1);     \
  void merge_states(const MergeArgs& a, int64_t r0, int64_t r1);              \
  }

SGL_DSA_DECLARE(portable)
SGL_DSA_DECLARE(avx2)
SGL_DSA_DECLARE(avx2vnni)
SGL_DSA_DECLARE(avx512)
SGL_DSA_DECLARE(avx512vnni)
SGL_DSA_DECLARE(avx512bf16)

}  // namespace sgl_dsa
