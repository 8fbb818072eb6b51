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
import tempfile
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENIZER_DIR = os.path.join(REPO, "python", "sglang", "test", "assets", "tiny-deepseek-v32")

DSV32_SHAPE = dict(
    architectures=["DeepseekV32ForCausalLM"],
    model_type="deepseek_v32",
    vocab_size=4096,
    hidden_size=1024,
    intermediate_size=2048,
    moe_intermediate_size=256,
    num_hidden_layers=8,
    first_k_dense_replace=1,
    num_attention_heads=16,
    num_key_value_heads=16,
    q_lora_rank=384,
    kv_lora_rank=256,
    qk_nope_head_dim=64,
    qk_rope_head_dim=64,
    v_head_dim=64,
    n_routed_experts=16,
    num_experts_per_tok=4,
    n_group=1,
    topk_group=1,
    n_shared_experts=1,
    routed_scaling_factor=1.0,
    norm_topk_prob=True,
    index_n_heads=16,
    index_head_dim=64,
    index_topk=2048,
    hidden_act="silu",
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=16384,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
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
