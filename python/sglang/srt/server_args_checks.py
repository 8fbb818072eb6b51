"""`ServerArgs.validate()`: the flags checked against each other, each refusal a `ValueError` whose
message names the bad flag.

Only what the flags themselves tell: ranges, combinations, the parallel layout, that the model
path exists. Checks that need the model layer (the registered attention backends, the DSA op
names, the checkpoint's layer count) run once at start-up in `configs/startup_checks.py`.
Knows no ServerArgs: any object with its fields is checked.
"""

from __future__ import annotations

import os
from dataclasses import fields
from typing import Any

from sglang.srt.model_loader.model_files import is_dummy_model
from sglang.srt.server_args_cli import field_choices, flag
from sglang.srt.server_args_compat import model_override_args
from sglang.srt.server_args_hicache import validate_hicache

POSITIVE = (
    "max_total_tokens",
    "max_running_requests",
    "max_queued_requests",
    "context_length",
    "num_threads",
)
AT_LEAST_ONE = ("tp_size", "pp_size", "dp_size", "cp_size", "ep_size", "nnodes", "stream_interval")


def validate_server_args(args: Any) -> None:
    """Every flag check that needs neither the checkpoint nor the model layer (ValueError)."""
    _validate_values(args)
    _validate_dp_attention(args)
    if args.enable_shard_linear and args.cp_size == 1:
        raise ValueError(
            "--enable-shard-linear shares weights across context-parallel ranks: needs --cp-size > 1"
        )
    _validate_layout(args)
    _validate_compat(args)
    validate_hicache(args)
    if not is_dummy_model(args.model_path, args.load_format):
        if not os.path.exists(args.model_path):
            raise ValueError(f"--model-path {args.model_path!r} does not exist")
    if args.pp_size > 1:
        _validate_pipeline(args)
    if args.cp_size > 1 or args.cp_kv_cache_interleave_size != 1:
        _validate_context_parallel(args)
    if args.disaggregation_mode != "null":
        _validate_disaggregation(args)


def _validate_values(args: Any) -> None:
    """Declared choices and the range of each numeric flag."""
    for f in fields(args):
        choices = field_choices(f)
        value = getattr(args, f.name)
        if choices is not None and value is not None and value not in choices:
            raise ValueError(f"--{flag(f.name)} must be one of {choices}, got {value!r}")
    if args.enable_fp32_lm_head and args.disable_fp32_lm_head:
        raise ValueError("--enable-fp32-lm-head and --disable-fp32-lm-head contradict each other; pass one")
    if args.enable_fp32_residual and args.disable_fp32_residual:
        raise ValueError("--enable-fp32-residual and --disable-fp32-residual contradict each other; pass one")
    if args.device == "cpu" and args.dtype == "float16":
        raise ValueError("--dtype float16 is not supported on CPU (use bfloat16 or float32)")
    if args.grammar_backend == "llguidance":
        raise ValueError(
            "--grammar-backend llguidance is not built into this engine: use xgrammar (the default) or none"
        )
    if args.enable_jump_forward and (args.grammar_backend == "none" or args.skip_tokenizer_init):
        raise ValueError(
            "--enable-jump-forward needs a grammar backend and a tokenizer (xgrammar, no --skip-tokenizer-init)"
        )
    if not (0 < args.port < 65536):
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    if args.page_size < 1:
        raise ValueError(f"--page-size must be >= 1, got {args.page_size}")
    if args.max_prefill_tokens < 1:
        raise ValueError(f"--max-prefill-tokens must be >= 1, got {args.max_prefill_tokens}")
    if args.chunked_prefill_size == 0 or args.chunked_prefill_size < -1:
        raise ValueError(
            f"--chunked-prefill-size must be positive or -1 (disabled), got {args.chunked_prefill_size}"
        )
    if args.prefill_pack_tokens is not None and args.prefill_pack_tokens < 0:
        raise ValueError(f"--prefill-pack-tokens must be >= 0, got {args.prefill_pack_tokens}")
    if args.short_prompt_first_tokens is not None and args.short_prompt_first_tokens < 0:
        raise ValueError(f"--short-prompt-first-tokens must be >= 0, got {args.short_prompt_first_tokens}")
    if args.mem_fraction_static is not None and not (0.0 < args.mem_fraction_static < 1.0):
        raise ValueError(f"--mem-fraction-static must be in (0, 1), got {args.mem_fraction_static}")
    if not args.watchdog_timeout > 0:
        raise ValueError(f"--watchdog-timeout must be > 0 seconds, got {args.watchdog_timeout}")
    for name in POSITIVE:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{flag(name)} must be >= 1, got {value}")
    for name in AT_LEAST_ONE:
        if getattr(args, name) < 1:
            raise ValueError(f"--{flag(name)} must be >= 1, got {getattr(args, name)}")
    if not (0 <= args.node_rank < args.nnodes):
        raise ValueError(f"--node-rank must be in [0, --nnodes), got {args.node_rank}")


