"""Write a W8A8-INT8 checkpoint of a float HF checkpoint (one model.safetensors), in the
compressed-tensors format (llm-compressor's W8A8-INT8 config: int8 per-channel weights, dynamic
per-token int8 activations, symmetric) or SGLang's `w8a8_int8`, so that this engine and vLLM-CPU
load the same file for a side-by-side (benchmark/vs_vllm). Round-to-nearest per output row, no
smoothing or calibration (llm-compressor's SmoothQuant / GPTQ would do better on outlier-heavy
models). Quantized: every 2-D decoder `*_proj` weight; embeddings, LM head and norms stay float.

    python benchmark/quant/write_w8a8_checkpoint.py SRC_DIR OUT_DIR [--format compressed-tensors]

With no SRC_DIR given, the default model's GGUF converted to float32 (`smollm2_reference`).
"""

from __future__ import annotations

import argparse
import os

from sglang.srt.layers.quantization.w8a8_int8 import channel_quantize_int8
from sglang.test.quantized_checkpoints import write_quantized_pair
from sglang.test.tiny_fp8_models import is_quantized
from sglang.test.tiny_w8a8_models import COMPRESSED_TENSORS_W8A8, W8A8_INT8


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", nargs="?", help="HF directory with one model.safetensors (float weights)")
    p.add_argument("out", help="output folder; the checkpoint goes to OUT/<format>")
    p.add_argument("--format", choices=["compressed-tensors", "w8a8_int8"], default="compressed-tensors")
    args = p.parse_args()
    src = args.src
    if src is None:
        from sglang.srt.model_loader.default_model import find_default_model
        from sglang.test.smollm2_reference import cached_hf_dir

        src = cached_hf_dir(find_default_model())

    def quantize(name, t):
        q, s = channel_quantize_int8(t)
        return {"": q, "_scale": s.to(t.dtype)}, None

    config = COMPRESSED_TENSORS_W8A8 if args.format == "compressed-tensors" else W8A8_INT8
    out, _ = write_quantized_pair(
        src, args.out, args.format, lambda n, t: is_quantized(n, t.dim()), quantize, config, dequant=False
    )
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"wrote {out} ({size / 2**20:.0f} MiB) from {src}")


if __name__ == "__main__":
    main()
