"""Environment variables the engine reads, declared once with their type and default.

Each variable is an `EnvVar`: `.get()` parses the current value (or returns the default) and
raises a `ValueError` naming the variable when the text does not parse. Reading happens when
`.get()` is called, never at import, so tests can set variables with `monkeypatch.setenv`.

    from sglang.srt import envs
    alpha = envs.SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR.get()
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Generic, Mapping, Optional, TypeVar

from sglang.srt.kernels.cpu import isa as cpu_isa  # standard library only: the one ISA vocabulary

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def parse_bool(text: str) -> bool:
    """'1/true/yes/on' → True, '0/false/no/off/' → False (case-insensitive)."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"expected a boolean, got {text!r}")


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    """One typed environment variable."""

    name: str
    default: T
    parse: Callable[[str], T]
    doc: str = ""

    def is_set(self, environ: Optional[Mapping[str, str]] = None) -> bool:
        return self.name in (os.environ if environ is None else environ)

    def get(self, environ: Optional[Mapping[str, str]] = None) -> T:
        env = os.environ if environ is None else environ
        raw = env.get(self.name)
        if raw is None:
            return self.default
        try:
            return self.parse(raw.strip())
        except ValueError as exc:
            raise ValueError(f"environment variable {self.name}={raw!r}: {exc}") from None


# ---------------------------------------------------------------- dynamic chunking
SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR: EnvVar[float] = EnvVar(
    "SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR",
    0.75,
    float,
    "How far a dynamic chunk follows the fitted model: 0 = fixed chunks, 1 = follow the fit.",
)


SGLANG_DYNAMIC_CHUNKING_PROFILE_POINTS: EnvVar[int] = EnvVar(
    "SGLANG_DYNAMIC_CHUNKING_PROFILE_POINTS",
    32,
    int,
    "Start-up profiling prefills per stage (lengths up to 1.25 x --chunked-prefill-size). Upstream "
    "runs 128; 32 keeps CPU start-up short and still gives the fit 31 points after warm-up.",
)


# ---------------------------------------------------------------- kernels
SGLANG_CPU_PREPACK_LINEAR: EnvVar[bool] = EnvVar(
    "SGLANG_CPU_PREPACK_LINEAR",
    True,
    parse_bool,
    "Pack bf16 linear weights once for oneDNN on CPU (layers/linear_prepack.py); 0 disables.",
)


SGLANG_CPU_KV_PREFAULT_GB: EnvVar[float] = EnvVar(
    "SGLANG_CPU_KV_PREFAULT_GB",
    2.0,
    float,
    "On CPU, commit the KV pools' first slots (up to this many GiB per server and node, shared by its ranks) "
    "in a background thread after start-up, so that first writes do not page-fault (mem_cache/kv_warm.py); "
    "0 disables.",
)


SGLANG_CPU_MALLOC_TUNE: EnvVar[bool] = EnvVar(
    "SGLANG_CPU_MALLOC_TUNE",
    True,
    parse_bool,
    "On CPU, keep freed activation memory in the model process (glibc mallopt: mmap threshold "
    "32 MiB, no trimming) instead of re-faulting fresh pages every forward; 0 disables.",
)


SGLANG_CPU_KERNELS: EnvVar[bool] = EnvVar(
    "SGLANG_CPU_KERNELS",
    True,
    parse_bool,
    "Use the fused C++ CPU kernels (kernels/cpu: decode attention over the KV pool in place, "
    "RMSNorm, SwiGLU, RoPE), compiled at install time (setup.py); 0 keeps the torch implementations.",
)


SGLANG_CPU_ISA: EnvVar[str] = EnvVar(
    "SGLANG_CPU_ISA",
    "auto",
    cpu_isa.parse,
    "The instruction set both CPU kernel homes run (kernels/cpu/isa.py): auto (the best this CPU runs), "
    "avx512bf16, avx512vnni, avx512, avx2vnni, avx2 or portable (alias: generic); sglang's fused "
    "kernels load the build it runs, sgl-kernel-npu's DSA kernels that ISA's code. E.g. avx2 runs an "
    "AVX2 machine's code on an AVX-512 one; one the CPU cannot run is refused.",
)

SGLANG_CPU_FLAGS_OVERRIDE: EnvVar[str] = EnvVar(
    "SGLANG_CPU_FLAGS_OVERRIDE",
    "",
    str.strip,
    "Pretend the CPU has these flags when choosing `--dtype auto` (platforms/cpu.py): a CPU kind "
    "(amx, avx512-bf16, avx512, avx2, generic) or a comma-separated flag list; empty = /proc/cpuinfo.",
)


def _index_score_dtype(text: str) -> str:
    choices = ("auto", "float32", "bfloat16", "int8")
    value = text or "auto"
    if value not in choices:
        raise ValueError(f"choices: {choices}")
    return value


