"""CP vs TP at N ranks for DSA prefill: a part-by-part cost model fitted on two ranks (issue 27).

Two ranks cannot show seed 000's 16-rank figures (CP16 vs TP16: indexer 18x, sparse attention
11.3x per rank, throughput +336 % .. +500 % at 128K). This model extrapolates what the two-rank
measurements of `benchmark/context_parallel/bench_cp_vs_tp.py --json` imply:

- one rank's parts grow with the prompt length T as the work does: the Lightning Indexer with the
  causal (query, key) pairs T(T+1)/2, the sparse attention with the selected keys
  sum_t min(t + 1, topk), the rest ("other": projections, MLP, norms) with T;
- cp N splits every part N ways (zigzag: equal pairs per rank); each part's imbalance / overhead
  factor at cp 2 (the slowest rank over half of cp 1) is kept at N;
- tp N splits a fraction f of each part (f from tp 2: the part at tp 2 = (1 - f + f / 2) x cp 1)
  and repeats the rest on every rank; the indexer's f is ~0 (one key head: every rank scores every
  query), which is the seed's argument;
- communication (optional, `--link-gbps`): cp all-gathers each layer's [latent; rope; index key]
  rows, (N-1)/N x T rows into every rank; tp all-reduces the hidden state twice a layer, a ring
  moving 2 (N-1)/N x T x hidden values per rank; each collective also pays `--latency-us`.

    python -m sglang.srt.tools.cp_sim --measured thesis.json --fit-tokens 16384 --check-tokens 32768 \\
        --ranks 2 4 8 16 --tokens 32768 65536 131072 [--link-gbps 200]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Optional, Sequence

PARTS = ("indexer", "sparse", "other")


def part_work(part: str, tokens: int, topk: int) -> float:
    """The work unit of one part for a prompt of `tokens` tokens on one rank."""
    if part == "indexer":
        return tokens * (tokens + 1) / 2.0
    if part == "sparse":
        k = min(tokens, topk)
        return k * (k + 1) / 2.0 + (tokens - k) * float(topk)
    return float(tokens)


@dataclass(frozen=True)
class Link:
    """A collective link: bytes per second per rank and a fixed cost per collective."""

    bytes_per_s: float
    latency_s: float = 0.0


@dataclass(frozen=True)
class CPTPModel:
    """Per-part unit costs (one rank), cp imbalance factors, tp split fractions, model shape."""

    unit: dict  # part -> seconds per work unit at cp 1
    cp_factor: dict  # part -> slowest cp 2 rank / (cp 1 / 2)
    tp_split: dict  # part -> fraction of the part tp splits
    topk: int
    layers: int
    row_bytes: int  # one token's gathered [latent; rope; index key] row
    hidden_bytes: int

    def parts(self, layout: str, ranks: int, tokens: int) -> dict:
        """Per-rank seconds of each part for one prompt at `ranks` ranks (`layout` cp or tp)."""
        out = {}
        for p in PARTS:
            one = self.unit[p] * part_work(p, tokens, self.topk)
            if ranks == 1:
                out[p] = one
            elif layout == "cp":
                out[p] = one / ranks * self.cp_factor[p]
            else:
                f = self.tp_split[p]
                out[p] = one * (1.0 - f + f / ranks)
        return out

    def comm(self, layout: str, ranks: int, tokens: int, link: Optional[Link]) -> float:
        if link is None or ranks == 1:
            return 0.0
        share = (ranks - 1) / ranks
        if layout == "cp":
            per_layer = share * tokens * self.row_bytes / link.bytes_per_s + link.latency_s
        else:
            per_layer = 2 * (2 * share * tokens * self.hidden_bytes / link.bytes_per_s + link.latency_s)
        return self.layers * per_layer

    def time(self, layout: str, ranks: int, tokens: int, link: Optional[Link] = None) -> float:
        return sum(self.parts(layout, ranks, tokens).values()) + self.comm(layout, ranks, tokens, link)


def _slowest(ranks: list[dict], part: str, clock: str) -> float:
    return max(_part(r, part, clock) for r in ranks)


def _part(rank: dict, part: str, clock: str) -> float:
    """A rank's seconds in `part` by wall time or by its thread CPU (`<part>_cpu`: what the work
    cost whatever else ran on the box)."""
    return rank[part if clock == "wall" else f"{part}_cpu"]


def fit(measured: dict, tokens: int, clock: str = "cpu") -> CPTPModel:
    """The model from one length's cp1, cp2 and tp2 prefill runs of a `--json` file, by `clock`
    (`cpu`: each part's thread CPU; `wall`)."""
    runs = {
        r["layout"]: r["ranks"] for r in measured["runs"] if r["kind"] == "prefill" and r["tokens"] == tokens
    }
    missing = [x for x in ("cp1", "cp2", "tp2") if x not in runs]
    if missing:
        raise ValueError(f"--measured has no prefill run of {missing} at {tokens} tokens")
    topk = int(measured["topk"])
    one = runs["cp1"][0]
    ones = {p: _part(one, p, clock) for p in PARTS}
    unit = {p: ones[p] / part_work(p, tokens, topk) for p in PARTS}
    cp_factor = {p: _slowest(runs["cp2"], p, clock) / (ones[p] / 2.0) for p in PARTS}
    tp_split = {p: min(1.0, max(0.0, 2.0 * (1.0 - _slowest(runs["tp2"], p, clock) / ones[p]))) for p in PARTS}
    shape = measured["shape"]
    row = shape["kv_lora_rank"] + shape["qk_rope_head_dim"] + shape.get("index_head_dim", 128)
    return CPTPModel(
        unit, cp_factor, tp_split, topk, shape["num_hidden_layers"], 4 * row, 4 * shape["hidden_size"]
    )


def check(
    model: CPTPModel, measured: dict, tokens: int, clock: str = "cpu"
) -> list[tuple[str, float, float]]:
    """(layout, predicted, measured) busiest-rank part sums at another length."""
    out = []
    for r in measured["runs"]:
        if r["kind"] != "prefill" or r["tokens"] != tokens or r["layout"] not in ("cp1", "cp2", "tp2"):
            continue
        layout, n = r["layout"][:2], int(r["layout"][2:])
        got = max(sum(_part(x, p, clock) for p in PARTS) for x in r["ranks"])
        out.append((r["layout"], model.time(layout, n, tokens), got))
    return out


def table(model: CPTPModel, ranks: Sequence[int], tokens: Sequence[int], link: Optional[Link]) -> list[str]:
    lines = [
        "| ranks | tokens | cp s per rank | tp s per rank | cp / tp throughput | cp indexer s | tp indexer s "
        "| cp sparse s | tp sparse s | cp comm s | tp comm s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in ranks:
        for t in tokens:
            cp, tp = model.parts("cp", n, t), model.parts("tp", n, t)
            ccp, ctp = model.comm("cp", n, t, link), model.comm("tp", n, t, link)
            tcp, ttp = sum(cp.values()) + ccp, sum(tp.values()) + ctp
            lines.append(
                f"| {n} | {t} | {tcp:.2f} | {ttp:.2f} | {ttp / tcp:.2f}x | {cp['indexer']:.2f} | "
                f"{tp['indexer']:.2f} | {cp['sparse']:.2f} | {tp['sparse']:.2f} | {ccp:.3f} | {ctp:.3f} |"
            )
    return lines


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--measured", required=True, help="bench_cp_vs_tp.py --json output")
    ap.add_argument("--fit-tokens", type=int, required=True, help="prompt length whose cp1/cp2/tp2 runs fit")
    ap.add_argument("--check-tokens", type=int, nargs="*", default=[], help="lengths to predict and compare")
    ap.add_argument(
        "--clock", choices=("cpu", "wall"), default="cpu", help="fit each part's thread CPU or wall time"
    )
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--tokens", type=int, nargs="+", default=[32768, 65536, 131072])
    ap.add_argument("--link-gbps", type=float, help="collective bandwidth per rank, GB/s (none: no comm)")
    ap.add_argument(
        "--latency-us", type=float, default=0.0, help="fixed cost of one collective, microseconds"
    )
    args = ap.parse_args(argv)
    if any(n < 1 for n in args.ranks) or any(t < 1 for t in args.tokens):
        ap.error("--ranks and --tokens must be >= 1")
    with open(args.measured) as f:
        measured = json.load(f)
    model = fit(measured, args.fit_tokens, args.clock)
    print(
        f"fit at {args.fit_tokens} tokens: cp 2 factors {model.cp_factor}, tp split fractions {model.tp_split}"
    )
    for layout, pred, got in (
        row for t in args.check_tokens for row in check(model, measured, t, args.clock)
    ):
        print(f"check {layout}: predicted {pred:.2f} s, measured {got:.2f} s ({pred / got - 1:+.1%})")
    link = None if args.link_gbps is None else Link(args.link_gbps * 1e9, args.latency_us * 1e-6)
    print("\n".join(table(model, args.ranks, args.tokens, link)))


if __name__ == "__main__":
    main()
