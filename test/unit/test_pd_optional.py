"""PD is an optional part of an install: where mooncake's transfer engine cannot be loaded (the
package absent, or libibverbs.so.1 missing), a PD server refuses at start-up, before any process
starts, with one error line naming the command that fixes it; other servers are unaffected."""

from __future__ import annotations

import sys

import pytest

from sglang.launch_server import main as launch_server_main
from sglang.srt.disaggregation.mooncake.data_plane import PACKAGES_FIX, SYSTEM_FIX
from sglang.srt.entrypoints.cli import server_args_from_argv
from sglang.test.tiny_models import TINY_LLAMA_DIR

PD_ARGV = ["--model-path", TINY_LLAMA_DIR, "--load-format", "dummy", "--disaggregation-mode", "prefill"]


@pytest.fixture
def no_mooncake(monkeypatch):
    monkeypatch.setitem(sys.modules, "mooncake", None)  # `import mooncake...` -> ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "mooncake.engine", raising=False)


@pytest.fixture
def no_libibverbs(monkeypatch, tmp_path):
    pkg = tmp_path / "mooncake"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        'raise ImportError("libibverbs.so.1: cannot open shared object file: No such file or directory")\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mooncake", raising=False)
    monkeypatch.delitem(sys.modules, "mooncake.engine", raising=False)


def test_pd_without_mooncake_names_the_install_command(no_mooncake):
    with pytest.raises(RuntimeError) as err:
        server_args_from_argv(PD_ARGV)
    assert PACKAGES_FIX in str(err.value) and "make setup-pd" in str(err.value)
    server_args_from_argv(PD_ARGV[:4])  # not a PD server: mooncake is not needed


def test_pd_without_libibverbs_names_the_apt_command(no_libibverbs, capsys):
    assert launch_server_main(PD_ARGV) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: PD disaggregation") and SYSTEM_FIX in err and "libibverbs.so.1" in err
    assert "Traceback" not in err
