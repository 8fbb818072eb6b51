"""A slower dummy model for the suite: tiny-llama's tokenizer with an 8-layer, 512-wide config,
so that one long prefill takes seconds and a long generation many seconds on a CPU core."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from server_helpers import TINY_LLAMA


def make_mid_llama(parent: Path) -> str:
    path = parent / "mid-llama"
    shutil.copytree(TINY_LLAMA, path)
    config = json.loads((path / "config.json").read_text())
    config.update(
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=16384,
    )
    (path / "config.json").write_text(json.dumps(config))
    return str(path)
