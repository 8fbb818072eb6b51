"""The ServerArgs fields of upstream SGLang's launch lines: request logging, the chat template's
name, defaults of sampling, upstream's DSA context-parallel spellings and the GPU-only knobs
accepted for compatibility (`compat_notes()` says at start-up what each does here).

`ServerArgs` (server_args.py) derives from `CompatArgs`, as from `ParallelArgs`; the fields are
ordinary flags. Also here: `UPSTREAM_FLAGS`, upstream's flags this engine does not take, each
refused by name with what to use instead (`server_args_cli.LaunchArgumentParser`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Optional

from sglang.srt.function_call import tool_call_parser_names
from sglang.srt.reasoning_parser import reasoning_parser_names
from sglang.srt.server_args_cli import G_API, G_COMPAT, G_CP, G_LOGGING, G_MODEL, arg

# upstream's --dsa-prefill-cp-mode values (and the older --nsa-prefill-cp-mode's) -> our --cp-strategy
DSA_CP_MODES = {"in-seq-split": "zigzag", "round-robin-split": "round-robin"}


# Upstream flags this engine does not take: flag -> what to use instead, or which issue builds it.
UPSTREAM_FLAGS = {
    "--constrained-json-whitespace-pattern": "xgrammar takes no whitespace pattern: use "
    "--constrained-json-disable-any-whitespace (JSON without free whitespace)",
    "--speculative-algorithm": "no speculative decoding in this engine",
    "--speculative-draft-model-path": "no speculative decoding in this engine",
    "--speculative-num-steps": "no speculative decoding in this engine",
    "--speculative-eagle-topk": "no speculative decoding in this engine",
    "--speculative-num-draft-tokens": "no speculative decoding in this engine",
    "--lora-paths": "no LoRA adapters in this engine",
    "--max-loras-per-batch": "no LoRA adapters in this engine",
    "--enable-lora": "no LoRA adapters in this engine",
    "--is-embedding": "this engine serves generation only (no embedding models)",
    "--mm-attention-backend": "no multimodal models in this engine",
    "--enable-multimodal": "no multimodal models in this engine",
    "--preferred-sampling-params": "use --sampling-defaults model with the checkpoint's generation_config.json",
    "--file-storage-path": "no file storage here",
    "--enable-deterministic-inference": "greedy decoding (temperature 0) is deterministic here",
    "--sampling-backend": "sampling runs in torch on every device",
    "--schedule-conservativeness": "use --max-running-requests / --max-total-tokens",
    "--cpu-offload-gb": "use --mem-fraction-static / --max-total-tokens",
    "--tokenizer-worker-num": "one tokenizer process serves every request",
    "--enable-eplb": "use --ep-size (no expert load balancer)",
    "--deepep-mode": "use --moe-a2a-backend all_to_all",
    "--enable-two-batch-overlap": "no two-batch overlap in this engine",
    "--enable-nsa-cache-layer-split": "the DSA KV cache is not split by layer here",
    "--enable-dsa-cache-layer-split": "the DSA KV cache is not split by layer here",
    "--moe-runner-backend": "MoE runs on the kernel dispatch table's ops",
    "--disable-chunked-prefix-cache": "use --disable-radix-cache",
    "--enable-memory-saver": "no memory saver here",
    "--crash-dump-folder": "the watchdog logs where a step hangs (--watchdog-timeout)",
    "--show-time-cost": "use --enable-metrics",
    "--bucket-time-to-first-token": "use --enable-metrics (fixed buckets)",
    "--collect-tokens-histogram": "use --enable-metrics",
    "--enable-request-time-stats-logging": "use --log-requests / --enable-metrics",
}


@dataclass(frozen=True)
class CompatArgs:
    """Upstream launch-line flags (see the module docstring)."""

    UPSTREAM_FLAGS: ClassVar[Mapping[str, str]] = UPSTREAM_FLAGS  # read by server_args_cli.build_parser

    # ------------------------------------------------------------------ model and tokenizer
    tokenizer_mode: str = arg(
        "auto",
        "auto: the fast tokenizer (tokenizer.json); upstream's slow (Python) tokenizers are not supported.",
        G_MODEL,
        choices=["auto", "slow"],
    )
    json_model_override_args: str = arg(
        "{}",
        "A JSON object merged into the model's HF config before the model is built, e.g. '{\"rope_theta\": 1e6}'.",
        G_MODEL,
    )
    allow_auto_truncate: bool = arg(
        False,
        "A prompt longer than the context is cut from the left (its last tokens kept) instead of refused.",
        G_MODEL,
    )

    # ------------------------------------------------------------------ logging
    log_requests: bool = arg(
        False, "Log every request when it arrives and when it finishes (see --log-requests-level).", G_LOGGING
    )
    log_requests_level: int = arg(
        2,
        "0: metadata; 1: + sampling params; 2: + prompt and output, each cut to 2048 characters; 3: all.",
        G_LOGGING,
    )
    decode_log_interval: Optional[int] = arg(
        None,
        "Scheduler throughput line every this many decode steps.",
        G_LOGGING,
        default_text="every 10 seconds in which a step ran",
    )

    # ------------------------------------------------------------------ API
    hf_chat_template_name: Optional[str] = arg(
        None,
        "Which of the tokenizer's named chat templates (a tokenizer_config.json chat_template list) to use.",
        G_API,
        default_text="the one named 'default'",
    )
    tool_call_parser: Optional[str] = arg(
        None,
        "How /v1/chat/completions finds tool calls in the output (the model family's format): "
        "message.tool_calls instead of content.",
        G_API,
        choices=tool_call_parser_names,
        default_text="none: the output stays content",
    )
    reasoning_parser: Optional[str] = arg(
        None,
        "How /v1/chat/completions splits the model's reasoning section (<think>...</think>) into "
        "reasoning_content.",
        G_API,
        choices=reasoning_parser_names,
        default_text="none: the reasoning stays in content",
    )
    sampling_defaults: str = arg(
        "model",
        "Where temperature / top_p / top_k / min_p / repetition_penalty come from when a /v1 request omits them: model (the checkpoint's "
        "generation_config.json, where it has them) or openai (1.0 / 1.0 / -1 / 0.0 / 1.0).",
        G_API,
        choices=["model", "openai"],
    )

    # ------------------------------------------------------------------ upstream's DSA CP spellings
    enable_dsa_prefill_context_parallel: bool = arg(
        False,
        "Upstream's DSA prefill CP: --cp-size becomes tp / dp when not given (attention TP 1).",
        G_CP,
        aliases=["--enable-nsa-prefill-context-parallel", "--enable-prefill-cp"],
    )
    dsa_prefill_cp_mode: Optional[str] = arg(
        None,
        "Upstream's DSA CP split: in-seq-split (= --cp-strategy zigzag) or round-robin-split (= round-robin).",
        G_CP,
        choices=list(DSA_CP_MODES),
        aliases=["--nsa-prefill-cp-mode"],
        default_text="--cp-strategy",
    )

    # ------------------------------------------------------------------ upstream flags without an effect here
    # Common in copied launch lines; accepted, and `compat_notes()` says at start-up what they do here.
    disable_cuda_graph: bool = arg(
        False, "Accepted for compatibility: this engine captures no CUDA graphs.", G_COMPAT
    )
    disable_overlap_schedule: bool = arg(
        False, "Accepted for compatibility: this scheduler has no overlap mode to turn off.", G_COMPAT
    )
    enable_mixed_chunk: bool = arg(
        False, "Accepted for compatibility: prefill chunks and decodes always share a step here.", G_COMPAT
    )
    skip_server_warmup: bool = arg(
        False, "Accepted for compatibility: this server sends no warm-up request at start-up.", G_COMPAT
    )
    enable_torch_compile: bool = arg(
        False,
        "Accepted for compatibility: no torch.compile here; the CPU path runs its own fused kernels.",
        G_COMPAT,
    )
    torch_compile_max_bs: Optional[int] = arg(
        None,
        "Accepted for compatibility: no torch.compile here, so no batch size bound for it.",
        G_COMPAT,
        default_text="unused",
    )
    cuda_graph_max_bs: Optional[int] = arg(
        None,
        "Accepted for compatibility: this engine captures no CUDA graphs.",
        G_COMPAT,
        default_text="unused",
    )
    cuda_graph_bs: Optional[list[int]] = arg(
        None,
        "Accepted for compatibility: this engine captures no CUDA graphs.",
        G_COMPAT,
        default_text="unused",
    )
    disable_custom_all_reduce: bool = arg(
        False,
        "Accepted for compatibility: all-reduces are torch.distributed's (gloo / the device's backend).",
        G_COMPAT,
    )
    enable_p2p_check: bool = arg(
        False, "Accepted for compatibility: no GPU peer-to-peer access is used or checked.", G_COMPAT
    )
    enable_cache_report: bool = arg(
        False,
        "Accepted for compatibility: cached prompt tokens are always reported (meta_info cached_tokens).",
        G_COMPAT,
    )


def apply_upstream_spellings(args: Any, set_: Callable[[str, Any], None]) -> list[str]:
    """Upstream's DSA CP flags onto ours (`set_` writes a field of the frozen ServerArgs); one
    start-up note per flag mapped."""
    notes = []
    if args.dsa_prefill_cp_mode is not None:
        ours = DSA_CP_MODES[args.dsa_prefill_cp_mode]
        set_("cp_strategy", ours)
        notes.append(f"--dsa-prefill-cp-mode {args.dsa_prefill_cp_mode}: using --cp-strategy {ours}")
    if args.enable_dsa_prefill_context_parallel and args.cp_size == 1:
        dp = args.dp_size if args.enable_dp_attention else 1
        cp = max(args.tp_size // max(dp, 1), 1)
        set_("cp_size", cp)
        notes.append(
            f"--enable-dsa-prefill-context-parallel: every attention-TP rank a CP rank; using --cp-size {cp}"
        )
    return notes


def model_override_args(args: Any) -> dict:
    """`--json-model-override-args` as a dict (ValueError naming the flag when it is not a JSON object)."""
    try:
        value = json.loads(args.json_model_override_args or "{}")
    except json.JSONDecodeError as err:
        raise ValueError(f"--json-model-override-args is not valid JSON: {err}") from None
    if not isinstance(value, dict):
        raise ValueError(f"--json-model-override-args must be a JSON object, got {value!r}")
    return value