def _validate_compat(args: Any) -> None:
    """Upstream's launch-line flags (server_args_compat.py)."""
    if args.tokenizer_mode == "slow":
        raise ValueError(
            "--tokenizer-mode slow is not supported by this engine: it needs the fast tokenizer "
            "(tokenizer.json); use --tokenizer-mode auto"
        )
    if not 0 <= args.log_requests_level <= 3:
        raise ValueError(f"--log-requests-level must be in 0..3, got {args.log_requests_level}")
    if args.decode_log_interval is not None and args.decode_log_interval < 1:
        raise ValueError(f"--decode-log-interval must be >= 1, got {args.decode_log_interval}")
    model_override_args(args)
    if args.enable_dsa_prefill_context_parallel and args.cp_size < 2:
        raise ValueError(
            "--enable-dsa-prefill-context-parallel splits prompts over the attention-TP ranks: needs "
            "--tp-size / --dp-size > 1 (or --cp-size)"
        )


def _validate_layout(args: Any) -> None:
    """The ranks divide over the nodes, and several nodes meet at a given address."""
    from sglang.srt.distributed.parallel_layout import ParallelLayout

    layout = ParallelLayout.from_server_args(args)
    if layout.world_size % args.nnodes:
        raise ValueError(
            f"the world size ({layout.world_size} = pp {layout.pp} × tp {layout.tp}) must be divisible by "
            f"--nnodes ({args.nnodes})"
        )
    if args.nnodes > 1 and not args.dist_init_addr:
        raise ValueError("--dist-init-addr HOST:PORT is required when --nnodes > 1")


def _validate_disaggregation(args: Any) -> None:
    """PD disaggregation flags (python/sglang/srt/disaggregation/README.md)."""
    port = args.disaggregation_bootstrap_port
    if not (0 < port < 65536):
        raise ValueError(f"--disaggregation-bootstrap-port must be in 1..65535, got {port}")
    if args.disaggregation_mode == "prefill" and port == args.port:
        raise ValueError("--disaggregation-bootstrap-port must differ from --port")
    if args.num_reserved_decode_tokens < 0 or args.disaggregation_decode_polling_interval < 1:
        raise ValueError(
            "--num-reserved-decode-tokens must be >= 0 and --disaggregation-decode-polling-interval >= 1"
        )
    # decode: attention DP (each replica a decode endpoint, rooms routed by bootstrap_room % dp)
    if args.disaggregation_mode == "prefill" and (args.dp_size > 1 or args.enable_dp_attention):
        raise ValueError(
            "--disaggregation-mode prefill with --dp-size > 1 / --enable-dp-attention is not supported yet "
            "(attention DP works on the decode side; split a prefill prompt with --cp-size instead)"
        )
    if args.disaggregation_mode == "decode" and args.pp_size > 1 and args.dp_size > 1:
        raise ValueError(
            "--disaggregation-mode decode with --pp-size > 1 and --dp-size > 1 together is not supported "
            "yet (each works alone)"
        )


def _validate_dp_attention(args: Any) -> None:
    """Attention DP flags (docs/dp_attention.md, "What composes")."""
    if args.dp_size > 1 and not args.enable_dp_attention:
        raise ValueError(
            "--dp-size > 1 needs --enable-dp-attention (data parallelism of whole engines is not built; "
            "run several servers behind a router instead)"
        )
    if args.moe_dense_tp_size is not None and args.moe_dense_tp_size != 1:
        raise ValueError(f"--moe-dense-tp-size must be 1 or unset, got {args.moe_dense_tp_size}")
    if args.dp_size > 1 and args.nnodes > 1:
        raise ValueError(
            "--dp-size > 1 with --nnodes > 1 is not supported (the replicas' entry ranks "
            "talk to the data-parallel controller over ipc sockets of node 0)"
        )


def _validate_context_parallel(args: Any) -> None:
    """Context-parallel flags (docs/context_parallel.md); the backend's CP support is a start-up check."""
    inter = args.cp_kv_cache_interleave_size
    if inter < 1 or args.page_size % inter:
        raise ValueError(
            f"--cp-kv-cache-interleave-size ({inter}) must be >= 1 and divide --page-size ({args.page_size})"
        )
    if args.enable_shard_linear and args.enable_cp_dense_tp:
        raise ValueError(
            "--enable-shard-linear and --enable-cp-dense-tp both shard o_proj over the cp ranks: use one"
        )
    if args.enable_shard_linear:
        from sglang.srt.distributed.parallel_layout import ParallelLayout

        layout = ParallelLayout.from_server_args(args)
        if layout.attn_tp != 1:
            raise ValueError(
                f"--enable-shard-linear needs attention TP 1 (--tp-size = dp size x --cp-size), got tp "
                f"{layout.tp}, cp {args.cp_size}"
            )


def _validate_pipeline(args: Any) -> None:
    """Pipeline flags (the layer partition against the model is a start-up check)."""
    if args.pp_async_batch_depth < 0:
        raise ValueError(f"--pp-async-batch-depth must be >= 0, got {args.pp_async_batch_depth}")
    if args.pp_max_micro_batch_size is not None and args.pp_max_micro_batch_size < 1:
        raise ValueError(f"--pp-max-micro-batch-size must be >= 1, got {args.pp_max_micro_batch_size}")
