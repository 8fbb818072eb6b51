"""Dynamic chunk sizes for chunked pipeline prefill (pure; no process groups, no torch).

- `ChunkSizePredictor`: upstream-compatible (`--enable-dynamic-chunking`,
  `SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR`).
- `AutoChunkPlanner`: `--dynamic-chunking-mode auto` (online fit, TTFT-minimising plans).
- `ChunkPolicy`: which of them (or fixed chunks) runs, with which numbers; the engine's flags and
  the simulator's text both become one, and `build` makes the planner (a `ChunkPlanner`).
- `run_pipeline` / `uniform_makespan`: the ring timing both the planner and `tools/pp_sim` use.
See docs/dynamic_chunking.md.
"""

from sglang.srt.managers.dynamic_chunking.auto_planner import AutoChunkPlanner
from sglang.srt.managers.dynamic_chunking.config import (
    MODES,
    build_chunk_policy,
    chunk_policy_from_args,
    resolve_dynamic_chunking,
)
from sglang.srt.managers.dynamic_chunking.latency_model import (
    ChunkSample,
    FitError,
    QuadraticLatencyModel,
    fit_cumulative,
    robust_fit_chunks,
)
from sglang.srt.managers.dynamic_chunking.pipeline import (
    PipelineTimeline,
    TransferModel,
    run_pipeline,
    uniform_makespan,
)
from sglang.srt.managers.dynamic_chunking.policy import POLICY_KINDS, ChunkPlanner, ChunkPolicy
from sglang.srt.managers.dynamic_chunking.predictor import (
    ChunkSizePredictor,
    chunk_alignment,
    merge_stage_latencies,
    profile_lengths,
)
from sglang.srt.managers.dynamic_chunking.profiling import time_prefills

__all__ = [
    "AutoChunkPlanner",
    "ChunkPlanner",
    "ChunkPolicy",
    "ChunkSample",
    "ChunkSizePredictor",
    "FitError",
    "MODES",
    "POLICY_KINDS",
    "PipelineTimeline",
    "QuadraticLatencyModel",
    "TransferModel",
    "build_chunk_policy",
    "chunk_alignment",
    "chunk_policy_from_args",
    "fit_cumulative",
    "merge_stage_latencies",
    "profile_lengths",
    "resolve_dynamic_chunking",
    "robust_fit_chunks",
    "run_pipeline",
    "time_prefills",
    "uniform_makespan",
]
