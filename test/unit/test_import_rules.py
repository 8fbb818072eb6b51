"""Import structure of python/sglang: no import cycles, and the layering rules between the
packages of `sglang.srt` (docs/architecture.md, "Packages and import rules").

Imports are read from the source (AST), so module-level, function-level and TYPE_CHECKING imports
all count: a cycle hidden behind a function-level import is still a cycle.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "python"

# area (first package under sglang.srt, or a top-level srt module) -> areas it must never import
FORBIDDEN: dict[str, set[str]] = {
    "managers": {"layers", "models"},
    "layers": {"managers", "entrypoints"},
    "models": {"managers", "entrypoints"},
    "mem_cache": {"models", "layers", "managers", "entrypoints", "model_executor"},
    # constrained decoding sees requests only through their sampling parameters and output ids
    "constrained": {"models", "layers", "managers", "entrypoints", "model_executor", "mem_cache"},
    "distributed": {"models", "layers", "managers", "entrypoints", "model_executor", "mem_cache"},
    # config flows one way: the flags know no layer or model (their checks against the model run
    # at start-up, configs/startup_checks.py)
    "server_args": {"layers", "models", "managers", "entrypoints", "model_executor"},
    "server_args_cli": {"layers", "models", "managers", "entrypoints", "model_executor"},
    "server_args_checks": {"layers", "models", "managers", "entrypoints", "model_executor"},
    "server_args_parallel": {"layers", "models", "managers", "entrypoints", "model_executor"},
    "port_args": {"layers", "models", "managers", "entrypoints", "model_executor", "server_args"},
    "kernels": {
        "managers",
        "entrypoints",
        "models",
        "layers",
        "model_executor",
        "mem_cache",
        "distributed",
        "sampling",
        "metrics",
        "model_loader",
        "server_args",
    },
}


def module_files(root: Path, package: str = "sglang") -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under root/package."""
    mods: dict[str, Path] = {}
    for dirpath, _, files in os.walk(root / package):
        for f in files:
            if f.endswith(".py"):
                path = Path(dirpath) / f
                name = ".".join(path.relative_to(root).with_suffix("").parts)
                mods[name.removesuffix(".__init__")] = path
    return mods


def import_graph(root: Path, package: str = "sglang") -> dict[str, set[str]]:
    """Module -> the modules of the tree it imports (anywhere in its source)."""
    mods = module_files(root, package)

    def resolve(name: str):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                target = resolve(name)
                if target is not None and target != mod:
                    edges[mod].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def area(module: str):
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["sglang", "srt"] else None


# package -> the only packages of its parent it may import (besides itself): PD's transport base
# classes know no backend, and a backend builds on them alone (disaggregation/README.md). The
# parent package itself (its __init__, which every import of a submodule runs) does not count.
CONFINED: dict[str, tuple[str, ...]] = {
    "sglang.srt.disaggregation.base": (),
    "sglang.srt.disaggregation.mooncake": ("sglang.srt.disaggregation.base",),
    "sglang.srt.disaggregation.fake": ("sglang.srt.disaggregation.base",),
}


# package -> packages (or modules) it must never import, finer than FORBIDDEN's areas
# (managers/README.md): the request side (tokenizer/) and the scheduler side (scheduler/) know each
# other only through the messages of io_struct, the DP controller (dp/) knows neither, the
# scheduler side knows the pipeline ring (pp/) only in its process entry, dynamic_chunking/ is pure;
# of the managers, model_executor knows only the request types its stage profiler builds a batch of.
M = "sglang.srt.managers"
APART: dict[str, tuple[str, ...]] = {
    f"{M}.io_struct": (f"{M}.tokenizer", f"{M}.scheduler", f"{M}.dp", f"{M}.pp", f"{M}.dynamic_chunking"),
    f"{M}.tokenizer": (f"{M}.scheduler", f"{M}.dp", f"{M}.pp", f"{M}.dynamic_chunking"),
    f"{M}.scheduler": (f"{M}.tokenizer", f"{M}.dp", f"{M}.pp"),
    f"{M}.dp": (f"{M}.tokenizer", f"{M}.scheduler", f"{M}.pp", f"{M}.dynamic_chunking"),
    f"{M}.pp": (f"{M}.tokenizer", f"{M}.dp"),
    f"{M}.dynamic_chunking": (f"{M}.io_struct", f"{M}.tokenizer", f"{M}.scheduler", f"{M}.dp", f"{M}.pp"),
    "sglang.srt.model_executor": (M,),
}
# module -> what it may import all the same
APART_EXCEPT: dict[str, tuple[str, ...]] = {
    f"{M}.scheduler.scheduler_process": (f"{M}.pp",),  # the process entry builds a ring rank
    "sglang.srt.model_executor.stage_profiler": (f"{M}.scheduler.schedule_batch",),
}


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def rule_breaks(edges: dict[str, set[str]]) -> list[str]:
    breaks = {
        f"{src} -> {dst}"
        for src, targets in edges.items()
        for dst in targets
        if area(dst) in FORBIDDEN.get(area(src), ())
    }
    for package, allowed in CONFINED.items():
        parent = package.rpartition(".")[0]
        for src in (m for m in edges if _inside(m, package)):
            for dst in edges[src]:
                if (
                    _inside(dst, parent)
                    and dst != parent
                    and not any(_inside(dst, p) for p in (package, *allowed))
                ):
                    breaks.add(f"{src} -> {dst}")
    for package, banned in APART.items():
        for src in (m for m in edges if _inside(m, package)):
            excepted = APART_EXCEPT.get(src, ())
            for dst in edges[src]:
                if any(_inside(dst, b) for b in banned) and not any(_inside(dst, e) for e in excepted):
                    breaks.add(f"{src} -> {dst}")
    return sorted(breaks)


