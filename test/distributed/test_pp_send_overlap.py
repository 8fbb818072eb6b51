"""Pipeline parallelism: a micro-batch's sends stay in flight while the next micro-batch computes.

pp 2 (async depth 1: a ring of 3) on spawned gloo ranks (the real PPDriver / PPStageWorker /
PPComm), tiny Llama, float32: four prompts longer than the chunk (12), so stage 0 launches chunk
after chunk. A `SendProbe` on each rank's `PendingRing` records the order of forward starts and
send issues / waits. The test fails if a send is waited on before the next micro-batch's forward
on that rank began (a synchronous send), or was handed to the ring already waited on; and it needs
overlapped sends on both stages.
"""

from __future__ import annotations

import pytest
import torch

from dist_spawn import run_ranks
from sglang.srt.managers.pp.trace import SendProbe
from sglang.test.pp_harness import ScriptedIO, req
from sglang.test.tiny_models import TINY_LLAMA_DIR, write_random_checkpoint

pytestmark = pytest.mark.slow  # spawns gloo ranks and builds engines


def _rank(rank: int, world_size: int, server_kwargs: dict, waves: list) -> dict:
    from sglang.srt.distributed.parallel_state import ParallelGroups, ParallelLayout
    from sglang.srt.managers.pp.rank import build_pp_rank
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(**server_kwargs)
    args.validate()
    groups = ParallelGroups.build(ParallelLayout.from_server_args(args), rank, "gloo")
    io = ScriptedIO(waves) if groups.is_entry_rank else None
    pp = build_pp_rank(args, groups, io=io)
    probe = pp.loop.pending.probe = SendProbe()
    if io is not None:
        io.bind(pp.scheduler)
    pp.run(stop=io.finished if io is not None else None)
    out = {"overlap": probe.send_overlap(), "forwards": sum(1 for k, _ in probe.events if k == "forward")}
    if io is not None:
        out["outputs"] = {rid: r.output_ids for rid, r in io.results().items()}
    return out


def test_pp_send_in_flight_during_next_forward(tmp_path):
    path = str(write_random_checkpoint(TINY_LLAMA_DIR, tmp_path / "llama", seed=7))
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 100, (n,), generator=g).tolist() for n in (45, 38, 52, 29)]
    waves = [[req(f"r{i}", p, 6) for i, p in enumerate(prompts)]]
    kwargs = {"model_path": path, "pp_size": 2, "pp_async_batch_depth": 1, "chunked_prefill_size": 12}
    kwargs.update(dtype="float32", num_threads=1, max_total_tokens=2048, log_level="warning")
    results = run_ranks(_rank, 2, args=(kwargs, waves), timeout=180)
    assert all(len(t) == 6 for t in results[0]["outputs"].values())
    for rank, res in enumerate(results):
        o = res["overlap"]
        assert res["forwards"] >= 8, (rank, res)
        assert o["synchronous"] == 0 and o["waited_at_issue"] == 0, (rank, o)
        assert o["overlapped"] >= res["forwards"] - 2, (rank, o)  # every send but the last ones
