"""A/B of AMX prefill-attention kernel sources on one 4K causal layer (SmolLM2 shape).

    .venv/bin/python benchmark/vs_vllm/prefill_attention_ab.py \
        python/sglang/srt/kernels/cpu/csrc/prefill_attention_amx.cpp /tmp/variant.cpp

Each source is built as its own extension (with -march=native, like the JIT build this was measured with); calls alternate
between them for `--rounds` rounds of 3 and the best time of each is printed, with the largest
difference from the torch reference (float32 SDPA). This is how the kernel versions in
profile_notes.md were compared. Run on an idle machine; 2 threads unless `--threads`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
from torch.utils import cpp_extension
from tqdm import tqdm

_BIND = r"""
#include <torch/extension.h>
#include <optional>
bool prefill_attention_supported();
at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                             const std::optional<at::Tensor>& k_cache, const std::optional<at::Tensor>& v_cache,
                             const std::optional<at::Tensor>& prefix_slots, const std::optional<at::Tensor>& out);
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("prefill_attention_supported", &prefill_attention_supported);
  m.def("prefill_attention", &prefill_attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scale"),
        py::arg("k_cache") = py::none(), py::arg("v_cache") = py::none(), py::arg("prefix_slots") = py::none(),
        py::arg("out") = py::none());
}
"""


def build(src: str, bind: str, i: int):
    bin_dir = os.path.dirname(sys.executable)  # the venv's ninja
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    return cpp_extension.load(
        name=f"prefill_ab_{i}_{abs(hash(os.path.abspath(src))) % 10**8}",
        sources=[bind, src],
        extra_include_paths=[os.path.dirname(os.path.abspath(src))],
        extra_cflags=[
            "-O3",
            "-march=native",
            "-fopenmp",
            "-fno-math-errno",
            "-fno-trapping-math",
            "-mprefer-vector-width=512",
        ],
        extra_ldflags=["-fopenmp"],
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sources", nargs="+")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        bind = os.path.join(tmp, "bind.cpp")
        with open(bind, "w") as f:
            f.write(_BIND)
        mods = [build(src, bind, i) for i, src in enumerate(args.sources)]
    if not mods[0].prefill_attention_supported():
        raise SystemExit("this CPU has no AMX")
    g = torch.Generator().manual_seed(0)
    n, h, hk = args.tokens, args.heads, args.kv_heads
    q = torch.randn(n, h, 64, generator=g).bfloat16()
    k = torch.randn(n, hk, 64, generator=g).bfloat16()
    v = torch.randn(n, hk, 64, generator=g).bfloat16()
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1).float(),
        k.transpose(0, 1).float(),
        v.transpose(0, 1).float(),
        is_causal=True,
        scale=0.125,
        enable_gqa=h != hk,
    ).transpose(0, 1)
    best = [float("inf")] * len(mods)
    for _ in tqdm(range(args.rounds), desc="rounds"):
        for i, m in enumerate(mods):
            for _ in range(3):
                t = time.perf_counter()
                m.prefill_attention(q, k, v, 0.125)
                best[i] = min(best[i], time.perf_counter() - t)
    for src, m, b in zip(args.sources, mods, best):
        err = (m.prefill_attention(q, k, v, 0.125).float() - ref).abs().max().item()
        print(f"{src}: {b * 1e3:.2f} ms per layer (max |diff| vs float32 SDPA {err:.4f})")


if __name__ == "__main__":
    main()
