"""Convert a GGUF file into an HF transformers directory.

Usage: python -m sglang.srt.tools.gguf_to_hf GGUF OUT_DIR [--dtype bfloat16|float32|float16]
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from sglang.srt.model_loader.gguf_loader import gguf_to_hf_dir


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sglang.srt.tools.gguf_to_hf", description=__doc__.splitlines()[0]
    )
    parser.add_argument("gguf", help="path of the .gguf file")
    parser.add_argument("out_dir", help="directory to write (created if missing)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    args = parser.parse_args(argv)
    out = gguf_to_hf_dir(args.gguf, args.out_dir, dtype=args.dtype)
    print(f"wrote HF directory {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
