"""`quantization_config` (config.json) and `--quantization`, checked against each other at start-up.

Supported:
- `fp8` with 2-D block scales (`weight_block_size`, DeepSeek-V3 / V3.1 / V3.2's format), dynamic
  activations; `scale_fmt: ue8m0` (V3.1 / V3.2: every block scale a power of two, still stored as
  float32) is accepted and checked at load (`fp8_load.py`); other scale formats and
  `activation_scheme: static` are refused;
- `w8a8_int8` (SGLang's format: int8 weights with a per-output-channel `weight_scale`, activations
  quantized per token at run time, both symmetric), and `compressed-tensors` checkpoints of the same
  scheme (llm-compressor's W8A8-INT8: `format: int-quantized`, weights int8 `strategy: channel`,
  input activations int8 `strategy: token`, `dynamic: true`, symmetric), run by the same method.
Refused by name: every other `quant_method` of a checkpoint (awq, gptq, bitsandbytes, ...), other
compressed-tensors schemes, and upstream's `--quantization` values not built yet (`w8a8_fp8`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

SUPPORTED_METHODS = ("fp8", "w8a8_int8", "compressed-tensors")
W8A8_INT8 = "w8a8_int8"
# upstream's --quantization values that this engine does not run yet
NOT_BUILT = {"w8a8_fp8": "not built yet (issue 30)"}
_SUPPORTED_TEXT = (
    "supported: fp8 (FP8 with weight_block_size block scales), w8a8_int8 and compressed-tensors "
    "W8A8-INT8 (int8 per-channel weights, dynamic per-token int8 activations, symmetric)"
)


@dataclass(frozen=True)
class QuantSpec:
    """A checkpoint's quantization: the method that runs it (`fp8` or `w8a8_int8`), for fp8 its
    weight block [rows, cols], and the checkpoint's own quant_method (`source`)."""

    method: str
    weight_block_size: Optional[tuple[int, int]] = None
    activation_scheme: str = "dynamic"
    source: str = field(default="", compare=False)
    scale_fmt: Optional[str] = None  # fp8: "ue8m0" = every block scale a power of two


def check_quantization_flag(flag: Optional[str]) -> None:
    """`--quantization` alone: a supported value (ValueError naming it otherwise)."""
    if flag is None or flag in SUPPORTED_METHODS:
        return
    if flag in NOT_BUILT:
        raise ValueError(f"--quantization {flag}: {NOT_BUILT[flag]}; {_SUPPORTED_TEXT}")
    raise ValueError(f"--quantization {flag!r} is not supported; {_SUPPORTED_TEXT}")


def _as_dict(hf_config: Any) -> Optional[Mapping]:
    if isinstance(hf_config, Mapping):
        qc = hf_config.get("quantization_config")
    else:
        qc = getattr(hf_config, "quantization_config", None)
    if qc is not None and not isinstance(qc, Mapping):
        qc = qc.to_dict() if hasattr(qc, "to_dict") else vars(qc)
    return qc


def quant_spec_from_config(hf_config: Any, flag: Optional[str] = None) -> Optional[QuantSpec]:
    """The QuantSpec of an HF config (dict or config object), None for an unquantized checkpoint.

    Raises ValueError, before any weight loads, for an unsupported `quant_method` or scheme, and for
    a `--quantization` flag that does not match the checkpoint's format (naming both)."""
    check_quantization_flag(flag)
    qc = _as_dict(hf_config)
    if not qc:
        if flag is not None and flag != W8A8_INT8:
            raise ValueError(
                f"--quantization {flag} does not match the checkpoint, which is not quantized "
                f"(no quantization_config): online quantization is built for {W8A8_INT8} only (issue 30)"
            )
        return None  # unquantized (with --quantization w8a8_int8: quantized after loading, online.py)
    method = str(qc.get("quant_method", "")).lower()
    if method not in SUPPORTED_METHODS:
        raise ValueError(
            f"the checkpoint's quantization_config quant_method {method!r} is not supported; {_SUPPORTED_TEXT}"
        )
    if method == "fp8":
        spec = _fp8_spec(qc)
    elif method == W8A8_INT8:
        spec = QuantSpec(W8A8_INT8, source=method)
    else:
        spec = _compressed_tensors_spec(qc)
    if flag is not None and flag not in (method, spec.method):
        raise ValueError(f"--quantization {flag} does not match the checkpoint's quant_method {method!r}")
    return spec


def _fp8_spec(qc: Mapping) -> QuantSpec:
    block = qc.get("weight_block_size")
    if not block or len(block) != 2:
        raise ValueError(
            "fp8 checkpoints without 2-D weight_block_size (per-tensor / per-channel scales) are not "
            f"supported yet; {_SUPPORTED_TEXT}"
        )
    fmt = str(qc.get("fmt", "e4m3")).lower()
    if fmt != "e4m3":
        raise ValueError(f"fp8 format {fmt!r} is not supported (e4m3 only)")
    scheme = str(qc.get("activation_scheme", "dynamic")).lower()
    if scheme != "dynamic":
        raise ValueError(
            f"fp8 activation_scheme {scheme!r} is not supported (dynamic only: no static input_scale)"
        )
    scale_fmt = qc.get("scale_fmt")
    if scale_fmt is not None and str(scale_fmt).lower() != "ue8m0":
        raise ValueError(f"fp8 scale_fmt {scale_fmt!r} is not supported (float32 scales, or ue8m0)")
    block_size = (int(block[0]), int(block[1]))
    ue8m0 = None if scale_fmt is None else "ue8m0"
    return QuantSpec("fp8", block_size, scheme, "fp8", scale_fmt=ue8m0)


def _compressed_tensors_spec(qc: Mapping) -> QuantSpec:
    """compressed-tensors: only W8A8-INT8 (every config group int8 channel weights, int8 dynamic
    per-token input activations, symmetric); anything else refused naming what was found."""
    fmt = str(qc.get("format", "")).lower()
    groups = qc.get("config_groups") or {}
    if fmt != "int-quantized" or not groups:
        raise ValueError(
            f"compressed-tensors format {fmt!r} is not supported (int-quantized W8A8 only); {_SUPPORTED_TEXT}"
        )
    for name, group in groups.items():
        w, a = group.get("weights") or {}, group.get("input_activations") or {}
        want_w = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
        want_a = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
        bad = [f"weights.{k}={w.get(k)!r}" for k, v in want_w.items() if w.get(k) != v]
        bad += [f"input_activations.{k}={a.get(k)!r}" for k, v in want_a.items() if a.get(k) != v]
        if w.get("dynamic"):
            bad.append("weights.dynamic=True")
        if bad:
            raise ValueError(
                f"compressed-tensors config group {name!r}: {', '.join(bad)} is not supported; {_SUPPORTED_TEXT}"
            )
    return QuantSpec(W8A8_INT8, source="compressed-tensors")
