"""Write a W8A8-INT8 checkpoint of a float HF checkpoint (one model.safetensors), in the
compressed-tensors format (llm-compressor's W8A8-INT8 config: int8 per-channel weights, dynamic
per-token int8 activations, symmetric) or SGLang's `w8a8_int8`, so that this engine and vLLM-CPU
load the same file for a side-by-side (benchmark/vs_vllm). Round-to-nearest per output row, no
smoothing or calibration (llm-compressor's SmoothQuant / GPTQ would do better on outlier-heavy
models). Quantized: every 2-D decoder `*_proj` weight; embeddings and norms stay float, and so
does the LM head unless `--lm-head`: then the head is written in int8 with its per-row scale as
`lm_head.weight` (a tied model untied: its embedding stays float, `tie_word_embeddings` false;
compressed-tensors names the head among its targets), which upstream SGLang, vLLM and this engine
load as an int8 head.

    python benchmark/quant/write_w8a8_checkpoint.py SRC_DIR OUT_DIR [--format compressed-tensors] [--lm-head]

With no SRC_DIR given, the default model's GGUF converted to float32 (`smollm2_reference`).
"""

from __future__ import annotations

import argparse
import json
import os

from safetensors import safe_open
from safetensors.torch import save_file

from sglang.srt.layers.quantization.w8a8_int8 import channel_quantize_int8
from sglang.test.quantized_checkpoints import write_quantized_pair
from sglang.test.tiny_fp8_models import is_quantized
from sglang.test.tiny_w8a8_models import w8a8_config


def quantize(name, t):
    q, s = channel_quantize_int8(t)
    return {"": q, "_scale": s.to(t.dtype)}, None


def add_int8_head(out: str) -> None:
    """A tied checkpoint in `out` untied, its head the embedding quantized to int8 (+ scale)."""
    path = os.path.join(out, "model.safetensors")
    with safe_open(path, framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    if "lm_head.weight" not in tensors:
        stored, _ = quantize("lm_head.weight", tensors["model.embed_tokens.weight"])
        tensors.update({"lm_head.weight" + k: v for k, v in stored.items()})
    save_file(tensors, path, metadata={"format": "pt"})
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    cfg["tie_word_embeddings"] = False
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", nargs="?", help="HF directory with one model.safetensors (float weights)")
    p.add_argument("out", help="output folder; the checkpoint goes to OUT/<format>")
    p.add_argument("--format", choices=["compressed-tensors", "w8a8_int8"], default="compressed-tensors")
    p.add_argument("--lm-head", action="store_true", help="the LM head in int8 too (a tied model untied)")
    args = p.parse_args()
    src = args.src
    if src is None:
        from sglang.srt.model_loader.default_model import find_default_model
        from sglang.test.smollm2_reference import cached_hf_dir

        src = cached_hf_dir(find_default_model())

    def select(name, t):
        return is_quantized(name, t.dim()) or (args.lm_head and name == "lm_head.weight")

    config = w8a8_config(args.format, args.lm_head)
    out, _ = write_quantized_pair(src, args.out, args.format, select, quantize, config, dequant=False)
    if args.lm_head:
        add_int8_head(out)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"wrote {out} ({size / 2**20:.0f} MiB) from {src}")


if __name__ == "__main__":
    main()
