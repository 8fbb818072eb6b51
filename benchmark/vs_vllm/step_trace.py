"""The pure parts of `step_breakdown.py`: a scheduler trace's time per step by category, and the
physical limits (weight bytes per decode step, FLOPs per prefill) of a Llama-shaped model.

Two traces of the same workload are combined:
- a *label* trace (`with_stack=False`): the `step_label` names the scheduler and the model runner
  put around each part of a step (`model_executor/step_label.py`) give accurate wall times for
  scheduling, batch building, the model, sampling and the scheduler's ZMQ send / receive;
- a *stack* trace (`with_stack=True`): the Python tracer shows every kernel call (the C++ kernels
  are pybind functions, invisible to a plain trace) under the Python frame that made it, so each
  kernel's time goes to a GEMM kind, attention or the fused norm / RoPE / activation kernels. The
  tracer inflates Python time, not a kernel's own duration, so only kernel times are read here;
  the forward's Python glue is the label trace's model time minus these kernel times.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LABEL_PREFIXES = ("sched.", "runner.")
STEP_START = "sched.schedule"
MODEL = "runner.model"
CONTAINER_LABELS = ("sched.forward",)
GEMM_OPS = ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "aten::linear", "aten::matmul")
GEMM_BUILTINS = (
    "_linear_pointwise",
    "linear_f32out_packed",
    "linear_packed",
    "int8_linear",
    "w8a8",
    "bf16_linear",
)
LAYER_GEMMS = ("gemm qkv", "gemm o_proj", "gemm gate_up", "gemm down")  # call order in a Llama layer
# (substring of the calling Python frame, category): the nearest matching frame decides.
FRAME_CATEGORIES = (
    ("/attention/", "attention"),
    ("kv_pool", "attention"),
    ("layernorm", "norm/rope/act"),
    ("rotary", "norm/rope/act"),
    ("activation", "norm/rope/act"),
    ("embedding", "embedding"),
)


@dataclass
class Span:
    name: str
    cat: str
    ts: float  # us
    dur: float  # us
    parent: "Span | None" = None

    @property
    def end(self) -> float:
        return self.ts + self.dur

    @property
    def is_label(self) -> bool:
        return self.name.startswith(LABEL_PREFIXES)

    @property
    def is_kernel(self) -> bool:
        """An aten op or a call into a pybind (C++) function: time spent in native code."""
        if self.is_label:
            return False
        return self.cat == "cpu_op" or (self.name.startswith("<built-in method") and "pybind11" in self.name)


def main_thread_spans(trace: dict) -> list[Span]:
    """The complete ('X') events of the thread that ran the step labels, each with its parent."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    tids = {(e["pid"], e["tid"]) for e in events if e["name"] == STEP_START}
    if not tids:
        raise ValueError(f"no {STEP_START!r} label in the trace: did the profiled window hold a step?")
    key = max(tids, key=lambda k: sum(1 for e in events if (e["pid"], e["tid"]) == k))
    spans = [
        Span(e["name"], e.get("cat", ""), float(e["ts"]), float(e["dur"]))
        for e in events
        if (e["pid"], e["tid"]) == key
    ]
    spans.sort(key=lambda s: (s.ts, -s.dur))
    stack: list[Span] = []
    for s in spans:
        while stack and stack[-1].end < s.end - 0.01:  # 0.01 us: rounding of the exported times
            stack.pop()
        s.parent = stack[-1] if stack else None
        stack.append(s)
    return spans


def ancestors(span: Span):
    p = span.parent
    while p is not None:
        yield p
        p = p.parent


STEP_ENDS = ("sched.collect_outputs", "sched.emit")


def step_windows(spans: list[Span]) -> list[tuple[float, float]]:
    """[start, end) of each step: from one `sched.schedule` to the next (so a step owns the
    receive / message handling before the next one); the last ends with its outputs sent."""
    starts = sorted(s.ts for s in spans if s.name == STEP_START)
    ends = [s.end for s in spans if s.name in STEP_ENDS and s.ts >= starts[-1]]
    last_end = max(ends) if ends else max(s.end for s in spans if s.is_label and s.ts >= starts[-1])
    return list(zip(starts, starts[1:] + [last_end]))


def label_times(spans: list[Span], windows: list[tuple[float, float]]) -> list[dict[str, float]]:
    """Per step, ms per label, plus 'step' (the window) and 'scheduler loop, unlabelled' (the
    window minus the top-level labels in it; a label of `CONTAINER_LABELS` does not count, its
    labels inside do: traces of before 2026-11-27 21:00 UTC have `sched.forward` around the
    runner's labels)."""
    out = []
    for a, b in windows:
        row: dict[str, float] = {}
        top = 0.0
        for s in spans:
            if s.is_label and a <= s.ts < b:
                row[s.name] = row.get(s.name, 0.0) + s.dur / 1e3
                if s.name not in CONTAINER_LABELS and not any(
                    p.is_label and p.name not in CONTAINER_LABELS for p in ancestors(s)
                ):
                    top += s.dur / 1e3
        row["step"] = (b - a) / 1e3
        row["scheduler loop, unlabelled"] = row["step"] - top
        out.append(row)
    return out


