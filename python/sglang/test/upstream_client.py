"""Upstream SGLang's own client package, installed beside ours to judge our server's compatibility.

Upstream's PyPI package is also named `sglang`, so its client cannot be imported in the interpreter
that imports ours. It is installed with `pip install --no-deps --target DIR` (by default
`<venv>/upstream-client`, inside the git-ignored venv) together with the few client-side modules
that `import sglang` needs and our venv lacks; the rest (torch, transformers, numpy, requests,
aiohttp, ...) comes from our venv. A client program then runs with our venv's python and
`PYTHONPATH=DIR`: PYTHONPATH comes before the site-packages `.pth` entry through which our editable
install is found, so `import sglang` is upstream's (`run_client` checks it).

`python -m sglang.test.upstream_client install [--target DIR]` installs it (`make setup` runs this);
`python -m sglang.test.upstream_client run SCRIPT [ARGS...]` runs a program with it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

UPSTREAM_VERSION = "0.5.23"
# What `import sglang as sgl; sgl.RuntimeEndpoint` imports beyond our venv (found by importing it on
# a CPU-only venv until nothing was missing); pinned to the versions that test ran with.
CLIENT_DEPS = (
    "psutil==7.2.2",
    "pybase64==1.5.1",
    "msgspec==0.22.0",
    "ipython==9.18.1",  # sglang.utils imports IPython.display
    "traitlets==5.16.1",
)
STAMP_NAME = ".upstream-sglang-version"


def default_dir() -> Path:
    """`<venv>/upstream-client` of the interpreter running this (the venv is git-ignored)."""
    return Path(sys.prefix) / "upstream-client"


def is_installed(target: Optional[Path] = None) -> bool:
    stamp = Path(target or default_dir()) / STAMP_NAME
    return stamp.is_file() and stamp.read_text().strip() == UPSTREAM_VERSION


def install(target: Optional[Path] = None, python: str = sys.executable) -> Path:
    """Install upstream's client into `target` (replacing what is there), atomically: a half
    install is never left under the final name."""
    target = Path(target or default_dir()).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".upstream-client-", dir=target.parent))
    try:
        cmd = [python, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp)]
        subprocess.run([*cmd, f"sglang=={UPSTREAM_VERSION}", *CLIENT_DEPS], check=True)
        (tmp / STAMP_NAME).write_text(UPSTREAM_VERSION + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def ensure_installed(target: Optional[Path] = None) -> Path:
    target = Path(target or default_dir())
    return target if is_installed(target) else install(target)


def client_env(target: Optional[Path] = None, base: Optional[dict] = None) -> dict:
    """Environment for a client program: PYTHONPATH is the client directory alone (ours removed)."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = str(Path(target or default_dir()).resolve())
    env.pop("PYTHONHOME", None)
    return env


def run_client(
    script: str,
    args: Sequence[str] = (),
    target: Optional[Path] = None,
    timeout: Optional[float] = 300.0,
    capture: bool = True,
) -> subprocess.CompletedProcess:
    """Run `script` with our venv's python and upstream's client first on the path (its stdout and
    stderr captured, as text, unless `capture` is false). Fails when `sglang` would not be the
    client's (found without importing it)."""
    target = Path(target or default_dir()).resolve()
    env = client_env(target)
    probe = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; print(u.find_spec('sglang').origin)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tempfile.gettempdir(),
    )
    where = probe.stdout.strip()
    if probe.returncode != 0 or not Path(where).resolve().is_relative_to(target):
        raise RuntimeError(f"upstream's client is not the imported sglang ({where!r}): {probe.stderr}")
    return subprocess.run(
        [sys.executable, script, *args], env=env, capture_output=capture, text=True, timeout=timeout
    )


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_install = sub.add_parser("install", help=f"install sglang=={UPSTREAM_VERSION}'s client")
    p_install.add_argument("--target", type=Path, default=None)
    p_run = sub.add_parser("run", help="run a client program with upstream's sglang")
    p_run.add_argument("--target", type=Path, default=None)
    p_run.add_argument("script")
    p_run.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.cmd == "install":
        print(install(args.target))
        return 0
    return run_client(args.script, args.args, args.target, timeout=None, capture=False).returncode


if __name__ == "__main__":
    sys.exit(main())
