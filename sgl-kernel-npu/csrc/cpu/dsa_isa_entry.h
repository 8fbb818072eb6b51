// The exported entry points of one instruction-set build: included by every dsa_isa_*.cpp inside
// its `sgl_dsa::<isa>` namespace, after the anonymous namespace holding dsa_kernels_impl.h.
void indexer_topk(const IndexerArgs& a, int64_t t0, int64_t t1) { indexer_impl(a, t0, t1); }
template <typename E>
void sparse_rows(const SparseAttnArgs& a, int64_t t0, int64_t t1) {
  if (a.kv_dtype == DType::E4M3) sparse_impl<E, fp8_e4m3>(a, t0, t1);
  else if (a.kv_dtype == DType::E5M2) sparse_impl<E, fp8_e5m2>(a, t0, t1);
  else sparse_impl<E, E>(a, t0, t1);
}
void sparse_attention(const SparseAttnArgs& a, int64_t t0, int64_t t1) {
  if (a.dtype == DType::BF16) sparse_rows<uint16_t>(a, t0, t1);
  else sparse_rows<float>(a, t0, t1);
}
void merge_states(const MergeArgs& a, int64_t r0, int64_t r1) { merge_impl(a, r0, r1); }
