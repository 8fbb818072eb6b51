"""Server layouts of `run_mixed.py` (`--layout`): the model, and the flags and torch threads of the
prefill, decode and colocated servers.

- `smollm2` (the original comparison): SmolLM2-135M-Instruct (the embedded GGUF), prefill and
  decode one rank each (one torch thread), against one colocated rank (`--colocated-threads`).
- `seeds`: the seeds' recommended deployment (issue 27; seed 002 §deployment, seed 003's
  `PP1 DP16 EP16` decode) at two ranks a side: prefill `--cp-size 2` (each long prompt split over
  two context-parallel ranks), decode `--tp-size 2 --dp-size 2 --enable-dp-attention --ep-size 2`
  (two attention replicas, experts split over both ranks), against a colocated server with the
  same four ranks (`--colocated-layout`), one torch thread per rank everywhere.
  Model: a dummy (random-weight) DeepSeek-V3.2 sized for a 2-core, 24 GiB machine (`DSV32_SHAPE`):
  8 layers (the first dense), hidden 1024, 16 heads, q-LoRA 384, kv-LoRA 256 + rope 64, Lightning
  Indexer 16 heads x 64, index_topk 2048, 16 routed experts (top 4, intermediate 256) + 1 shared,
  dense intermediate 2048, vocab 4096 (about 136M parameters, SmolLM2-135M's size); float32 and
  the `dsa` attention backend (as in benchmark/dsa); the tokenizer of the tiny test model.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dp_attention"))
from bench_dp_attention import SHAPE as DP_SHAPE  # noqa: E402  (the MoE model of benchmark/dp_attention)
from bench_dp_attention import TOKENIZER_DIR  # noqa: E402

# benchmark/dp_attention's MoE DeepSeek with DeepSeek-V3.2's Lightning Indexer (benchmark/dsa's sizes)
DSV32_SHAPE = dict(
    DP_SHAPE,
    architectures=["DeepseekV32ForCausalLM"],
    model_type="deepseek_v32",
    index_n_heads=16,
    index_head_dim=64,
    index_topk=2048,
    max_position_embeddings=16384,
    pad_token_id=0,
    torch_dtype="float32",
)

# the colocated server of the `seeds` layout: four ranks, like prefill cp 2 + decode dp 2
COLOCATED_SEEDS = {
    # the same strategies in one server: each of two attention replicas prefills over cp 2, experts over 4
    "dp2-cp2": [
        "--tp-size",
        "4",
        "--dp-size",
        "2",
        "--enable-dp-attention",
        "--cp-size",
        "2",
        "--ep-size",
        "4",
    ],
    # the decode layout widened to four ranks
    "dp4": ["--tp-size", "4", "--dp-size", "4", "--enable-dp-attention", "--ep-size", "4"],
    # plain tensor parallelism (the indexer repeated on every rank), experts over 4
    "tp4": ["--tp-size", "4", "--ep-size", "4"],
}


@dataclass
class Layout:
    name: str
    model_args: list[str] = field(default_factory=list)  # every server
    prefill: list[str] = field(default_factory=list)
    decode: list[str] = field(default_factory=list)
    colocated: list[str] = field(default_factory=list)
    colocated_threads: int | None = None  # None: --colocated-threads
    tokenizer: str | None = None  # None: the embedded SmolLM2's
    id_range: tuple[int, int] = (1000, 40000)  # the long prompts' random token ids
    shape: dict | None = None
    dtype: str | None = None  # the servers' --dtype where --dtype is auto
    prefill_cp: int = 1  # the transfer figures are the prefill's first rank's: 1 / cp of the positions


def write_dsv32(root: str) -> str:
    path = os.path.join(root, "deepseek-v32-pd-bench")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(DSV32_SHAPE, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZER_DIR, name), path)
    return path


def build_layout(name: str, colocated: str = "dp2-cp2", attention_backend: str = "dsa") -> Layout:
    if name == "smollm2":
        return Layout(name)
    if name != "seeds":
        raise ValueError(f"--layout must be one of ['seeds', 'smollm2'], got {name!r}")
    if colocated not in COLOCATED_SEEDS:
        raise ValueError(f"--colocated-layout must be one of {sorted(COLOCATED_SEEDS)}, got {colocated!r}")
    model = write_dsv32(tempfile.gettempdir())
    return Layout(
        name,
        model_args=[
            *("--model-path", model, "--load-format", "dummy"),
            *("--attention-backend", attention_backend),
        ],
        dtype="float32",
        prefill_cp=2,
        prefill=["--cp-size", "2"],
        decode=["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention", "--ep-size", "2"],
        colocated=COLOCATED_SEEDS[colocated],
        colocated_threads=1,
        tokenizer=model,
        id_range=(3, DSV32_SHAPE["vocab_size"]),
        shape=DSV32_SHAPE,
    )
