// The exported entry points of one instruction-set build: included by every dsa_isa_*.cpp inside
// its `sgl_dsa::<isa>` namespace, after the anonymous namespace holding dsa_kernels_impl.h.
void indexer_topk(const IndexerArgs& a, int64_t t0, int64_t t1) { indexer_impl(a, t0, t1); }
void sparse_attention(const SparseAttnArgs& a, int64_t t0, int64_t t1) {
  if (a.dtype == DType::BF16) sparse_impl<uint16_t>(a, t0, t1);
  else sparse_impl<float>(a, t0, t1);
}
void merge_states(const MergeArgs& a, int64_t r0, int64_t r1) { merge_impl(a, r0, r1); }
