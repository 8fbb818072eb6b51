"""Per-stage bubble ratio and a PNG timeline from a pipeline trace (`--pp-trace-path`).

    python benchmark/pp/trace_report.py TRACE.json [--rid RID] [--png timeline.png] [--json out.json]

The window is one request: the forward events whose `args.rids` contain `--rid` (default: the
request of the last forward on stage 0). Wall = first start to last end of those events over all
ranks; busy(stage) = the summed duration of its forwards in the window (mean over its tp ranks);
bubble(stage) = 1 − busy / wall; overall = 1 − Σ busy / (P · wall).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Optional


@dataclass
class Report:
    rid: str
    wall_s: float
    busy_s: dict[int, float]  # pp stage -> busy seconds
    bubble: dict[int, float]  # pp stage -> bubble ratio
    overall_bubble: float
    chunks: int

    def table(self) -> str:
        lines = [
            f"request {self.rid}: {self.chunks} chunks, wall {self.wall_s * 1e3:.1f} ms",
            "| stage | busy (ms) | bubble ratio |",
            "|---|---|---|",
        ]
        for stage in sorted(self.busy_s):
            lines.append(f"| {stage} | {self.busy_s[stage] * 1e3:.1f} | {100 * self.bubble[stage]:.1f} % |")
        lines.append(f"| all | {sum(self.busy_s.values()) * 1e3:.1f} | {100 * self.overall_bubble:.1f} % |")
        return "\n".join(lines)


def load_events(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def forwards(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and e.get("name") == "forward"]


def default_rid(events: list[dict]) -> str:
    stage0 = [e for e in forwards(events) if e["args"].get("pp_rank") == 0 and e["args"].get("rids")]
    if not stage0:
        raise ValueError("the trace has no forward events on stage 0")
    return max(stage0, key=lambda e: e["ts"])["args"]["rids"][-1]


def bubble_report(events: list[dict], rid: Optional[str] = None) -> Report:
    rid = rid or default_rid(events)
    mine = [e for e in forwards(events) if rid in e["args"].get("rids", [])]
    if not mine:
        raise ValueError(f"no forward events of request {rid!r} in the trace")
    start = min(e["ts"] for e in mine)
    end = max(e["ts"] + e["dur"] for e in mine)
    wall = (end - start) / 1e6
    per_rank: dict[int, float] = defaultdict(float)
    stage_of: dict[int, int] = {}
    for e in forwards(events):  # every forward inside the window counts as busy (other requests too)
        s, d = e["ts"], e["dur"]
        overlap = min(s + d, end) - max(s, start)
        if overlap > 0:
            per_rank[e["pid"]] += overlap / 1e6
            stage_of[e["pid"]] = int(e["args"].get("pp_rank", 0))
    ranks_of_stage: dict[int, list[int]] = defaultdict(list)
    for rank, stage in stage_of.items():
        ranks_of_stage[stage].append(rank)
    busy = {stage: sum(per_rank[r] for r in ranks) / len(ranks) for stage, ranks in ranks_of_stage.items()}
    bubble = {stage: 1.0 - b / wall for stage, b in busy.items()}
    overall = 1.0 - sum(busy.values()) / (len(busy) * wall)
    chunks = len({e["args"]["mb"] for e in mine})
    return Report(rid, wall, busy, bubble, overall, chunks)


def plot_timeline(events: list[dict], report: Report, png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [e for e in forwards(events) if report.rid in e["args"].get("rids", [])]
    t0 = min(e["ts"] for e in mine)
    t1 = max(e["ts"] + e["dur"] for e in mine)
    ranks = sorted({e["pid"] for e in events if e.get("ph") == "X"})
    names = {
        e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    colors = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(12, 0.8 + 0.7 * len(ranks)))
    for row, rank in enumerate(ranks):
        for e in events:
            if e.get("ph") != "X" or e["pid"] != rank or e["ts"] + e["dur"] < t0 or e["ts"] > t1:
                continue
            start, end = max(e["ts"], t0), min(e["ts"] + e["dur"], t1)  # clip to the request's window
            x, w = (start - t0) / 1e3, (end - start) / 1e3
            if e["name"] == "forward":
                mb = int(e["args"].get("mb", 0))
                ax.broken_barh(
                    [(x, w)], (row - 0.35, 0.7), facecolors=colors(mb % 10), edgecolor="black", linewidth=0.3
                )
                if w > (t1 - t0) / 1e3 / 60:
                    ax.text(x + w / 2, row, str(mb), ha="center", va="center", fontsize=7)
            elif "wait" in e["name"]:
                ax.broken_barh([(x, w)], (row - 0.12, 0.24), facecolors="lightgrey")
            elif e["name"].startswith("send"):
                ax.broken_barh([(x, max(w, 0.05))], (row + 0.36, 0.1), facecolors="black")
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels(
        [
            f"{names.get(r, f'rank {r}')}\nbubble {100 * report.bubble.get(_stage(events, r), 0):.0f} %"
            for r in ranks
        ]
    )
    ax.invert_yaxis()
    ax.set_xlabel("ms since the request's first forward (colours: micro-batch id; grey: waits; black: sends)")
    ax.set_title(
        f"Pipeline timeline of {report.rid}: {report.chunks} micro-batches, wall {report.wall_s * 1e3:.0f} ms, "
        f"overall bubble {100 * report.overall_bubble:.1f} %"
    )
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def _stage(events: list[dict], rank: int) -> int:
    for e in forwards(events):
        if e["pid"] == rank:
            return int(e["args"].get("pp_rank", 0))
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--rid", default=None)
    ap.add_argument("--png", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    events = load_events(args.trace)
    report = bubble_report(events, args.rid)
    print(report.table())
    if args.png:
        plot_timeline(events, report, args.png)
        print(f"timeline written to {args.png}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report.__dict__, f, indent=2)


if __name__ == "__main__":
    main()
