"""Pipeline simulator core: stage cost model, the chunks of a policy, TTFT / bubble / efficiency.

Chunk policies are the engine's own (`ChunkPolicy`, managers/dynamic_chunking/policy.py).

A prompt's chunks flow through `pp` stages (the engine's micro-batch ring, see
`managers/dynamic_chunking/pipeline.py`). Stage s, holding a fraction w_s of the layers, runs
chunk (L, x) in  w_s · (a·(2Lx + x²) + b·x) + c  seconds, where (a, b) are whole-model costs
and c is the fixed cost of one forward on one stage; each hop adds the p2p time of x tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

from sglang.srt.managers.dynamic_chunking import (
    ChunkPolicy,
    PipelineTimeline,
    QuadraticLatencyModel,
    TransferModel,
    run_pipeline,
)


@dataclass(frozen=True)
class StageCostModel:
    """Whole-model chunk costs (a, b), per-stage-forward fixed cost c, p2p hop cost."""

    a: float
    b: float
    c: float = 0.0
    transfer: TransferModel = TransferModel()
    name: str = ""

    def stage_time(self, prefix_len: int, chunk_len: int, weight: float) -> float:
        x = float(chunk_len)
        return weight * (self.a * (2.0 * prefix_len * x + x * x) + self.b * x) + self.c

    def stage_model(self, weight: float) -> QuadraticLatencyModel:
        """The per-stage latency model g(L, x) of a stage holding `weight` of the layers."""
        return QuadraticLatencyModel(self.a * weight, self.b * weight, self.c)

    def scaled(self, compute: float = 1.0, overhead: float = 1.0) -> "StageCostModel":
        """Another machine: compute costs × `compute`, fixed costs × `overhead`."""
        return StageCostModel(self.a * compute, self.b * compute, self.c * overhead, self.transfer, self.name)

    @classmethod
    def from_stage_model(
        cls, model: QuadraticLatencyModel, measured_pp: int = 1, transfer: TransferModel = TransferModel()
    ) -> "StageCostModel":
        """From a per-stage fit made at pipeline size `measured_pp` (even layer split assumed)."""
        return cls(model.a * measured_pp, model.b * measured_pp, model.c, transfer)

    def to_dict(self) -> dict:
        return {
            "a": self.a,
            "b": self.b,
            "c": self.c,
            "p2p_fixed_s": self.transfer.fixed_s,
            "p2p_per_token_s": self.transfer.per_token_s,
            "name": self.name,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "StageCostModel":
        t = TransferModel(float(d.get("p2p_fixed_s", 0.0)), float(d.get("p2p_per_token_s", 0.0)))
        return cls(float(d["a"]), float(d["b"]), float(d.get("c", 0.0)), t, str(d.get("name", "")))


def stage_weights(pp_size: int, partition: Optional[Sequence[int]] = None) -> list[float]:
    """Layer fraction per stage; `partition` is SGLANG_PP_LAYER_PARTITION-style layer counts."""
    if partition is None:
        return [1.0 / pp_size] * pp_size
    if len(partition) != pp_size or any(n < 1 for n in partition):
        raise ValueError(f"partition {list(partition)} must have {pp_size} positive entries")
    total = float(sum(partition))
    return [n / total for n in partition]


def plan_for(
    policy: ChunkPolicy,
    cost: StageCostModel,
    pp_size: int,
    prompt_len: int,
    prefix_len: int = 0,
    partition: Optional[Sequence[int]] = None,
    async_depth: int = 0,
) -> list[int]:
    """The chunk list the engine would run under `policy` (fed the exact cost model)."""
    bottleneck = cost.stage_model(max(stage_weights(pp_size, partition)))
    if policy.kind == "upstream" and pp_size == 1:
        policy = replace(policy, kind="fixed")  # upstream's sizes need a pipeline
    planner = replace(policy, async_depth=async_depth).build(prior=bottleneck, transfer=cost.transfer)
    if policy.kind == "auto":
        return planner.plan_chunks(prompt_len, pp_size, prefix_len)
    return planner.plan_chunks(prompt_len, prefix_len)


@dataclass(frozen=True)
class SimResult:
    pp_size: int
    chunks: list[int]
    timeline: PipelineTimeline
    label: str = ""
    stage_busy: list[float] = field(default_factory=list)

    @property
    def ttft(self) -> float:
        return self.timeline.makespan

    @property
    def stage_bubble(self) -> list[float]:
        """Idle fraction of each stage between the prompt's arrival and its first token."""
        t = self.ttft
        return [1.0 - b / t if t > 0 else 0.0 for b in self.stage_busy]

    @property
    def bubble_ratio(self) -> float:
        t = self.ttft
        return 1.0 - sum(self.stage_busy) / (self.pp_size * t) if t > 0 else 0.0


