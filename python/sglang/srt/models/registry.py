"""ModelRegistry: HF `architectures` names -> model classes (every one a `CausalLM`)."""

from __future__ import annotations

import importlib
from typing import Iterable, Union

from sglang.srt.models.causal_lm import CausalLM


class ModelRegistry:
    """Resolves a model class from a config's `architectures` list (first supported name wins).

    The table maps architecture name -> class or "module:Class" (imported on first use); a class
    must derive from `CausalLM`. Use it through the class: `ModelRegistry.resolve(hf_config.architectures)`.
    """

    _models: dict[str, Union[str, type[CausalLM]]] = {
        "LlamaForCausalLM": "sglang.srt.models.llama:LlamaForCausalLM",
        "Qwen2ForCausalLM": "sglang.srt.models.llama:Qwen2ForCausalLM",
        "Qwen3ForCausalLM": "sglang.srt.models.llama:Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM": "sglang.srt.models.qwen3_moe:Qwen3MoeForCausalLM",
        "DeepseekV3ForCausalLM": "sglang.srt.models.deepseek_v2:DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM": "sglang.srt.models.deepseek_v2:DeepseekV32ForCausalLM",
    }

    @classmethod
    def register(cls, arch: str, model_cls: Union[str, type[CausalLM]]) -> None:
        cls._models[arch] = model_cls

    @classmethod
    def supported_architectures(cls) -> list[str]:
        return sorted(cls._models)

    @classmethod
    def _load(cls, arch: str) -> type[CausalLM]:
        entry = cls._models[arch]
        if isinstance(entry, str):
            module_name, cls_name = entry.split(":")
            entry = getattr(importlib.import_module(module_name), cls_name)
        if not (isinstance(entry, type) and issubclass(entry, CausalLM)):
            raise TypeError(f"model class for {arch!r} must derive from CausalLM, got {entry!r}")
        cls._models[arch] = entry
        return entry

    @classmethod
    def resolve(cls, architectures: Union[Iterable[str], str, None]) -> type[CausalLM]:
        archs = [architectures] if isinstance(architectures, str) else list(architectures or [])
        for arch in archs:
            if arch in cls._models:
                return cls._load(arch)
        raise ValueError(
            f"model architecture(s) {archs} not supported; supported architectures: {cls.supported_architectures()}"
        )
