"""Turning launch flags into a chunk policy (`--enable-dynamic-chunking`, `--dynamic-chunking-mode`).

`chunk_policy_from_args` / `build_chunk_policy` take any object with the `ServerArgs` field names
(tests pass plain namespaces); the profiling and wiring into the pipeline ring are in
`managers/scheduler/chunk_profiler.py`.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from sglang.srt.managers.dynamic_chunking.policy import ChunkPlanner, ChunkPolicy

logger = logging.getLogger(__name__)

MODES = ("upstream", "auto")


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
            "--enable-dynamic-chunking only matters with --pp-size > 1 (pp_size=%d); using fixed chunks",
            pp_size,
        )
        return None
    if chunked_prefill_size is None or chunked_prefill_size <= 0:
        logger.warning("--enable-dynamic-chunking needs --chunked-prefill-size > 0; using fixed chunks")
        return None
    return mode


def chunk_policy_from_args(server_args: Any, context_len: Optional[int] = None) -> Optional[ChunkPolicy]:
    """The policy these flags ask for, or None (fixed chunks)."""
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
        return ChunkPolicy(
            "upstream",
            c,
            smooth_factor=None,  # SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR
            page_size=server_args.page_size,
            max_chunk=server_args.max_prefill_tokens,
            context_len=context_len,
        )
    return ChunkPolicy(
        "auto",
        c,
        page_size=server_args.page_size,
        max_chunk=max(c, int(server_args.max_prefill_tokens)),
        async_depth=int(getattr(server_args, "pp_async_batch_depth", 0)),
        **_platform_tiles(server_args, c),
    )


def build_chunk_policy(server_args: Any, context_len: Optional[int] = None) -> Optional[ChunkPlanner]:
    """An unfitted predictor/planner for these args, or None (fixed chunks). The caller then
    profiles (`profile_lengths`), shares the latencies and calls `fit`."""
    policy = chunk_policy_from_args(server_args, context_len)
    return None if policy is None else policy.build()


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
