"""Rank processes of bench_cp_vs_tp.py: one prompt's prefill and a decode step of a batch over a
full KV pool, on the dummy DeepSeek-V3.2 of benchmark/dsa/run.py (its `_setup`, `_harness`,
`_instrument` and `decode_pool`), model only, one torch thread per rank.

Modes (run.py's `_setup`): "cp" (tokens split zigzag over the ranks), "tp" (heads and MLP split,
the indexer replicated) and "pp" (one layer range per rank). Prefill runs the prompt in chunks of
`chunk` tokens (0: one forward); with pp the stages pipeline the chunks the way the engine's ring
does: stage 0 sends chunk i's activations asynchronously (at most pp.size sends in flight) and goes
on with chunk i+1 over the cached prefix while stage 1 runs chunk i. Decode with pp splits the
batch into pp.size micro-batches kept in flight round after round: stage 0 runs a micro-batch's
next step once the last stage has returned its sampled ids, so both stages stay busy.

Each rank reports wall time, thread CPU time and the time inside the indexer, the sparse attention
and communication (collectives, the CP row exchange, pipeline receives and send waits: a rank's
wait for its peer counts here); "other" is the rest (projections, MLP, norms, LM head).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dsa"))
from run import _harness, _instrument, _setup, decode_pool  # noqa: E402

COMM = [
    ("sglang.srt.distributed.group_coordinator", "GroupCoordinator", "all_reduce"),
    ("sglang.srt.distributed.group_coordinator", "GroupCoordinator", "all_gather"),
    ("sglang.srt.distributed.group_coordinator", "GroupCoordinator", "reduce_scatter"),
    ("sglang.srt.layers.cp_exchange", "PendingGather", "wait"),
]
PARTS = ("indexer", "sparse", "comm")


def _instrument_comm(totals: dict[str, float]) -> None:
    import importlib

    for module_name, cls_name, attr in COMM:
        owner = getattr(importlib.import_module(module_name), cls_name)
        fn = getattr(owner, attr)

        def timed(*args, __fn=fn, **kwargs):
            start = time.perf_counter()
            try:
                return __fn(*args, **kwargs)
            finally:
                totals["comm"] += time.perf_counter() - start

        setattr(owner, attr, timed)


class Clock:
    """Per-rank totals (instrumented parts) and the wall / thread-CPU span of one measured run."""

    def __init__(self):
        self.totals: dict[str, float] = defaultdict(float)
        _instrument(self.totals)
        _instrument_comm(self.totals)
        self.start = self.cpu = 0.0

    def begin(self) -> None:
        self.totals.clear()
        self.start, self.cpu = time.perf_counter(), time.thread_time()

    def record(self) -> dict:
        elapsed, cpu = time.perf_counter() - self.start, time.thread_time() - self.cpu
        rec = {"time": elapsed, "cpu": cpu, **{k: self.totals[k] for k in PARTS}}
        rec["other"] = elapsed - sum(rec[k] for k in PARTS)
        # the same split by thread CPU (robust to other jobs on the box; comm waits fall in other)
        rec.update({f"{k}_cpu": self.totals[f"{k}_cpu"] for k in ("indexer", "sparse")})
        rec["other_cpu"] = cpu - rec["indexer_cpu"] - rec["sparse_cpu"]
        return rec

    def waited(self, fn, *args, **kwargs):
        """fn(...) timed as communication (a pipeline receive or send wait)."""
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.totals["comm"] += time.perf_counter() - start


def _world_barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _prefill_chunks(h, model, groups, ids: list[int], chunk: int, clock: Clock) -> None:
    """One request's prompt in chunks of `chunk` tokens; with pp, this rank's stage of the pipeline."""
    from sglang.srt.model_executor.forward_batch import PPProxyTensors

    pp, req, in_flight = groups.pp, h.new_request(), []
    for start in range(0, len(ids), chunk):
        fb = h.build_batch([(req, ids[start : start + chunk])])
        if not pp.is_first:
            fb.pp_proxy_tensors = PPProxyTensors(clock.waited(pp.recv_tensor_dict, src=pp.prev_rank))
        out = h.run(model, fb)
        if not pp.is_last:
            if len(in_flight) >= pp.size:  # the ring's slots: a send committed before its slot is reused
                clock.waited(in_flight.pop(0).wait)
            in_flight.append(pp.isend_tensor_dict(out.tensors, dst=pp.next_rank))
    for pending in in_flight:
        clock.waited(pending.wait)


def prefill_rank(rank, world, port, shape, topk, tokens, repeats, mode, chunk, out) -> None:
    """Best of `repeats` prefills of one `tokens`-token prompt (after a 512-token warm-up)."""
    import torch

    cfg, groups, model = _setup(rank, world, port, shape, topk, mode)
    clock = Clock()
    ids = torch.randint(3, cfg.vocab_size, (tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    runs = []
    for i in range(repeats + 1):  # the first, short prefill is a warm-up
        prompt = ids if i else ids[:512]
        step = chunk or len(prompt)
        h = _harness(cfg, groups, model, "dsa", tokens)
        _world_barrier()
        clock.begin()
        _prefill_chunks(h, model, groups, prompt, step if i else min(step, 256), clock)
        rec = clock.record()
        _world_barrier()
        if i:
            runs.append(rec)
        del h
    out.put((rank, min(runs, key=lambda r: r["time"])))


def _median_run(runs: list[dict]) -> dict:
    med = statistics.median_low([r["time"] for r in runs])
    return next(r for r in runs if r["time"] == med)


def _kv_bytes(h, model) -> int:
    pool = h.token_to_kv_pool
    total = 0
    for layer in range(model.start_layer, model.end_layer):
        total += pool.get_key_buffer(layer).nbytes
        if hasattr(pool, "get_index_k_buffer"):
            total += pool.get_index_k_buffer(layer).nbytes
    return total


def _decode_steps(h, model, reqs, steps: int, clock: Clock) -> list[dict]:
    """`steps` timed decode steps of the whole batch (after one untimed), each rolled back."""
    runs = []
    for i in range(steps + 1):
        _world_barrier()
        clock.begin()
        h.forward(model, [(r, [7]) for r in reqs])
        rec = clock.record()
        for r in reqs:  # roll the step back so every step runs at the same context
            r.tokens.pop()
        if i:
            runs.append(rec)
    return runs


def _pp_round(h, model, groups, mbs, clock: Clock, first: bool, in_flight: list) -> None:
    """One decode step of every micro-batch on this stage (stage 0 waits for each micro-batch's
    ids from the last stage before its next step; the last stage sends them back)."""
    import torch

    from sglang.srt.model_executor.forward_batch import PPProxyTensors

    pp = groups.pp
    for mb in mbs:
        if pp.is_first and not first:
            clock.waited(pp.recv_tensor_dict, src=pp.size - 1)
        fb = h.build_batch([(r, [7]) for r in mb])
        if not pp.is_first:
            fb.pp_proxy_tensors = PPProxyTensors(clock.waited(pp.recv_tensor_dict, src=pp.prev_rank))
        out = h.run(model, fb)
        for r in mb:
            r.tokens.pop()
        if len(in_flight) >= pp.size:
            clock.waited(in_flight.pop(0).wait)
        if pp.is_last:
            ids = out.next_token_logits.argmax(dim=-1).to(torch.int64)
            in_flight.append(pp.isend_tensor_dict({"ids": ids}, dst=0))
        else:
            in_flight.append(pp.isend_tensor_dict(out.tensors, dst=pp.next_rank))


def _pp_decode_steps(h, model, groups, reqs, steps: int, clock: Clock) -> list[dict]:
    """`steps` timed rounds (after one untimed) of pp.size micro-batches kept in flight; a round's
    time on a rank runs from its start to the next round's start (the last: until drained)."""
    pp = groups.pp
    per = -(-len(reqs) // pp.size)
    mbs = [reqs[i : i + per] for i in range(0, len(reqs), per)]
    runs, in_flight = [], []
    _world_barrier()
    for i in range(steps + 1):
        if i > 1:
            runs.append(clock.record())
        clock.begin()
        _pp_round(h, model, groups, mbs, clock, i == 0, in_flight)
    if pp.is_first:
        for _ in mbs:
            clock.waited(pp.recv_tensor_dict, src=pp.size - 1)
    for pending in in_flight:
        clock.waited(pending.wait)
    runs.append(clock.record())
    _world_barrier()
    return runs


def decode_rank(rank, world, port, shape, topk, context, batch, steps, mode, out) -> None:
    """Median of `steps` decode steps of `batch` requests at `context` tokens (random KV rows)."""
    cfg, groups, model = _setup(rank, world, port, shape, topk, mode)
    clock = Clock()
    h, reqs = decode_pool(cfg, groups, model, "dsa", context, batch, steps + 1)
    if mode == "pp" and groups.pp.size > 1:
        runs = _pp_decode_steps(h, model, groups, reqs, steps, clock)
    else:
        runs = _decode_steps(h, model, reqs, steps, clock)
    out.put((rank, {**_median_run(runs), "kv_bytes": _kv_bytes(h, model)}))