def simulate(
    cost: StageCostModel,
    pp_size: int,
    chunks: Sequence[int],
    prefix_len: int = 0,
    partition: Optional[Sequence[int]] = None,
    async_depth: int = 0,
    label: str = "",
) -> SimResult:
    """Event-simulate one prompt's `chunks` through `pp_size` stages."""
    weights = stage_weights(pp_size, partition)
    times, hops, done = [], [], prefix_len
    for x in chunks:
        times.append([cost.stage_time(done, x, w) for w in weights])
        hops.append(cost.transfer.hop(x))
        done += x
    timeline = run_pipeline(times, hops, ring_slots=pp_size + async_depth, return_time=cost.transfer.fixed_s)
    busy = [timeline.busy(s) for s in range(pp_size)] if chunks else [0.0] * pp_size
    return SimResult(pp_size, list(chunks), timeline, label, busy)


def simulate_policy(
    policy: ChunkPolicy,
    cost: StageCostModel,
    pp_size: int,
    prompt_len: int,
    prefix_len: int = 0,
    partition: Optional[Sequence[int]] = None,
    async_depth: int = 0,
) -> SimResult:
    chunks = plan_for(policy, cost, pp_size, prompt_len, prefix_len, partition, async_depth)
    return simulate(cost, pp_size, chunks, prefix_len, partition, async_depth, policy.label)


def single_stage_ttft(cost: StageCostModel, prompt_len: int, chunk_size: int, page_size: int = 1) -> float:
    """T1 for strong scaling: the whole model on one stage with fixed chunks of `chunk_size`."""
    return simulate_policy(ChunkPolicy("fixed", chunk_size, page_size=page_size), cost, 1, prompt_len).ttft


def efficiency(t1: float, result: SimResult) -> float:
    """Strong-scaling efficiency T1 / (N · T_N)."""
    return t1 / (result.pp_size * result.ttft) if result.ttft > 0 else 0.0


def plan_table(
    cost: StageCostModel,
    pp_sizes: Sequence[int],
    prompt_lens: Sequence[int],
    policies: Sequence[ChunkPolicy],
    baseline_chunk: int,
    async_depth: int = 0,
) -> list[dict]:
    """Rows of (pp, prompt, policy, chunks, TTFT, bubble, efficiency) for a planning table."""
    rows = []
    for n in prompt_lens:
        t1 = single_stage_ttft(cost, n, baseline_chunk)
        for pp in pp_sizes:
            for pol in policies:
                r = simulate_policy(pol, cost, pp, n, async_depth=async_depth)
                rows.append(
                    {
                        "pp": pp,
                        "prompt_len": n,
                        "policy": pol.label,
                        "num_chunks": len(r.chunks),
                        "first_chunk": r.chunks[0],
                        "last_chunk": r.chunks[-1],
                        "ttft_s": r.ttft,
                        "bubble": r.bubble_ratio,
                        "efficiency": efficiency(t1, r),
                        "t1_s": t1,
                    }
                )
    return rows
