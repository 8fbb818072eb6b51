"""One chunk policy type for the engine and the simulator.

`ChunkPolicy` says which policy runs and with which numbers: fixed chunks of C, upstream's
dynamic sizes (C, smooth factor α) or the auto planner (C = the floor's base, chunks up to
`max_chunk`). The engine makes one from its flags (`config.build_chunk_policy`), the simulator
(`tools/pp_sim`) from text (`ChunkPolicy.parse`); both run what `build` returns, a `ChunkPlanner`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, Sequence, Union

from sglang.srt.managers.dynamic_chunking.auto_planner import AutoChunkPlanner
from sglang.srt.managers.dynamic_chunking.latency_model import QuadraticLatencyModel
from sglang.srt.managers.dynamic_chunking.pipeline import TransferModel
from sglang.srt.managers.dynamic_chunking.predictor import ChunkSizePredictor

POLICY_KINDS = ("fixed", "upstream", "auto")
DEFAULT_MAX_PREFILL_TOKENS = 16384  # ServerArgs.max_prefill_tokens default: auto's largest chunk


class ChunkPlanner(Protocol):
    """What the pipeline ring needs of a built policy (`ChunkSizePredictor`, `AutoChunkPlanner`)."""

    def fit(self, lengths: Sequence[int], latencies: Sequence[float], *, warmup: int = 1) -> bool:
        """Fit on the start-up profile (every rank with the same numbers); False: fixed chunks."""

    def chunk_budget(self, prompt_len: int, prefix_len: int, pp_size: int) -> int:
        """Token budget of the next chunk of a prompt of `prompt_len` tokens, `prefix_len` done."""

    def observe(self, prefix_len: int, chunk_len: int, latency_s: float) -> None:
        """One finished chunk's slowest-stage time (shared by every rank of stage 0, same order)."""


@dataclass(frozen=True)
class ChunkPolicy:
    """fixed C | upstream dynamic (C, α) | auto (C = floor base; chunks up to max_chunk).

    `smooth_factor` None: `SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR` (the engine's). `max_chunk`:
    upstream's cap (None: none), auto's largest chunk (None: max(C, 16384)). The rest only the
    engine sets: `context_len` (upstream keeps chunks below it), `async_depth` (auto: ring slots
    beyond pp), `min_alignment` / `min_chunk` (auto: the platform's attention tile)."""

    kind: str
    chunk_size: int
    smooth_factor: Optional[float] = 0.75
    page_size: int = 1
    max_chunk: Optional[int] = None
    context_len: Optional[int] = None
    async_depth: int = 0
    min_alignment: int = 1
    min_chunk: int = 1

    def __post_init__(self) -> None:
        if self.kind not in POLICY_KINDS:
            raise ValueError(f"policy must be one of {POLICY_KINDS}, got {self.kind!r}")

    @property
    def label(self) -> str:
        if self.kind == "upstream":
            alpha = "env" if self.smooth_factor is None else f"{self.smooth_factor:g}"
            return f"upstream C={self.chunk_size} a={alpha}"
        return f"{self.kind} C={self.chunk_size}"

    @classmethod
    def parse(cls, text: str, page_size: int = 1) -> "ChunkPolicy":
        """'fixed:4096', 'upstream:12288:0.65', 'auto:4096[:max_chunk]'."""
        parts = text.split(":")
        kind, c = parts[0], int(parts[1])
        if kind == "upstream":
            alpha = float(parts[2]) if len(parts) > 2 else 0.75
            return cls(kind, c, alpha, page_size)
        max_chunk = int(parts[2]) if len(parts) > 2 else None
        return cls(kind, c, page_size=page_size, max_chunk=max_chunk)

    def build(
        self, prior: Optional[QuadraticLatencyModel] = None, transfer: TransferModel = TransferModel()
    ) -> Union[ChunkSizePredictor, AutoChunkPlanner]:
        """The planner this policy runs. `prior`: a latency model of the slowest stage known
        beforehand (the simulator's; the engine fits one on its start-up profile instead)."""
        if self.kind == "fixed":
            return ChunkSizePredictor(self.chunk_size, page_size=self.page_size, smooth_factor=0.0)
        if self.kind == "upstream":
            predictor = ChunkSizePredictor(
                self.chunk_size,
                page_size=self.page_size,
                smooth_factor=self.smooth_factor,
                max_prefill_tokens=self.max_chunk,
                context_len=self.context_len,
            )
            if prior is not None:
                predictor.set_model(prior)
            return predictor
        return AutoChunkPlanner(
            self.chunk_size,
            page_size=self.page_size,
            max_chunk_size=self.max_chunk or max(self.chunk_size, DEFAULT_MAX_PREFILL_TOKENS),
            prior=prior,
            transfer=transfer,
            async_depth=self.async_depth,
            min_alignment=self.min_alignment,
            min_chunk=self.min_chunk,
        )
