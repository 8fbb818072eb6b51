"""The ServerArgs fields of parallelism across ranks and servers: context, data and expert
parallelism, multi-node, the attention kernels, PD disaggregation.

`ServerArgs` (server_args.py) derives from `ParallelArgs`, so these are ordinary ServerArgs fields
and flags; they live here only to keep each file one screenful of groups. The flags' `--help` order
follows `GROUP_ORDER`, not the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sglang.srt.server_args_cli import G_CP, G_DP, G_KERNELS, G_MOE, G_MULTI_NODE, G_PD, arg


@dataclass(frozen=True)
class ParallelArgs:
    """Flags of parallelism across ranks and servers (see the module docstring)."""

    # ------------------------------------------------------------------ context parallelism
    cp_strategy: str = arg(
        "zigzag",
        "How a prompt's tokens are split over CP ranks: zigzag (2·cp segments, balanced causal work) or "
        "round-robin (token i on rank i mod cp; upstream's 'interleave' is accepted for it).",
        G_CP,
        choices=["zigzag", "round-robin", "interleave"],
    )
    cp_kv_cache_interleave_size: int = arg(
        1, "Consecutive tokens stored on one CP rank's KV cache before the next rank's.", G_CP
    )
    cp_kv_gather_segment: Optional[int] = arg(
        None,
        "Most cached-prefix KV rows a CP rank gathers per round over a long prefix (rounds merged by LSE; "
        "0 = the whole prefix at once).",
        G_CP,
        default_text="16384 for MHA models; 0 for MLA / DSA, whose per-round partials (and DSA's running "
        "top-k) cost more memory and time than the rows they save (docs/context_parallel.md)",
    )
    cp_min_split_tokens: Optional[int] = arg(
        None,
        "Prompts (or chunks) with no cached prefix and fewer new tokens run whole on every CP rank, "
        "without exchanges; 0 = always split (docs/context_parallel.md).",
        G_CP,
        default_text="$SGLANG_CP_MIN_SPLIT_TOKENS, else the platform's measured crossover",
    )
    enable_cp_dense_tp: bool = arg(
        False,
        "Shard the embedding and LM head (vocab) and o_proj (heads) over the CP group, rows moved instead "
        "(needs --tp-size == --cp-size): 1/cp of their weight bytes per rank (docs/context_parallel.md).",
        G_CP,
    )

    # ------------------------------------------------------------------ data parallelism
    dp_size: int = arg(
        1,
        "Data parallel size (attention data parallelism with --enable-dp-attention).",
        G_DP,
        aliases=["--data-parallel-size"],
    )
    load_balance_method: str = arg(
        "auto",
        "How the DP controller picks a replica: round_robin, follow_bootstrap_room (bootstrap_room % dp), "
        "total_requests, total_tokens (fewest KV + waiting tokens); auto: PD follow_bootstrap_room, else round_robin.",
        G_DP,
        choices=["auto", "round_robin", "follow_bootstrap_room", "total_requests", "total_tokens"],
    )

    # ------------------------------------------------------------------ multi-node
    nnodes: int = arg(1, "Number of nodes.", G_MULTI_NODE)
    node_rank: int = arg(
        0, "This node's rank (0 serves HTTP; the others run their ranks only).", G_MULTI_NODE
    )
    dist_init_addr: Optional[str] = arg(
        None,
        "HOST:PORT of the torch.distributed rendezvous (required with --nnodes > 1).",
        G_MULTI_NODE,
        aliases=["--nccl-init-addr"],
        default_text="a free local port on one node",
    )

    # ------------------------------------------------------------------ kernels
    # its accepted names are the attention registry's: given to argparse and checked at start-up
    # by the entry points (configs/startup_checks.py)
    attention_backend: Optional[str] = arg(
        None,
        "Attention kernels.",
        G_KERNELS,
        default_text="the device platform's choice: cpu on CPU, torch_native elsewhere",
    )

    nsa_prefill_backend: Optional[str] = arg(
        None,
        "DSA ops of the dsa/nsa attention backend for extend batches: auto, reference, cpu, triton, torch_npu, "
        "or upstream's names (flashmla_sparse, fa3, tilelang, ... -> triton; ascend -> torch_npu).",
        G_KERNELS,
        aliases=["--dsa-prefill-backend"],
        default_text="auto: the platform's",
    )
    nsa_decode_backend: Optional[str] = arg(
        None,
        "Like --nsa-prefill-backend, for decode batches.",
        G_KERNELS,
        aliases=["--dsa-decode-backend"],
        default_text="auto: the platform's",
    )

    # ------------------------------------------------------------------ MoE
    ep_size: int = arg(1, "Expert parallel size.", G_MOE, aliases=["--expert-parallel-size"])
    moe_dense_tp_size: Optional[int] = arg(
        None,
        "TP size of dense MLPs under attention DP; 1 replicates them on every rank (only 1 is supported).",
        G_MOE,
        default_text="the tp size",
    )
    moe_a2a_backend: str = arg(
        "none",
        "MoE token dispatch: none (the tp group runs the MoE on the same tokens) or all_to_all (tokens go to "
        "their experts' ranks and back; needs --ep-size == --tp-size).",
        G_MOE,
        choices=["none", "all_to_all"],
    )

    # ------------------------------------------------------------------ PD disaggregation
    # (upstream names and defaults; python/sglang/srt/disaggregation/README.md). Timeouts are the
    # SGLANG_DISAGGREGATION_* environment variables (srt/envs.py).
    disaggregation_mode: str = arg(
        "null",
        "This server's side of a prefill/decode pair: null (colocated), prefill or decode.",
        G_PD,
        choices=["null", "prefill", "decode"],
    )
    disaggregation_transfer_backend: str = arg(
        "mooncake",
        "How KV moves between the sides: mooncake (Mooncake transfer engine; TCP, or RDMA with "
        "--disaggregation-ib-device) or fake (no data moves: warm-up and tests).",
        G_PD,
        choices=["mooncake", "fake"],
    )
    disaggregation_bootstrap_port: int = arg(
        8998,
        "Prefill side: port of the bootstrap server where the decode side looks up the prefill ranks.",
        G_PD,
    )
    disaggregation_ib_device: Optional[str] = arg(
        None, "RDMA device(s) for Mooncake, e.g. mlx5_0.", G_PD, default_text="TCP"
    )
    num_reserved_decode_tokens: int = arg(
        512, "Decode side: KV tokens kept free per running request for its growth.", G_PD
    )
    disaggregation_decode_polling_interval: int = arg(
        1, "Decode side: poll the transfers every this many scheduler steps.", G_PD
    )
