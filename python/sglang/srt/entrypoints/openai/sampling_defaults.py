"""`--sampling-defaults model`: the sampling parameters a /v1 request leaves out come from the
checkpoint's `generation_config.json` (upstream's default); `openai`: the OpenAI / SGLang defaults."""

from __future__ import annotations

import json
import os
from typing import Any

from sglang.srt.model_loader.model_files import strip_dummy_prefix

# generation_config.json keys taken as defaults (SGLang's names are the same)
DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def model_sampling_defaults(model_path: str) -> dict[str, Any]:
    """The sampling defaults of a model directory's generation_config.json ({} when it has none)."""
    path = os.path.join(strip_dummy_prefix(model_path), "generation_config.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    return {k: config[k] for k in DEFAULT_KEYS if config.get(k) is not None}


def sampling_defaults(server_args: Any) -> dict[str, Any]:
    """The defaults the OpenAI routes put under a request's own sampling parameters."""
    if server_args.sampling_defaults != "model" or not os.path.isdir(
        strip_dummy_prefix(server_args.model_path)
    ):
        return {}
    return model_sampling_defaults(server_args.model_path)
