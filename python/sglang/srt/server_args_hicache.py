"""The ServerArgs fields of HiCache, the hierarchical KV cache (docs/hicache.md): an L2 host tier
and an L3 storage tier behind the radix cache. Upstream's flag names.

`ServerArgs` (server_args.py) derives from `HiCacheArgs`, as from `ParallelArgs`; the fields are
ordinary flags. `validate_hicache` refuses the combinations not built yet, each by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sglang.srt.server_args_cli import G_MEMORY, G_PD, arg

WRITE_POLICIES = ["write_through", "write_through_selective", "write_back"]
STORAGE_BACKENDS = ["none", "file", "mooncake"]
PREFETCH_POLICIES = ["best_effort", "wait_complete", "timeout"]
# upstream's values; the ones not built here are refused by name with the reason (validate_hicache)
IO_BACKENDS = ["kernel", "direct", "kernel_ascend"]
MEM_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_first_kv_split", "page_head"]
NOT_BUILT = {
    "--hicache-io-backend kernel_ascend": "Ascend NPU copy kernels (this build's tiers copy with torch; "
    "use kernel or direct)",
    "--hicache-mem-layout page_first": "the host tier is layer-first here (one buffer per layer, rows per "
    "token); page-first layouts serve zero-copy GPU/NPU kernels: use layer_first",
}
for _layout in MEM_LAYOUTS[2:]:
    NOT_BUILT[f"--hicache-mem-layout {_layout}"] = NOT_BUILT["--hicache-mem-layout page_first"]


@dataclass(frozen=True)
class HiCacheArgs:
    """HiCache flags (see the module docstring)."""

    enable_hierarchical_cache: bool = arg(
        False,
        "HiCache: what the radix cache evicts from the KV pool moves to a host tier (and a storage backend) "
        "and is loaded back on a prefix hit instead of recomputed (docs/hicache.md).",
        G_MEMORY,
    )
    hicache_ratio: float = arg(2.0, "Host tier size as a multiple of the KV pool (tokens).", G_MEMORY)
    hicache_size: float = arg(0.0, "Host tier size in GB per rank (0: use --hicache-ratio).", G_MEMORY)
    hicache_write_policy: str = arg(
        "write_through",
        "When KV is copied to the host tier: on insert (write_through), on its second hit "
        "(write_through_selective) or when evicted from the KV pool (write_back).",
        G_MEMORY,
        choices=WRITE_POLICIES,
    )
    hicache_io_backend: str = arg(
        "kernel",
        "How KV moves between the KV pool and the host tier: kernel or direct (on CPU both are the same "
        "synchronous torch copy); kernel_ascend is refused (docs/hicache.md).",
        G_MEMORY,
        choices=IO_BACKENDS,
    )
    hicache_mem_layout: str = arg(
        "layer_first",
        "Host tier memory layout: layer_first (one buffer per layer); upstream's page_first, "
        "page_first_direct, page_first_kv_split and page_head are refused (docs/hicache.md).",
        G_MEMORY,
        choices=MEM_LAYOUTS,
    )
    hicache_storage_backend: str = arg(
        "none",
        "L3 storage tier: none, file (a directory: SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR or the extra "
        "config's file_path) or mooncake (a Mooncake store: the extra config's master_server_address).",
        G_MEMORY,
        choices=STORAGE_BACKENDS,
    )
    hicache_storage_prefetch_policy: str = arg(
        "timeout",
        "How long a waiting request waits for its L3 prefix to be prefetched: best_effort (not at all), "
        "wait_complete (until read) or timeout (bounded; extra config keys). docs/hicache.md.",
        G_MEMORY,
        choices=PREFETCH_POLICIES,
    )
    hicache_storage_backend_extra_config: str = arg(
        "",
        'JSON object for the storage backend, e.g. {"file_path": "/data/hicache"} or '
        '{"master_server_address": "10.0.0.1:50051"} (docs/hicache.md).',
        G_MEMORY,
    )
    disaggregation_decode_enable_offload_kvcache: bool = arg(
        False,
        "PD decode server: write each finished request's KV (prompt + output, whole storage pages) to "
        "--hicache-storage-backend, where a prefill server of the same model and layout finds it.",
        G_PD,
    )


def validate_hicache(args: Any) -> None:
    """HiCache flag values and the combinations not built yet (ValueError, by name)."""
    if args.hicache_ratio <= 1.0 and args.hicache_size == 0:
        raise ValueError(f"--hicache-ratio must be > 1 (the host tier is larger), got {args.hicache_ratio}")
    if args.hicache_size < 0:
        raise ValueError(f"--hicache-size must be >= 0 GB, got {args.hicache_size}")
    if args.hicache_storage_backend_extra_config:
        try:
            extra = json.loads(args.hicache_storage_backend_extra_config)
        except json.JSONDecodeError as e:
            raise ValueError(f"--hicache-storage-backend-extra-config is not valid JSON: {e}") from None
        if not isinstance(extra, dict):
            raise ValueError("--hicache-storage-backend-extra-config must be a JSON object")
        page_tokens = extra.get("page_tokens", 64)
        if not isinstance(page_tokens, int) or page_tokens < 1:
            raise ValueError(
                f"--hicache-storage-backend-extra-config page_tokens must be an int >= 1, got {page_tokens!r}"
            )
        from sglang.srt.mem_cache.hicache.prefetch import PrefetchConfig

        PrefetchConfig.from_extra(args.hicache_storage_prefetch_policy, extra)  # ValueError by key
        if args.hicache_storage_backend == "file":
            from sglang.srt.mem_cache.hicache.file_storage import FileLimits

            FileLimits.from_extra(extra)  # ValueError by key
    for name in (
        f"--hicache-io-backend {args.hicache_io_backend}",
        f"--hicache-mem-layout {args.hicache_mem_layout}",
    ):
        if name in NOT_BUILT:
            raise ValueError(f"{name} is not supported: {NOT_BUILT[name]} (docs/hicache.md)")
    _validate_decode_offload(args)
    if not args.enable_hierarchical_cache:
        if args.hicache_storage_backend != "none" and not args.disaggregation_decode_enable_offload_kvcache:
            raise ValueError("--hicache-storage-backend needs --enable-hierarchical-cache")
        _check_mooncake(args)
        return
    _check_mooncake(args)
    unsupported = {
        "--disable-radix-cache": args.disable_radix_cache,
        # stages hold different layers, so a size in GB gives each stage another token count
        "--pp-size > 1 and --hicache-size (use --hicache-ratio)": args.pp_size > 1 and args.hicache_size > 0,
    }
    for name, on in unsupported.items():
        if on:
            raise ValueError(
                f"--enable-hierarchical-cache with {name} is not supported yet (docs/hicache.md)"
            )
    if args.disaggregation_mode == "decode":
        raise ValueError(
            "--enable-hierarchical-cache is refused with --disaggregation-mode decode: a decode server "
            "never matches prefixes (every prompt's KV comes from the prefill server), so its tiers "
            "would hold KV nothing reads. Give the prefill server --enable-hierarchical-cache, and the "
            "decode server --disaggregation-decode-enable-offload-kvcache with the same "
            "--hicache-storage-backend (docs/hicache.md)"
        )


def _check_mooncake(args: Any) -> None:
    if args.hicache_storage_backend == "mooncake":
        from sglang.srt.mem_cache.hicache.mooncake_config import mooncake_config
        from sglang.srt.mem_cache.hicache.mooncake_storage import store_class

        mooncake_config(json.loads(args.hicache_storage_backend_extra_config or "{}"))  # ValueError by key
        store_class()  # RuntimeError naming the install command where mooncake is missing


def _validate_decode_offload(args: Any) -> None:
    """--disaggregation-decode-enable-offload-kvcache: a decode server's L3 writes (upstream: needs
    decode mode and a storage backend)."""
    if not args.disaggregation_decode_enable_offload_kvcache:
        return
    flag = "--disaggregation-decode-enable-offload-kvcache"
    if args.disaggregation_mode != "decode":
        raise ValueError(f"{flag} needs --disaggregation-mode decode, got {args.disaggregation_mode}")
    if args.hicache_storage_backend == "none":
        raise ValueError(
            f"{flag} needs --hicache-storage-backend file|mooncake (the L3 store the prefill server reads)"
        )
    refused = {
        "--disable-radix-cache": args.disable_radix_cache,  # pages are written when KV enters the tree
        "--pp-size > 1": args.pp_size > 1,  # each stage holds its layers; stage 0 alone sees requests
    }
    for name, on in refused.items():
        if on:
            raise ValueError(f"{flag} with {name} is not supported yet (docs/hicache.md)")
