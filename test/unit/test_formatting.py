"""The tree stays formatted the one way ruff.toml says (`make format` fixes it) and free of the
errors ruff's linter is set to catch (undefined names). ruff comes with the `test` extra."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    return [exe]


def test_tree_is_formatted():
    out = subprocess.run(
        _ruff() + ["format", "--check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, "run `make format`:\n" + out.stdout[-3000:] + out.stderr[-2000:]


def test_no_fmt_skip_markers():
    marked = [
        f"{p.relative_to(ROOT)}:{i}"
        for top in ("python", "test", "benchmark")
        for p in (ROOT / top).rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "# fmt: " + "skip" in line or "# fmt: " + "off" in line
    ]
    assert not marked, "formatter opt-outs: " + ", ".join(marked[:20])


def test_lint_clean():
    out = subprocess.run(_ruff() + ["check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
