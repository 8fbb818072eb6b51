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


def _our_python_files() -> list[Path]:
    """The repository's own .py files under python/, test/ and benchmark/: git's list where there is
    one (a venv or a build left inside the tree, e.g. vLLM's under benchmark/, is not ours)."""
    tops = ("python", "test", "benchmark")
    out = subprocess.run(["git", "ls-files", "--", *tops], cwd=ROOT, capture_output=True, text=True)
    if out.returncode == 0 and out.stdout.strip():
        return [ROOT / f for f in out.stdout.split() if f.endswith(".py") and (ROOT / f).is_file()]
    return [p for top in tops for p in (ROOT / top).rglob("*.py") if not any("venv" in x for x in p.parts)]


def test_no_fmt_skip_markers():
    marked = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in _our_python_files()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "# fmt: " + "skip" in line or "# fmt: " + "off" in line
    ]
    assert not marked, "formatter opt-outs: " + ", ".join(marked[:20])


def test_lint_clean():
    out = subprocess.run(_ruff() + ["check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