# ---------------------------------------------------------------------------- the checker itself
def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_checker_finds_function_level_cycles_and_rule_breaks(tmp_path):
    _write(
        tmp_path,
        {
            "sglang/__init__.py": "",
            "sglang/srt/__init__.py": "",
            "sglang/srt/layers/__init__.py": "",
            "sglang/srt/layers/a.py": "def f():\n    from sglang.srt.layers import b\n",
            "sglang/srt/layers/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n",
            "sglang/srt/layers/c.py": "from sglang.srt.managers.m import x\n",
            "sglang/srt/managers/__init__.py": "",
            "sglang/srt/managers/m.py": "x = 1\n",
        },
    )
    edges = import_graph(tmp_path)
    assert cycles(edges) == [["sglang.srt.layers.a", "sglang.srt.layers.b"]]
    assert rule_breaks(edges) == ["sglang.srt.layers.c -> sglang.srt.managers.m"]


def test_checker_finds_confined_package_breaks(tmp_path):
    pd = "sglang/srt/disaggregation"
    _write(
        tmp_path,
        {
            "sglang/__init__.py": "",
            "sglang/srt/__init__.py": "",
            f"{pd}/__init__.py": "",
            f"{pd}/common.py": "from sglang.srt.disaggregation.base.conn import X\n",
            f"{pd}/base/__init__.py": "",
            f"{pd}/base/conn.py": "X = 1\n",
            f"{pd}/base/bad.py": "from sglang.srt.disaggregation.fake.conn import Y\n",
            f"{pd}/fake/__init__.py": "",
            f"{pd}/fake/conn.py": "from sglang.srt.disaggregation.base.conn import X\nY = X\n",
            f"{pd}/mooncake/__init__.py": "",
            f"{pd}/mooncake/a.py": "from sglang.srt.disaggregation import common\nfrom .b import Z\n",
            f"{pd}/mooncake/b.py": "Z = 1\n",
        },
    )
    assert rule_breaks(import_graph(tmp_path)) == [
        "sglang.srt.disaggregation.base.bad -> sglang.srt.disaggregation.fake.conn",
        "sglang.srt.disaggregation.mooncake.a -> sglang.srt.disaggregation.common",
    ]


def test_checker_keeps_the_managers_subpackages_apart(tmp_path):
    m = "sglang/srt/managers"
    _write(
        tmp_path,
        {
            "sglang/__init__.py": "",
            "sglang/srt/__init__.py": "",
            f"{m}/__init__.py": "",
            f"{m}/io_struct.py": "X = 1\n",
            f"{m}/tokenizer/__init__.py": "",
            f"{m}/tokenizer/manager.py": "from sglang.srt.managers.io_struct import X\n",
            f"{m}/tokenizer/bad.py": "def f():\n    from sglang.srt.managers.scheduler import loop\n",
            f"{m}/scheduler/__init__.py": "",
            f"{m}/scheduler/loop.py": "from sglang.srt.managers.io_struct import X\n",
            f"{m}/scheduler/scheduler_process.py": "from sglang.srt.managers.pp.rank import R\n",
            f"{m}/scheduler/ring.py": "from sglang.srt.managers.pp import rank\n",
            f"{m}/pp/__init__.py": "",
            f"{m}/pp/rank.py": "from sglang.srt.managers.scheduler.loop import X\nR = X\n",
        },
    )
    assert rule_breaks(import_graph(tmp_path)) == [  # `from package import module` runs both
        "sglang.srt.managers.scheduler.ring -> sglang.srt.managers.pp",
        "sglang.srt.managers.scheduler.ring -> sglang.srt.managers.pp.rank",
        "sglang.srt.managers.tokenizer.bad -> sglang.srt.managers.scheduler",
        "sglang.srt.managers.tokenizer.bad -> sglang.srt.managers.scheduler.loop",
    ]


# ---------------------------------------------------------------------------- the tree
@pytest.fixture(scope="module")
def tree_edges() -> dict[str, set[str]]:
    return import_graph(ROOT)


def test_tree_is_read(tree_edges):
    assert "sglang.srt.managers.scheduler.scheduler" in tree_edges
    assert all(package in tree_edges for package in APART)  # every rule names a package of the tree
    assert len(tree_edges) > 100


def test_no_import_cycles(tree_edges):
    found = cycles(tree_edges)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_package_layering(tree_edges):
    breaks = rule_breaks(tree_edges)
    assert not breaks, "imports that break the layering rules:\n" + "\n".join(breaks)
