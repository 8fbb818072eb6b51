"""DeepSeek Sparse Attention (DeepSeek-V3.2): the Lightning Indexer (`indexer.py`) picks each query's
top-k past tokens; `sparse_attention.py` attends to just those latent KV rows."""
