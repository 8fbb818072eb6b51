"""Run a function on N spawned CPU ranks joined by gloo; collect each rank's return value.

    def body(rank: int, world_size: int, x: int) -> dict: ...       # module-level (picklable)
    results = run_ranks(body, 4, args=(x,))                          # [result of rank 0, 1, 2, 3]

Every rank sets torch to one thread, calls `init_distributed` on a free 127.0.0.1 port, runs
`body(rank, world_size, *args)` and sends its (pickled) result back. A rank's exception fails the
call with that rank's traceback; ranks still running are killed (by their process handle). A run
longer than `timeout` fails too, so a collective mismatch shows up as an error, not a hung suite.
Each rank runs with the caller's environment as it is at the call (the forkserver that forks the
ranks keeps the environment of the moment it started, e.g. a monkeypatched variable of an earlier
test, so the worker installs the caller's own).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import time
import traceback
from typing import Any, Callable, Sequence

from sglang.srt.distributed.init import destroy_distributed, get_free_port, init_distributed


def _worker(
    fn: Callable,
    rank: int,
    world_size: int,
    port: int,
    args: Sequence[Any],
    out: Any,
    backend: str,
    env: dict,
) -> None:
    os.environ.clear()
    os.environ.update(env)
    import torch

    torch.set_num_threads(1)
    try:
        init_distributed(world_size, rank, f"127.0.0.1:{port}", backend, timeout_s=60)
        result = fn(rank, world_size, *args)
        out.put((rank, True, pickle.dumps(result)))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        out.put((rank, False, traceback.format_exc()))
    finally:
        destroy_distributed()


def run_ranks(
    fn: Callable, world_size: int, args: Sequence[Any] = (), timeout: float = 90.0, backend: str = "gloo"
) -> list[Any]:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "sglang.srt.distributed.parallel_state"])
    out = ctx.Queue()
    port = get_free_port()
    procs = [
        ctx.Process(
            target=_worker,
            args=(fn, r, world_size, port, tuple(args), out, backend, dict(os.environ)),
            daemon=True,
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world_size:
            try:
                rank, ok, payload = out.get(timeout=0.2)
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if r not in results and p.exitcode is not None]
                try:  # a rank that just exited may have posted its result a moment ago
                    rank, ok, payload = out.get(timeout=2.0 if dead else 0.0)
                except queue_mod.Empty:
                    if dead:
                        codes = [procs[r].exitcode for r in dead]
                        raise RuntimeError(
                            f"rank(s) {dead} exited (codes {codes}) without a result"
                        ) from None
                    if time.monotonic() > deadline:
                        missing = sorted(set(range(world_size)) - set(results))
                        raise TimeoutError(
                            f"rank(s) {missing} of {world_size} did not finish within {timeout:.0f}s"
                        ) from None
                    continue
            if not ok:
                raise AssertionError(f"rank {rank} of {world_size} failed:\n{payload}")
            results[rank] = pickle.loads(payload)
        for p in procs:
            p.join(timeout=10)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return [results[r] for r in range(world_size)]