def is_gemm(span: Span) -> bool:
    if span.cat == "cpu_op":
        return span.name in GEMM_OPS
    return any(f"method {b} " in span.name for b in GEMM_BUILTINS)


def kernel_category(span: Span) -> str:
    for p in ancestors(span):
        for needle, cat in FRAME_CATEGORIES:
            if needle in p.name:
                return cat
    return "other kernels"


def model_kernel_times(spans: list[Span]) -> list[dict[str, float]]:
    """Per `runner.model` label (one per step): ms of the outermost kernels under it, by category.
    GEMMs in call order go round qkv, o_proj, gate_up, down; one left over at the end is the LM
    head (a label trace does not see it: it is a pybind kernel)."""
    out = []
    for model in (s for s in spans if s.name == MODEL):
        kernels = [
            s
            for s in spans
            if s.is_kernel
            and model.ts <= s.ts < model.end
            and not any(p.is_kernel for p in ancestors(s))
            and model in ancestors(s)
        ]
        gemms = [k for k in kernels if is_gemm(k)]
        row: dict[str, float] = {name: 0.0 for name in LAYER_GEMMS + ("gemm lm_head",)}
        head = len(gemms) % len(LAYER_GEMMS) == 1
        for i, g in enumerate(gemms):
            name = "gemm lm_head" if head and i == len(gemms) - 1 else LAYER_GEMMS[i % len(LAYER_GEMMS)]
            row[name] += g.dur / 1e3
        for k in kernels:
            if not is_gemm(k):
                cat = kernel_category(k)
                row[cat] = row.get(cat, 0.0) + k.dur / 1e3
        row["layer gemms"] = len(gemms) - head
        out.append(row)
    return out


def mean_rows(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = sorted({k for r in rows for k in r})
    return {k: sum(r.get(k, 0.0) for r in rows) / len(rows) for k in keys} if rows else {}


# ------------------------------------------------------------------------------ limits
@dataclass(frozen=True)
class LlamaShape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def from_config(cls, cfg: dict) -> "LlamaShape":
        heads = cfg["num_attention_heads"]
        return cls(
            hidden=cfg["hidden_size"],
            intermediate=cfg["intermediate_size"],
            layers=cfg["num_hidden_layers"],
            heads=heads,
            kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            vocab=cfg["vocab_size"],
        )

    def gemm_shapes(self) -> dict[str, tuple[int, int]]:
        """(K, N) of each per-layer GEMM."""
        h, d = self.hidden, self.head_dim
        return {
            "qkv": (h, (self.heads + 2 * self.kv_heads) * d),
            "o_proj": (self.heads * d, h),
            "gate_up": (h, 2 * self.intermediate),
            "down": (self.intermediate, h),
        }

    def layer_params(self) -> int:
        return self.layers * sum(k * n for k, n in self.gemm_shapes().values())

    def lm_head_params(self) -> int:
        return self.vocab * self.hidden


def decode_bytes(shape: LlamaShape, weight_bytes: float, batch: int, context: int, kv_bytes: float) -> dict:
    """Bytes one decode step must read: every GEMM weight once (layers + LM head) and the batch's KV."""
    weights = (shape.layer_params() + shape.lm_head_params()) * weight_bytes
    kv = batch * context * shape.layers * 2 * shape.kv_heads * shape.head_dim * kv_bytes
    return {"weight_bytes": weights, "kv_bytes": kv, "total_bytes": weights + kv}


def prefill_flops(shape: LlamaShape, tokens: int) -> dict:
    """FLOPs of one prefill of `tokens`: the layer GEMMs on every token, the LM head on the last
    one, causal attention (QK^T and PV over the lower triangle)."""
    gemm = 2.0 * tokens * shape.layer_params() + 2.0 * shape.lm_head_params()
    attn = 2.0 * 2.0 * shape.layers * shape.heads * shape.head_dim * tokens * (tokens + 1) / 2
    return {"gemm_flops": gemm, "attention_flops": attn, "total_flops": gemm + attn}


def limit_ms(amount: float, rate_per_s: float) -> float:
    return amount / rate_per_s * 1e3 if rate_per_s > 0 else float("nan")


def weight_elem_bytes(mode: str, tokens: int) -> int:
    """Bytes per weight element a GEMM of `tokens` rows reads under a `--dtype` mode (the mode
    text `platforms/cpu.py`'s CpuDtypeChoice.mode gives, or a plain dtype name)."""
    m = re.search(r"<= (\d+) token", mode)
    if mode.startswith("float32"):
        return 2 if m and tokens <= int(m.group(1)) else 4
    m = re.search(r">= (\d+) tokens", mode)
    if m:
        return 4 if tokens >= int(m.group(1)) else 2
    return 2 if mode.startswith(("bfloat16", "float16", "half")) else 4


def gemm_dtype(mode: str, tokens: int) -> str:
    return "bfloat16" if weight_elem_bytes(mode, tokens) == 2 else "float32"
