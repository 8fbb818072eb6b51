"""Turning launch flags into a chunk policy (`--enable-dynamic-chunking`, `--dynamic-chunking-mode`).

`build_chunk_policy` takes any object with the `ServerArgs` field names (tests pass plain
namespaces); the profiling and wiring into the pipeline ring are in `managers/scheduler/chunk_profiler.py`.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Protocol, Sequence

from sglang.srt.managers.dynamic_chunking.auto_planner import AutoChunkPlanner
from sglang.srt.managers.dynamic_chunking.pipeline import TransferModel
from sglang.srt.managers.dynamic_chunking.predictor import ChunkSizePredictor

logger = logging.getLogger(__name__)

MODES = ("upstream", "auto")


class ChunkPolicy(Protocol):
    """What the pipeline ring needs of a chunk policy (`ChunkSizePredictor`, `AutoChunkPlanner`)."""

    def fit(self, lengths: Sequence[int], latencies: Sequence[float], *, warmup: int = 1) -> bool:
        """Fit on the start-up profile (every rank with the same numbers); False: fixed chunks."""

    def chunk_budget(self, prompt_len: int, prefix_len: int, pp_size: int) -> int:
        """Token budget of the next chunk of a prompt of `prompt_len` tokens, `prefix_len` done."""

    def observe(self, prefix_len: int, chunk_len: int, latency_s: float) -> None:
        """One finished chunk's slowest-stage time (shared by every rank of stage 0, same order)."""


def resolve_dynamic_chunking(
    enable: bool, mode: str, pp_size: int, chunked_prefill_size: Optional[int]
) -> Optional[str]:
    """The effective mode ("upstream" / "auto") or None for fixed chunks, with a warning when
    the flag is set but cannot act. `--dynamic-chunking-mode auto` implies the enable flag."""
    if mode not in MODES:
        raise ValueError(f"--dynamic-chunking-mode must be one of {list(MODES)}, got {mode!r}")
    wanted = enable or mode == "auto"
    if not wanted:
        return None
    if pp_size <= 1:
        logger.warning(
            "--enable-dynamic-chunking only matters with --pp-size > 1 (pp_size=%d); using fixed chunks", pp_size
        )
        return None
    if chunked_prefill_size is None or chunked_prefill_size <= 0:
        logger.warning("--enable-dynamic-chunking needs --chunked-prefill-size > 0; using fixed chunks")
        return None
    return mode


def build_chunk_policy(server_args: Any, context_len: Optional[int] = None) -> Optional[ChunkPolicy]:
    """An unfitted predictor/planner for these args, or None (fixed chunks). The caller then
    profiles (`profile_lengths`), shares the latencies and calls `fit` / `seed_profile`."""
    mode = resolve_dynamic_chunking(
        bool(getattr(server_args, "enable_dynamic_chunking", False)),
        str(getattr(server_args, "dynamic_chunking_mode", "upstream")),
        int(server_args.pp_size),
        server_args.chunked_prefill_size,
    )
    if mode is None:
        return None
    c = int(server_args.chunked_prefill_size)
    if mode == "upstream":
        return ChunkSizePredictor(
            c,
            page_size=server_args.page_size,
            max_prefill_tokens=server_args.max_prefill_tokens,
            context_len=context_len,
        )
    return AutoChunkPlanner(
        c,
        page_size=server_args.page_size,
        max_chunk_size=max(c, int(server_args.max_prefill_tokens)),
        transfer=TransferModel(),
        async_depth=int(getattr(server_args, "pp_async_batch_depth", 0)),
        **_platform_tiles(server_args, c),
    )


def _platform_tiles(server_args: Any, chunk_size: int) -> dict:
    """The platform's attention-tile alignment and smallest efficient chunk for auto mode; not
    applied when C itself is below twice them (a deliberately small C keeps small chunks)."""
    plat = _platform(server_args)
    if chunk_size < 2 * max(plat.prefill_chunk_alignment, plat.prefill_min_chunk):
        return {}
    return {"min_alignment": plat.prefill_chunk_alignment, "min_chunk": plat.prefill_min_chunk}


def _platform(server_args: Any):
    from sglang.srt.platforms import current_platform, get_platform

    device = getattr(server_args, "device", None)
    return get_platform(device) if device else current_platform()
