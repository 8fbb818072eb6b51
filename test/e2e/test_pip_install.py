"""`pip install -e .` into an existing environment gives a working package: a fresh virtualenv that
reuses this environment's installed dependencies (torch, transformers ...: a `.pth` line naming its
site-packages, whose own `.pth` files, the editable sglang and sgl-kernel-npu among them, are not
read), the checkout installed editable with `--no-deps`, then `import sglang` and a tiny generate
through `sgl.Engine` with no sgl_kernel_npu importable (its torch fallbacks)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a virtualenv, a pip install and an engine

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import importlib.util, sys
import sglang as sgl
from sglang.test.tiny_models import TINY_LLAMA_DIR

assert sglang_file_prefix in sgl.__file__, sgl.__file__
assert importlib.util.find_spec("sgl_kernel_npu") is None, "sgl_kernel_npu must not be importable here"
if __name__ == "__main__":
    engine = sgl.Engine(model_path=TINY_LLAMA_DIR, load_format="dummy", dtype="float32", log_level="warning")
    out = engine.generate("Hello", {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True})
    engine.shutdown()
    assert len(out["output_ids"]) == 4, out
    print("GENERATED", out["output_ids"])
"""


def test_pip_install_editable_in_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    py = venv / "bin" / "python"
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # after the venv's own site-packages: this environment's packages (pip, setuptools, torch ...)
    Path(site, "zz_reuse_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["SGLANG_BUILD_CPU_KERNELS"] = "0"  # the torch code; compiling is setup.py's own test
    install = subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", str(REPO)],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    script = f"sglang_file_prefix = {str(REPO / 'python')!r}\n" + SCRIPT
    run = subprocess.run(
        [py, "-c", script], capture_output=True, text=True, env=env, timeout=180, cwd=str(tmp_path)
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "GENERATED" in run.stdout
