"""`quantization_config` (config.json) and `--quantization`, checked against each other at start-up.

Supported: `fp8` with 2-D block scales (`weight_block_size`, DeepSeek-V3 / V3.1 / V3.2's format).
Refused by name: every other `quant_method` of a checkpoint (awq, gptq, bitsandbytes, ...) and
upstream's `--quantization` values not built yet (`w8a8_int8`, issue 30).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

SUPPORTED_METHODS = ("fp8",)
# upstream's --quantization values that this engine does not run yet
NOT_BUILT = {
    "w8a8_int8": "not built yet (issue 30)",
    "w8a8_fp8": "not built yet (issue 30)",
    "compressed-tensors": "not built yet (issue 30)",
}


@dataclass(frozen=True)
class QuantSpec:
    """A checkpoint's quantization: method and, for fp8, its weight block [rows, cols]."""

    method: str
    weight_block_size: tuple[int, int]
    activation_scheme: str = "dynamic"


def _supported_text() -> str:
    return f"supported: {', '.join(SUPPORTED_METHODS)} (FP8 with weight_block_size block scales)"


def check_quantization_flag(flag: Optional[str]) -> None:
    """`--quantization` alone: a supported value (ValueError naming it otherwise)."""
    if flag is None or flag in SUPPORTED_METHODS:
        return
    if flag in NOT_BUILT:
        raise ValueError(f"--quantization {flag}: {NOT_BUILT[flag]}; {_supported_text()}")
    raise ValueError(f"--quantization {flag!r} is not supported; {_supported_text()}")


def quant_spec_from_config(hf_config: Any, flag: Optional[str] = None) -> Optional[QuantSpec]:
    """The QuantSpec of an HF config (dict or config object), None for an unquantized checkpoint.

    Raises ValueError, before any weight loads, for an unsupported `quant_method`, for an fp8
    config without 2-D block scales, and for a `--quantization` flag that does not match the
    checkpoint's format (naming both)."""
    check_quantization_flag(flag)
    if isinstance(hf_config, Mapping):
        qc = hf_config.get("quantization_config")
    else:
        qc = getattr(hf_config, "quantization_config", None)
    if qc is not None and not isinstance(qc, Mapping):
        qc = qc.to_dict() if hasattr(qc, "to_dict") else vars(qc)
    if not qc:
        if flag is not None:
            raise ValueError(
                f"--quantization {flag} does not match the checkpoint, which is not quantized "
                f"(no quantization_config): online quantization is not built yet (issue 30)"
            )
        return None
    method = str(qc.get("quant_method", "")).lower()
    if method not in SUPPORTED_METHODS:
        raise ValueError(
            f"the checkpoint's quantization_config quant_method {method!r} is not supported; {_supported_text()}"
        )
    if flag is not None and flag != method:
        raise ValueError(f"--quantization {flag} does not match the checkpoint's quant_method {method!r}")
    block = qc.get("weight_block_size")
    if not block or len(block) != 2:
        raise ValueError(
            "fp8 checkpoints without 2-D weight_block_size (per-tensor / per-channel scales) are not "
            f"supported yet; {_supported_text()}"
        )
    fmt = str(qc.get("fmt", "e4m3")).lower()
    if fmt != "e4m3":
        raise ValueError(f"fp8 format {fmt!r} is not supported (e4m3 only)")
    return QuantSpec(method, (int(block[0]), int(block[1])), str(qc.get("activation_scheme", "dynamic")))
