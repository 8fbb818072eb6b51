"""How many KV tokens and running requests one rank can hold.

`--max-total-tokens` wins when given. Otherwise the pool is sized from the memory of the rank's
own device as its platform reports it (`Platform.memory_info()`: the free memory of the current
device by `mem_get_info` on CUDA / NPU, MemAvailable on CPU), read twice: when the rank starts,
before any weight is loaded, and once the weights are in place. With a memory fraction f
(`--mem-fraction-static`, or the platform's default: upstream's on accelerators) the pool gets
what upstream SGLang gives it:

    pool bytes = free_after_load - free_before_load * (1 - f)

so weights and pool together fill f of the memory that was free at start, and (1 - f) of it stays
for activations and the runtime. Ranks that draw on one memory (several CPU ranks on a host) split
the result. CPU has no default f: without the flag the pool holds a few full-length requests, at
most a quarter of the available RAM, so that a server on a shared host does not claim most of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

CPU_DEFAULT_CONTEXTS = 4  # default pool on CPU: this many full contexts ...
CPU_DEFAULT_MAX_FRACTION = 0.25  # ... but never more than this share of available RAM
DEFAULT_MAX_RUNNING = 128
GIB = 2**30


@dataclass(frozen=True)
class KVPoolPlan:
    max_total_tokens: int
    max_running_requests: int
    cell_bytes: int


@dataclass(frozen=True)
class MemoryReading:
    """One rank's memory: free bytes before its weights loaded and after, how many ranks share
    that memory, and the platform's default memory fraction (None: the CPU rule)."""

    free_before_load: int
    free_after_load: int
    sharers: int = 1
    default_fraction: Optional[float] = None

    @staticmethod
    def after_load(platform, free_before_load: int, local_ranks: int, tp_size: int) -> "MemoryReading":
        """Read the platform's memory now (weights loaded). `free_before_load`: its
        `memory_info()[0]` taken when the rank started; `local_ranks`: the ranks on this node."""
        return MemoryReading(
            free_before_load=int(free_before_load),
            free_after_load=int(platform.memory_info()[0]),
            sharers=max(1, local_ranks) if platform.memory_shared_by_local_ranks else 1,
            default_fraction=platform.default_mem_fraction_static(tp_size),
        )


def kv_budget_bytes(memory: MemoryReading, fraction: float) -> int:
    """Upstream's pool size for memory fraction `fraction`, this rank's share of it."""
    rest = memory.free_after_load - memory.free_before_load * (1.0 - fraction)
    return int(rest // memory.sharers)


def plan_kv_pool(server_args, model_config, cell: int, memory: MemoryReading) -> KVPoolPlan:
    """`cell`: KV bytes one token takes on this rank (its stage's layers, its KV-head shard, or
    the model's own layout such as the MLA latent)."""
    page = server_args.page_size
    if server_args.max_total_tokens is not None:
        tokens = server_args.max_total_tokens
    else:
        fraction = server_args.mem_fraction_static
        if fraction is None:
            fraction = memory.default_fraction
        if fraction is not None:
            budget = kv_budget_bytes(memory, fraction)
            if budget < 2 * page * cell:
                raise ValueError(
                    f"no memory left for the KV pool: {memory.free_before_load / GIB:.2f} GiB were free before "
                    f"the weights loaded and {memory.free_after_load / GIB:.2f} GiB after; a memory fraction of "
                    f"{fraction} keeps {(1 - fraction) * memory.free_before_load / GIB:.2f} GiB back, which leaves "
                    f"{budget / GIB:.2f} GiB. Raise --mem-fraction-static or set --max-total-tokens"
                )
        else:
            avail = memory.free_after_load // memory.sharers
            budget = min(
                CPU_DEFAULT_CONTEXTS * model_config.context_len * cell, CPU_DEFAULT_MAX_FRACTION * avail
            )
        tokens = int(budget // cell)
    tokens = tokens // page * page
    if tokens < 2 * page:
        raise ValueError(
            f"KV pool too small ({tokens} tokens): raise --max-total-tokens or --mem-fraction-static"
        )
    running = server_args.max_running_requests or min(DEFAULT_MAX_RUNNING, max(1, tokens // 2))
    return KVPoolPlan(max_total_tokens=tokens, max_running_requests=running, cell_bytes=cell)
