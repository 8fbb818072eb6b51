"""Measured per-chunk latencies in, fitted `StageCostModel` out.

Accepted inputs (by content, not by file name):
- Chrome trace JSON (`{"traceEvents": [...]}` or a bare event list): complete events (`"ph": "X"`,
  `dur` in µs) or `B`/`E` pairs, whose `args` carry the chunk size (`chunk_len`, `extend_len` or
  `num_tokens`) and the cached prefix (`prefix_len`, default 0); the stage is `args.pp_rank`
  (else `args.stage`, else `pid`). Other events are ignored; `name_filter` keeps names containing it.
- A JSON list / JSON lines of records `{"prefix_len", "chunk_len", "latency_s" | "latency_ms",
  ["stage"]}`, or a CSV file with those column names.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from sglang.srt.managers.dynamic_chunking import ChunkSample, FitError, TransferModel, robust_fit_chunks
from sglang.srt.tools.pp_sim_core import StageCostModel

_CHUNK_KEYS = ("chunk_len", "extend_len", "num_tokens")
_PREFIX_KEYS = ("prefix_len", "cached_len")


@dataclass(frozen=True)
class Measurement:
    prefix_len: int
    chunk_len: int
    latency_s: float
    stage: int = 0


def _first(d: dict, keys: Iterable[str]) -> Optional[Any]:
    for k in keys:
        if k in d and d[k] is not None:
            return d[k]
    return None


def _from_record(r: dict) -> Optional[Measurement]:
    chunk = _first(r, _CHUNK_KEYS)
    if chunk is None:
        return None
    if "latency_s" in r:
        lat = float(r["latency_s"])
    elif "latency_ms" in r:
        lat = float(r["latency_ms"]) / 1e3
    else:
        return None
    return Measurement(int(_first(r, _PREFIX_KEYS) or 0), int(chunk), lat, int(r.get("stage", 0) or 0))


def _from_trace_events(events: list, name_filter: str = "") -> list[Measurement]:
    out: list[Measurement] = []
    open_b: dict[tuple, list[dict]] = {}
    for ev in events:
        if not isinstance(ev, dict) or name_filter not in str(ev.get("name", "")):
            continue
        ph = ev.get("ph")
        if ph == "B":
            open_b.setdefault((ev.get("pid"), ev.get("tid")), []).append(ev)
            continue
        if ph == "E":
            stack = open_b.get((ev.get("pid"), ev.get("tid")))
            if not stack:
                continue
            begin = stack.pop()
            args = {**(begin.get("args") or {}), **(ev.get("args") or {})}
            dur_us = float(ev["ts"]) - float(begin["ts"])
            pid = begin.get("pid")
        elif ph == "X":
            args, dur_us, pid = ev.get("args") or {}, float(ev.get("dur", 0.0)), ev.get("pid")
        else:
            continue
        chunk = _first(args, _CHUNK_KEYS)
        if chunk is None or dur_us <= 0:
            continue
        stage = args.get("pp_rank", args.get("stage", pid if isinstance(pid, int) else 0))
        out.append(Measurement(int(_first(args, _PREFIX_KEYS) or 0), int(chunk), dur_us / 1e6, int(stage)))
    return out


def parse_measurements(text: str, name_filter: str = "") -> list[Measurement]:
    """Measurements from the text of a trace / JSON / JSONL / CSV file."""
    stripped = text.lstrip()
    if stripped.startswith("{") or stripped.startswith("["):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError:
            data = [json.loads(line) for line in stripped.splitlines() if line.strip()]
        if isinstance(data, dict):
            data = data.get("traceEvents", data.get("measurements", []))
        if any(isinstance(e, dict) and "ph" in e for e in data):
            return _from_trace_events(data, name_filter)
        return [m for m in (_from_record(r) for r in data if isinstance(r, dict)) if m is not None]
    rows = csv.DictReader(io.StringIO(text))
    return [m for m in (_from_record(dict(r)) for r in rows) if m is not None]


def load_measurements(paths: Iterable[str], name_filter: str = "") -> list[Measurement]:
    out: list[Measurement] = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            out.extend(parse_measurements(f.read(), name_filter))
    return out


def fit_cost_model(
    measurements: list[Measurement],
    measured_pp: int = 1,
    transfer: TransferModel = TransferModel(),
    name: str = "",
    isolated: bool = False,
) -> StageCostModel:
    """Robust fit of every sample, returned as a whole-model `StageCostModel`.

    Per-stage samples (a trace of a `measured_pp`-stage run): (a, b) = stage fit × measured_pp,
    c = the stage's fixed cost. `isolated=True`: each sample is one chunk alone through the whole
    `measured_pp`-stage pipeline (`measure`): (a, b) as fitted, c = fitted c / measured_pp.
    Negative b or c (noise) are clamped to 0; a <= 0 raises `FitError`.
    """
    samples = [ChunkSample(m.prefix_len, m.chunk_len, m.latency_s) for m in measurements]
    model = robust_fit_chunks(samples)
    if not model.a > 0.0:
        raise FitError(f"fitted a = {model.a:.3g} <= 0: the samples show no growth with the prefix")
    b, c = max(0.0, model.b), max(0.0, model.c)
    if isolated:
        return StageCostModel(model.a, b, c / measured_pp, transfer, name)
    return StageCostModel(model.a * measured_pp, b * measured_pp, c, transfer, name)


def load_ttfts(path: str) -> list[tuple[int, float]]:
    """Measured TTFTs: JSON `{"ttft": [{"prompt_len", "ttft_s"}...]}`, a list of those, or
    `{"<prompt_len>": ttft_s, ...}`."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if isinstance(data, dict) and "ttft" in data:
        data = data["ttft"]
    if isinstance(data, dict):
        return sorted((int(k), float(v)) for k, v in data.items())
    return [(int(r["prompt_len"]), float(r["ttft_s"])) for r in data]
