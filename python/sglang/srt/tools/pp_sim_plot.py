"""PNG pipeline timelines (one panel per simulated policy, one row per stage)."""

from __future__ import annotations

from typing import Sequence

from sglang.srt.tools.pp_sim_core import SimResult


def draw_timelines(results: Sequence[SimResult], path: str, title: str = "") -> str:
    """Draw each result's stage × time chart into one PNG at `path`; returns `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(results)
    if n == 0:
        raise ValueError("nothing to draw")
    horizon = max(r.ttft for r in results) or 1.0
    height = sum(0.45 * r.pp_size + 0.9 for r in results)
    fig, axes = plt.subplots(n, 1, figsize=(12, max(2.5, height)), squeeze=False, sharex=True)
    cmap = plt.get_cmap("viridis")
    for ax, r in zip(axes[:, 0], results):
        k_n = len(r.chunks)
        for s in range(r.pp_size):
            bars = [
                (r.timeline.start[k][s], r.timeline.end[k][s] - r.timeline.start[k][s]) for k in range(k_n)
            ]
            colors = [cmap(k / max(1, k_n - 1)) for k in range(k_n)]
            ax.broken_barh(bars, (s - 0.4, 0.8), facecolors=colors, edgecolor="white", linewidth=0.3)
        ax.set_ylim(r.pp_size - 0.5, -0.5)
        ax.set_yticks(range(r.pp_size))
        ax.set_yticklabels([f"stage {s}" for s in range(r.pp_size)])
        ax.set_xlim(0, horizon * 1.01)
        ax.set_title(
            f"{r.label}: {k_n} chunks, TTFT {r.ttft:.3g} s, bubble {100 * r.bubble_ratio:.1f} %", fontsize=9
        )
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("time since the prompt arrived (s); colour = chunk index")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
