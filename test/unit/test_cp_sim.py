"""tools/cp_sim.py: the CP-vs-TP part model recovers the parameters of runs it generated, predicts
other lengths from one fit, and refuses a measurement file without the runs it needs."""

from __future__ import annotations

import json

import pytest

from sglang.srt.tools import cp_sim

SHAPE = {
    "kv_lora_rank": 256,
    "qk_rope_head_dim": 64,
    "index_head_dim": 64,
    "num_hidden_layers": 2,
    "hidden_size": 1024,
}
TRUE = cp_sim.CPTPModel(
    unit={"indexer": 2e-9, "sparse": 3e-9, "other": 4e-4},
    cp_factor={"indexer": 1.1, "sparse": 1.2, "other": 1.05},
    tp_split={"indexer": 0.0, "sparse": 0.3, "other": 0.9},
    topk=2048,
    layers=2,
    row_bytes=4 * 384,
    hidden_bytes=4096,
)


def _ranks(layout: str, n: int, tokens: int) -> list[dict]:
    parts = TRUE.parts(layout, n, tokens)
    # the second rank a little faster: the fit keeps the slowest
    first = {**parts, **{f"{p}_cpu": v for p, v in parts.items()}, "comm": 0.0}
    return [first] + [{k: v * 0.9 for k, v in first.items()}] * (n - 1)


def _measured(lengths) -> dict:
    runs = [
        {"kind": "prefill", "tokens": t, "layout": name, "ranks": _ranks(name[:2], int(name[2:]), t)}
        for t in lengths
        for name in ("cp1", "cp2", "tp2")
    ]
    return {"shape": SHAPE, "topk": 2048, "runs": runs}


def test_fit_recovers_the_generating_model_and_predicts_other_lengths():
    model = cp_sim.fit(_measured([16384, 65536]), 16384)
    for p in cp_sim.PARTS:
        assert model.unit[p] == pytest.approx(TRUE.unit[p], rel=1e-9)
        assert model.cp_factor[p] == pytest.approx(TRUE.cp_factor[p], rel=1e-9)
        assert model.tp_split[p] == pytest.approx(TRUE.tp_split[p], rel=1e-9)
    for layout, pred, got in cp_sim.check(model, _measured([65536]), 65536):
        assert pred == pytest.approx(got, rel=1e-9), layout


def test_tp_repeats_the_indexer_so_cp_gains_with_ranks_and_length():
    link = cp_sim.Link(100e9, 20e-6)
    ratio = {
        (n, t): TRUE.time("tp", n, t, link) / TRUE.time("cp", n, t, link)
        for n in (2, 16)
        for t in (32768, 131072)
    }
    assert ratio[(16, 131072)] > ratio[(16, 32768)] > ratio[(2, 32768)] > 1.0
    assert TRUE.parts("tp", 16, 131072)["indexer"] == TRUE.parts("cp", 1, 131072)["indexer"]
    assert TRUE.comm("cp", 16, 131072, link) > 0 and TRUE.comm("cp", 1, 131072, link) == 0


def test_cli_prints_the_table_and_refuses_missing_runs(tmp_path, capsys):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(_measured([16384])))
    cp_sim.main(["--measured", str(path), "--fit-tokens", "16384", "--ranks", "16", "--tokens", "131072"])
    out = capsys.readouterr().out
    assert "| 16 | 131072 |" in out
    with pytest.raises(ValueError, match="cp1.*32768|32768"):
        cp_sim.main(["--measured", str(path), "--fit-tokens", "32768"])
