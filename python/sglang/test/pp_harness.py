"""Drive a pipeline-parallel engine in-process on spawned gloo ranks with a scripted workload, and
the same workload on one in-process `Scheduler` (the pp = 1 reference).

    waves = [[req("a", ids_a), req("b", ids_b)], [req("c", ids_b)]]      # wave 2 after wave 1 is done
    triggers = [When("b", min_kv_len=16, send=[AbortReq(rid="b")])]      # abort b mid-prefill
    ref = run_single_rank(server_kwargs, waves, triggers)
    got = run_ranks(pp_rank_main, world_size, args=(server_kwargs, waves, triggers))[0]["outputs"]

`ScriptedIO` stands in for the entry rank's `SchedulerIO` (a `SchedulerPort`): it releases the
next wave when the scheduler is idle (`recv_all(block=True)`), fires each trigger once its
condition holds on the scheduler's request mirror, and collects the `BatchTokenIDOut` messages it
is given (`emit`) per request.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Optional

from sglang.srt.managers.io_struct import BatchTokenIDOut, TokenizedGenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams


def req(rid: str, input_ids: list[int], max_new_tokens: int = 16, **params: Any) -> TokenizedGenerateReqInput:
    """A request with logprobs: greedy (temperature 0) and ignore_eos unless `params` say otherwise."""
    sp = SamplingParams(
        **{"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True, **params}
    )
    return TokenizedGenerateReqInput(rid, None, list(input_ids), sp, return_logprob=True)


@dataclass
class When:
    """Send `send` once request `rid` has `min_kv_len` tokens scheduled and `min_output` tokens out."""

    rid: str
    send: list
    min_kv_len: int = 0
    min_output: int = 0

    def due(self, scheduler: Any) -> bool:
        for r in scheduler.running:
            if r.rid == self.rid and r.kv_len >= self.min_kv_len and len(r.output_ids) >= self.min_output:
                return True
        return False


@dataclass
class RequestResult:
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: Optional[dict] = None
    cached_tokens: int = 0


class ScriptedIO:
    """Test double of `SchedulerIO` for the entry rank (see module docstring)."""

    def __init__(self, waves: list[list], triggers: Optional[list[When]] = None):
        self.waves = [list(w) for w in waves]
        self.triggers = list(triggers or [])
        self.next_wave = 0
        self.scheduler: Any = None
        self.emitted: list = []  # what the detokenizer would get
        self.replies: list = []  # what the tokenizer would get

    def bind(self, scheduler: Any) -> "ScriptedIO":
        self.scheduler = scheduler
        return self

    def recv_all(self, block: bool) -> list:
        out: list = []
        for t in list(self.triggers):
            if t.due(self.scheduler):
                out.extend(t.send)
                self.triggers.remove(t)
        if block and self.next_wave < len(self.waves):
            out.extend(self.waves[self.next_wave])
            self.next_wave += 1
        return out

    def reply(self, msg: Any) -> None:
        self.replies.append(msg)

    def emit(self, out: Any) -> None:
        self.emitted.append(out)

    def finished(self) -> bool:
        return self.next_wave == len(self.waves)

    def results(self) -> dict[str, RequestResult]:
        res: dict[str, RequestResult] = defaultdict(RequestResult)
        for out in self.emitted:
            assert isinstance(out, BatchTokenIDOut)
            for i, rid in enumerate(out.rids):
                r = res[rid]
                r.output_ids.extend(out.new_output_ids[i])
                if out.output_token_logprobs[i]:
                    r.logprobs.extend(lp for lp, _ in out.output_token_logprobs[i])
                r.cached_tokens = out.cached_tokens[i]
                if out.finished_reasons[i] is not None:
                    r.finish = out.finished_reasons[i]
        return dict(res)


def run_single_rank(server_kwargs: dict, waves: list[list], triggers: Optional[list[When]] = None) -> dict:
    """The workload on one in-process Scheduler (pp = 1, tp = 1): {rid: RequestResult}."""
    import copy

    from sglang.srt.managers.scheduler.scheduler import Scheduler
    from sglang.srt.server_args import ServerArgs

    kwargs = {**server_kwargs, "pp_size": 1, "tp_size": 1, "pp_trace_path": None}
    args = ServerArgs(**kwargs)
    args.validate()
    scheduler = Scheduler(args)
    io = ScriptedIO(copy.deepcopy(waves), copy.deepcopy(triggers)).bind(scheduler)
    while True:
        idle = not scheduler.has_work
        msgs = io.recv_all(block=idle)
        if idle and not msgs and io.finished():
            break
        scheduler.apply_messages(msgs, io)
        out = scheduler.step()
        if out is not None:
            io.emit(out)
    return {
        "outputs": io.results(),
        "state": scheduler.internal_state(),
        "num_retractions": scheduler.num_retractions,
    }


def pp_rank_main(
    rank: int,
    world_size: int,
    server_kwargs: dict,
    waves: list[list],
    triggers: Optional[list] = None,
    env: Optional[dict] = None,
) -> dict:
    """Body of one spawned rank (see test/distributed/dist_spawn.py): build this rank's part of the
    pipeline, run the workload, stop the ring; the entry rank returns the outputs. `env` is set
    in the rank's process first (e.g. SGLANG_PP_LAYER_PARTITION)."""
    import os

    from sglang.srt.distributed.parallel_state import ParallelGroups, ParallelLayout
    from sglang.srt.managers.pp.rank import build_pp_rank
    from sglang.srt.server_args import ServerArgs

    os.environ.update(env or {})
    args = ServerArgs(**server_kwargs)
    args.validate()
    layout = ParallelLayout.from_server_args(args)
    if layout.world_size != world_size:
        raise ValueError(f"{layout.describe()} needs {layout.world_size} ranks, got {world_size}")
    groups = ParallelGroups.build(layout, rank, "gloo")
    io = ScriptedIO(waves, triggers) if groups.is_entry_rank else None
    pp = build_pp_rank(args, groups, io=io)
    if io is not None:
        io.bind(pp.scheduler)
    pp.run(stop=io.finished if io is not None else None)
    result: dict = {"rank": rank, "pp_rank": groups.pp.rank, "tp_rank": groups.tp.rank}
    if pp.scheduler is not None:
        result["state"] = pp.scheduler.internal_state()
        result["stats"] = dataclasses.asdict(pp.loop.stats)
        result["num_retractions"] = pp.scheduler.num_retractions
        result["layers"] = (pp.scheduler.runner.start_layer, pp.scheduler.runner.end_layer)
    else:
        result["micro_batches"] = pp.loop.num_micro_batches
        result["layers"] = (pp.loop.runner.start_layer, pp.loop.runner.end_layer)
    if io is not None:
        result["outputs"] = io.results()
    return result
