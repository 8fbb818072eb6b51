"""`--enable-cp-dense-tp` at cp 2: weight bytes per rank of the embedding, LM head and o_proj, off vs on.

A bytes figure, not a timing: each rank builds the model on the meta device (no memory is
allocated, shapes and dtypes only) in a 2-rank gloo group, with the layout the flag gives
(`ParallelLayout(tp=2, attn_cp=2, cp_dense_tp=...)`). Shapes: `dsa`, the dummy DeepSeek-V3.2 of
`benchmark/dsa/run.py` (hidden 1024, 16 heads, v_head_dim 64) with DeepSeek-V3.2's vocabulary
(129280) unless `--vocab` says otherwise; `smollm2`, SmolLM2-135M (vocab 49152, hidden 576, 30
layers, tied embeddings: the LM head is the embedding's weight, counted once in "all").

    python benchmark/context_parallel/bench_cp_dense_tp_bytes.py [--shape dsa|smollm2] [--layers N] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "dsa")]
from bench_cp_prefill import SMOLLM2_SHAPE  # noqa: E402
from run import SHAPE, spawn  # noqa: E402


def _build(shape_name: str, shape: dict, groups, dtype):
    import torch

    if shape_name == "dsa":
        from transformers import DeepseekV32Config

        from sglang.srt.models.deepseek_v2 import DeepseekV32ForCausalLM as cls

        cfg = DeepseekV32Config(index_topk=2048, **shape)
    else:
        from transformers import LlamaConfig

        from sglang.srt.models.llama import LlamaForCausalLM as cls

        cfg = LlamaConfig(**shape)
    with torch.device("meta"):
        return cls(cfg, groups, dtype)


def _rank(rank, cp, port, shape_name, shape, dtype_name, dense_tp, out) -> None:
    import torch

    from sglang.srt.distributed.init import init_distributed
    from sglang.srt.distributed.parallel_layout import ParallelLayout
    from sglang.srt.distributed.parallel_state import ParallelGroups

    init_distributed(cp, rank, f"127.0.0.1:{port}", "gloo")
    groups = ParallelGroups.build(ParallelLayout(tp=cp, attn_cp=cp, cp_dense_tp=dense_tp), rank)
    model = _build(shape_name, shape, groups, getattr(torch, dtype_name))

    def nbytes(params) -> int:
        return sum(p.numel() * p.element_size() for p in {id(p): p for p in params}.values())

    o_proj = [layer.self_attn.o_proj for layer in model.model._stage_layers]
    out.put(
        (
            rank,
            {
                "all": nbytes(model.parameters()),
                "embedding": nbytes(model.model.embed_tokens.parameters()),
                "lm_head": nbytes(model.lm_head.parameters()),
                "o_proj": nbytes(p for m in o_proj for p in m.parameters()),
            },
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=["dsa", "smollm2"], default="dsa")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (dsa: 2, smollm2: 30)")
    ap.add_argument("--vocab", type=int, default=None, help="vocabulary (dsa: 129280, smollm2: 49152)")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    if args.shape == "dsa":
        shape = {**SHAPE, "vocab_size": 129280}
    else:
        shape = dict(SMOLLM2_SHAPE)
    if args.layers:
        shape["num_hidden_layers"] = args.layers
        if args.shape == "dsa":
            shape["first_k_dense_replace"] = args.layers
    if args.vocab:
        shape["vocab_size"] = args.vocab
    res = {flag: spawn(_rank, 2, args.shape, shape, args.dtype, flag) for flag in (False, True)}
    mib = 2**20
    print(
        f"\n--enable-cp-dense-tp, cp 2, {args.shape} ({shape['num_hidden_layers']} layers, hidden "
        f"{shape['hidden_size']}, vocab {shape['vocab_size']}), {args.dtype}: MiB per rank\n"
    )
    parts = ("all", "embedding", "lm_head", "o_proj")
    lines = [
        "| flag | rank | all params | embedding | LM head | o_proj (all layers) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    lines += [
        "| " + " | ".join([("on" if flag else "off"), str(r)] + [f"{x[k] / mib:.1f}" for k in parts]) + " |"
        for flag in (False, True)
        for r, x in enumerate(res[flag])
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
