"""Attention backends by name (the values of `--attention-backend`), and the start-up checks.

The names are known without importing any backend (`attention_backend_choices`), so
`ServerArgs.validate` can reject a bad flag before anything heavy loads; a backend's module is
imported when its class is first asked for. `--attention-backend` left unset means the device
platform's choice (`Platform.default_attention_backend`: `cpu` on CPU, `torch_native` elsewhere).

Built-in backends:
- `torch_native`: the reference (oracle). SDPA over KV gathered from the pool under explicit
  masks; MHA, MLA (dense and DSA sparse) and context parallelism for both.
- `cpu`: the fast CPU backend (fused C++ / AMX kernels, zero-copy views of the pool, LSE-split
  prefix/chunk attention); the torch-native reference for everything else.
- `dsa` (alias `nsa`): `cpu` plus DeepSeek Sparse Attention (V3.2) on sgl_kernel_npu's fused ops
  (`--nsa-prefill-backend` / `--nsa-decode-backend` pick their implementation).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from sglang.srt.layers.attention.base import AttentionBackend

# Built-in backends, imported on first use so that importing the registry stays cheap.
_BUILTIN: dict[str, str] = {
    "torch_native": "sglang.srt.layers.attention.torch_native:TorchNativeAttnBackend",
    "cpu": "sglang.srt.layers.attention.cpu_backend:CPUAttnBackend",
    # DeepSeek-V3.2 sparse attention on sgl_kernel_npu's ops (fused CPU / Triton / torch_npu)
    "dsa": "sglang.srt.layers.attention.dsa_backend:DSAAttnBackend",
}
# Other spellings: upstream SGLang's CPU backend name, and the former MLA-only reference.
ALIASES: dict[str, str] = {
    "intel_amx": "cpu",
    "torch_native_mla": "torch_native",
    "nsa": "dsa",  # upstream's name of its DSA backend
}
_REGISTERED: dict[str, type["AttentionBackend"]] = {}


def register_attention_backend(name: str) -> Callable[[type["AttentionBackend"]], type["AttentionBackend"]]:
    """Class decorator adding a backend under `name` (re-registering the same class is allowed)."""

    def wrap(cls: type["AttentionBackend"]) -> type["AttentionBackend"]:
        old = _REGISTERED.get(name)
        if old is not None and old is not cls:
            raise ValueError(f"attention backend {name!r} is already registered to {old.__name__}")
        _REGISTERED[name] = cls
        return cls

    return wrap


def attention_backend_choices() -> list[str]:
    """Every accepted `--attention-backend` value (aliases included); imports no backend."""
    return sorted(set(_BUILTIN) | set(ALIASES) | set(_REGISTERED))


def canonical_attention_backend(name: str) -> str:
    """The name behind an alias (`intel_amx` -> `cpu`); other names unchanged."""
    return ALIASES.get(name, name)


def default_attention_backend(device: str = "cpu") -> str:
    """The backend a device platform serves with when `--attention-backend` is not given."""
    from sglang.srt.platforms import get_platform

    return get_platform(device).default_attention_backend


def get_attention_backend_class(name: str) -> type["AttentionBackend"]:
    key = canonical_attention_backend(name)
    if key in _REGISTERED:
        return _REGISTERED[key]
    if key in _BUILTIN:
        module_name, cls_name = _BUILTIN[key].split(":")
        cls = getattr(importlib.import_module(module_name), cls_name)
        _REGISTERED.setdefault(key, cls)
        return cls
    raise ValueError(f"unknown attention backend {name!r}; choices: {attention_backend_choices()}")


def create_attention_backend(name: str, *args: Any, **kwargs: Any) -> "AttentionBackend":
    """Instantiate the backend registered under `name` (arguments go to its constructor,
    conventionally the ModelRunner)."""
    return get_attention_backend_class(name)(*args, **kwargs)


def check_attention_backend(name: str, attention_kind: str, model_name: str) -> None:
    """Start-up check that backend `name` serves a model whose layers need `attention_kind`
    ("mha": `RadixAttention`, "mla": `MLACore`); a ValueError naming the flag otherwise."""
    cls = get_attention_backend_class(name)
    supported = {"mha": cls.supports_mha, "mla": cls.supports_mla}
    if attention_kind not in supported:
        raise ValueError(f"{model_name} declares an unknown attention_kind {attention_kind!r}")
    if not supported[attention_kind]:
        able = [n for n in attention_backend_choices() if _supports(n, attention_kind)]
        raise ValueError(
            f"--attention-backend {name} does not support {attention_kind.upper()} attention, which "
            f"{model_name} needs; backends that do: {able}"
        )


def _supports(name: str, attention_kind: str) -> bool:
    cls = get_attention_backend_class(name)
    return cls.supports_mla if attention_kind == "mla" else cls.supports_mha


def check_kv_cache_dtype(name: str, kv_cache_dtype: str) -> None:
    """Start-up check that backend `name` reads the KV pool `--kv-cache-dtype` stores (the FP8
    ones need `supports_fp8_kv`); a ValueError naming both flags otherwise."""
    if not kv_cache_dtype.startswith("fp8") or get_attention_backend_class(name).supports_fp8_kv:
        return
    able = [n for n in attention_backend_choices() if get_attention_backend_class(n).supports_fp8_kv]
    raise ValueError(
        f"--kv-cache-dtype {kv_cache_dtype} is not supported with --attention-backend {name}; "
        f"backends that read an FP8 KV cache: {able}"
    )
