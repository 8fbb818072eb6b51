"""What the launching process needs to know per device family before any rank exists, torch-free
(the HTTP process asks without importing torch): the defaults of `--chunked-prefill-size` and
`--attention-backend` (the platform objects answer from here too) and how the engine starts its
rank, DP-controller and detokenizer processes.

Start of the children:

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
# --chunked-prefill-size when not given (CPU: platforms/cpu.py says why 2048)
CHUNKED_PREFILL_DEFAULTS = {"cpu": 2048, "cuda": 8192, "npu": 8192}
# --prefill-pack-tokens when not given, as a fraction of the chunk (0: off). CPU: half. Prompts that
# arrive together are then prefilled one after another once a step holds half a chunk, so the first
# gets its first token a whole step earlier; a CPU GEMM runs near its peak from ~1K rows on, so the
# steps cost little more in all (docs/notes/2026-11-vs-vllm.md: SmolLM2, (d) TTFT median 647 -> 410 ms).
PREFILL_PACK_FRACTIONS = {"cpu": 0.5}
# --attention-backend when not given (CPU: the fused-kernel backend)
ATTENTION_BACKEND_DEFAULTS = {"cpu": "cpu", "cuda": "torch_native", "npu": "torch_native"}


def device_family(device: str) -> str:
    """'cuda:1' -> 'cuda'."""
    return str(device).split(":", 1)[0].lower()


def default_chunked_prefill_size(device: str) -> int:
    return CHUNKED_PREFILL_DEFAULTS.get(device_family(device), 8192)


def default_prefill_pack_tokens(device: str, chunked_prefill_size: int) -> int:
    return int(chunked_prefill_size * PREFILL_PACK_FRACTIONS.get(device_family(device), 0.0))


def default_attention_backend(device: str) -> str:
    return ATTENTION_BACKEND_DEFAULTS.get(device_family(device), "torch_native")


CHILD_PRELOAD = (
    "torch",
    "sglang.srt.managers.scheduler.scheduler_process",
    # what every rank's first `AutoConfig` import pays (~1.5 CPU-s: transformers' config base pulls
    # torch.distributed.tensor); a module another transformers lacks is skipped by the fork server
    "transformers.configuration_utils",
    "transformers.models.auto.configuration_auto",
    "transformers.utils.type_validators",
    "transformers.modeling_rope_utils",
)


def child_context(device: str) -> BaseContext:
    """The multiprocessing context the engine starts its children with on `device`."""
    method = START_METHODS.get(device_family(device), "spawn")
    if method not in mp.get_all_start_methods():
        method = "spawn"
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(list(CHILD_PRELOAD))  # read when the server first starts
    return ctx


def detokenizer_context() -> BaseContext:
    """The detokenizer's start (any device): a fresh, torch-free interpreter."""
    return mp.get_context("spawn")
