"""How many KV tokens and running requests one rank can hold.

`--max-total-tokens` wins when given. Otherwise the pool gets `--mem-fraction-static` of the
memory available now (CPU: MemAvailable; accelerators: free device memory via the platform) minus
the weights; without that flag on CPU the pool is sized for a few full-length requests so that a
server on a shared host does not claim most of its RAM.
"""

from __future__ import annotations

from dataclasses import dataclass

CPU_DEFAULT_CONTEXTS = 4  # default pool on CPU: this many full contexts ...
CPU_DEFAULT_MAX_FRACTION = 0.25  # ... but never more than this share of available RAM
DEFAULT_MAX_RUNNING = 128


@dataclass(frozen=True)
class KVPoolPlan:
    max_total_tokens: int
    max_running_requests: int
    cell_bytes: int


def available_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30


def plan_kv_pool(server_args, model_config, weight_bytes: int, cell: int) -> KVPoolPlan:
    """`cell`: KV bytes one token takes on this rank (its stage's layers, its KV-head shard, or
    the model's own layout such as the MLA latent)."""
    page = server_args.page_size
    if server_args.max_total_tokens is not None:
        tokens = server_args.max_total_tokens
    else:
        avail = available_memory_bytes()
        if server_args.mem_fraction_static is not None:
            budget = server_args.mem_fraction_static * avail - weight_bytes
        else:
            budget = min(CPU_DEFAULT_CONTEXTS * model_config.context_len * cell, CPU_DEFAULT_MAX_FRACTION * avail)
        tokens = int(budget // cell)
    tokens = tokens // page * page
    if tokens < 2 * page:
        raise ValueError(
            f"KV pool too small ({tokens} tokens): raise --max-total-tokens or --mem-fraction-static"
        )
    running = server_args.max_running_requests or min(DEFAULT_MAX_RUNNING, max(1, tokens // 2))
    return KVPoolPlan(max_total_tokens=tokens, max_running_requests=running, cell_bytes=cell)
