"""How the engine starts its rank, DP-controller and detokenizer processes, per device family
(torch-free: the HTTP process asks before anything imports torch).

- CPU: `forkserver`. The fork server imports torch and the scheduler modules once
  (`CHILD_PRELOAD`), and every rank is forked from it: a rank skips the ~3 CPU-s of imports a
  fresh interpreter pays (docs/notes/2026-11-test-time.md). In an `Engine` the server lives as long
  as the launching process, so later engines start their ranks without any import. The children's
  environment is the launcher's at launch time (`entrypoints/launch.py` passes it), not the fork
  server's.
- CUDA / NPU: `spawn`. A fork must never carry a device context; a fresh interpreter is the only
  start that cannot.
The detokenizer is always spawned (`detokenizer_context`): it imports neither torch nor
transformers (it decodes with `tokenizers` from the launcher's tokenizer), so a fresh interpreter
costs it a fraction of a second and keeps torch out of its memory.
"""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing.context import BaseContext

START_METHODS = {"cpu": "forkserver", "cuda": "spawn", "npu": "spawn"}
CHILD_PRELOAD = ("torch", "sglang.srt.managers.scheduler.scheduler_process")


def child_context(device: str) -> BaseContext:
    """The multiprocessing context the engine starts its children with on `device`."""
    method = START_METHODS.get(str(device).split(":", 1)[0].lower(), "spawn")
    if method not in mp.get_all_start_methods():
        method = "spawn"
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(list(CHILD_PRELOAD))  # read when the server first starts
    return ctx


def detokenizer_context() -> BaseContext:
    """The detokenizer's start (any device): a fresh, torch-free interpreter."""
    return mp.get_context("spawn")
