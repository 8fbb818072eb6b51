"""Mixture-of-experts layers: routing (`topk.py`, `router.py`), routed experts sharded over expert
parallel (EP) and MoE tensor parallel ranks (`experts.py`), the token dispatch / combine scheme
(`ep_dispatch.py`) and the MoE block with optional shared experts (`moe_block.py`)."""
