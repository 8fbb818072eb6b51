"""transformers reference generations on the SmolLM2 GGUF's own (dequantized) weights.

The GGUF is converted once to a float32 HF directory under ~/.cache/sglang-test/ (keyed by file
name, size and mtime), then loaded with transformers in the requested dtype. Usable as a script:
`python -m sglang.test.smollm2_reference [GGUF] [--prompt ...] [--max-new-tokens N] [--dtype float32]`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from typing import Optional, Union

import torch

CACHE_ROOT = os.path.join(os.path.expanduser("~"), ".cache", "sglang-test")


def cached_hf_dir(gguf_path: str, cache_root: str = CACHE_ROOT) -> str:
    """HF directory (float32 weights) converted from `gguf_path`, built on first use and reused after."""
    from sglang.srt.model_loader.gguf_loader import gguf_to_hf_dir

    st = os.stat(gguf_path)
    stem = os.path.splitext(os.path.basename(gguf_path))[0]
    out_dir = os.path.join(cache_root, f"{stem}-{st.st_size}-{int(st.st_mtime)}-float32")
    if os.path.isfile(os.path.join(out_dir, "model.safetensors")):
        return out_dir
    os.makedirs(cache_root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".convert-", dir=cache_root)
    try:
        gguf_to_hf_dir(gguf_path, tmp, dtype="float32")
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        try:
            os.rename(tmp, out_dir)  # atomic publish; a concurrent writer may have won
        except OSError:
            if not os.path.isfile(os.path.join(out_dir, "model.safetensors")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def transformers_greedy(
    gguf_path: str,
    prompt: Union[str, list[int]],
    max_new_tokens: int,
    dtype: Union[torch.dtype, str] = torch.float32,
) -> list[int]:
    """Greedy continuation (new token ids only) of `prompt` by transformers on the GGUF's weights.

    A str prompt is tokenized without special tokens added (SmolLM2 adds no BOS); stops at EOS.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype)
    hf_dir = cached_hf_dir(gguf_path)
    if isinstance(prompt, str):
        tokenizer = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
        input_ids = tokenizer(prompt, add_special_tokens=True).input_ids
    else:
        input_ids = list(prompt)
    model = AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch_dtype, local_files_only=True, attn_implementation="eager"
    ).eval()
    ids = torch.tensor([input_ids], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
        )
    return out[0, ids.shape[1] :].tolist()


def main(argv: Optional[list[str]] = None) -> None:
    from sglang.srt.model_loader.default_model import find_default_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", nargs="?", default=None)
    parser.add_argument("--prompt", default="The capital of France is")
    parser.add_argument("--max-new-tokens", type=int, default=12)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    ids = transformers_greedy(args.gguf or find_default_model(), args.prompt, args.max_new_tokens, args.dtype)
    print(ids)


if __name__ == "__main__":
    main()