SGLANG_DSA_INDEX_SCORE_DTYPE: EnvVar[str] = EnvVar(
    "SGLANG_DSA_INDEX_SCORE_DTYPE",
    "auto",
    _index_score_dtype,
    "The Lightning Indexer's scoring precision on the `dsa` backend: auto (the index-key cache's dtype), "
    "float32, bfloat16 (bf16 inputs, float32 sums) or int8 (per-row int8, exact integer dots; the pool "
    "keeps int8 index keys). layers/attention/dsa/backend_names.py.",
)


# ---------------------------------------------------------------- context parallelism
def _optional_count(text: str) -> Optional[int]:
    if text == "":
        return None
    value = int(text)
    if value < 0:
        raise ValueError(f"expected a count >= 0, got {text!r}")
    return value


SGLANG_CP_MIN_SPLIT_TOKENS: EnvVar[Optional[int]] = EnvVar(
    "SGLANG_CP_MIN_SPLIT_TOKENS",
    None,
    _optional_count,
    "The default of --cp-min-split-tokens when the flag is not given (unset: the platform's). The "
    "test suite sets 0 so that its short prompts take the split path they are written to test.",
)


# ---------------------------------------------------------------- HiCache (upstream's names)
SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR: EnvVar[str] = EnvVar(
    "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR",
    "",
    str,
    "Directory of the HiCache `file` storage backend when --hicache-storage-backend-extra-config names "
    "no file_path (empty: /tmp/hicache).",
)


# ---------------------------------------------------------------- pipeline parallelism
def parse_int_list(text: str) -> list[int]:
    """'15,15,15,16' → [15, 15, 15, 16] (spaces allowed); ValueError on anything else."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise ValueError(f"expected comma-separated integers, got {text!r}")
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None


SGLANG_PP_LAYER_PARTITION: EnvVar[Optional[list[int]]] = EnvVar(
    "SGLANG_PP_LAYER_PARTITION",
    None,
    parse_int_list,
    "Decoder layers of each pipeline stage, e.g. '15,15,15,16': one entry per stage (--pp-size), "
    "summing to the model's layer count. Unset: even split, the remainder on the last stages.",
)


# ---------------------------------------------------------------- health
SGLANG_HEALTH_CHECK_TIMEOUT: EnvVar[float] = EnvVar(
    "SGLANG_HEALTH_CHECK_TIMEOUT",
    20.0,
    float,
    "Seconds /health_generate waits for its one-token generation (or other signs of progress) "
    "before it judges the scheduler (upstream's variable and default).",
)


# ---------------------------------------------------------------- HTTP
def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError(f"expected seconds >= 0, got {text!r}")
    return value


SGLANG_TIMEOUT_KEEP_ALIVE: EnvVar[float] = EnvVar(
    "SGLANG_TIMEOUT_KEEP_ALIVE",
    120.0,
    _non_negative,
    "Seconds the HTTP server keeps an idle keep-alive connection open. Longer than the idle expiry "
    "of common clients' pools (httpx / openai 5 s, aiohttp 15 s, reqwest and so sglang-router 90 s), "
    "so a client never sends on a connection the server is closing at that moment (uvicorn's 5 s "
    "default equals httpx's and races it under load).",
)

# ---------------------------------------------------------------- profiling
SGLANG_TORCH_PROFILER_DIR: EnvVar[str] = EnvVar(
    "SGLANG_TORCH_PROFILER_DIR",
    "/tmp",
    str,
    "Folder of the torch.profiler traces /start_profile writes when its body names no output_dir "
    "(upstream's variable and default).",
)

# ---------------------------------------------------------------- PD disaggregation (upstream names and defaults)
SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT: EnvVar[float] = EnvVar(
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT",
    300.0,
    float,
    "Seconds a PD request may stay Bootstrapping (prefill: waiting for the decode side's KV "
    "addresses; decode: looking up the prefill ranks) before it fails.",
)

SGLANG_DISAGGREGATION_WAITING_TIMEOUT: EnvVar[float] = EnvVar(
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT",
    300.0,
    float,
    "Seconds a PD request may wait for its KV (decode) or for the decode side's acknowledgement "
    "(prefill) once bootstrapped, before it fails and its KV is freed.",
)

SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL: EnvVar[float] = EnvVar(
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL",
    5.0,
    float,
    "Seconds between the decode side's health checks of each prefill bootstrap server it uses.",
)

SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE: EnvVar[int] = EnvVar(
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE",
    2,
    int,
    "Failed health checks in a row after which a prefill server counts as dead (its requests fail).",
)

SGLANG_DISAGGREGATION_THREAD_POOL_SIZE: EnvVar[int] = EnvVar(
    "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE",
    2,
    int,
    "KV transfer worker threads per prefill rank (upstream sizes it from the CPU count).",
)

SGLANG_DISAGGREGATION_QUEUE_SIZE: EnvVar[int] = EnvVar(
    "SGLANG_DISAGGREGATION_QUEUE_SIZE",
    4,
    int,
    "Transfer queues per prefill rank (a room always uses the same queue, so its chunks go in order).",
)
