"""Attention backends by name (the values of `--attention-backend`)."""

from __future__ import annotations

import importlib
from typing import Any, Callable

from sglang.srt.layers.attention.base import AttentionBackend

# Built-in backends, imported on first use so that importing the registry stays cheap.
_BUILTIN: dict[str, str] = {
    "torch_native": "sglang.srt.layers.attention.torch_native:TorchNativeAttnBackend",
    "torch_native_mla": "sglang.srt.layers.attention.torch_native_mla:TorchNativeMLABackend",
}
_REGISTERED: dict[str, type[AttentionBackend]] = {}


def register_attention_backend(name: str) -> Callable[[type[AttentionBackend]], type[AttentionBackend]]:
    """Class decorator adding a backend under `name` (re-registering the same class is allowed)."""

    def wrap(cls: type[AttentionBackend]) -> type[AttentionBackend]:
        old = _REGISTERED.get(name)
        if old is not None and old is not cls:
            raise ValueError(f"attention backend {name!r} is already registered to {old.__name__}")
        _REGISTERED[name] = cls
        return cls

    return wrap


def attention_backend_choices() -> list[str]:
    return sorted(set(_BUILTIN) | set(_REGISTERED))


def get_attention_backend_class(name: str) -> type[AttentionBackend]:
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in _BUILTIN:
        module_name, cls_name = _BUILTIN[name].split(":")
        cls = getattr(importlib.import_module(module_name), cls_name)
        _REGISTERED.setdefault(name, cls)
        return cls
    raise ValueError(f"unknown attention backend {name!r}; choices: {attention_backend_choices()}")


def create_attention_backend(name: str, *args: Any, **kwargs: Any) -> AttentionBackend:
    """Instantiate the backend registered under `name` (arguments go to its constructor,
    conventionally the ModelRunner)."""
    return get_attention_backend_class(name)(*args, **kwargs)
