"""Model-loading progress bars (model_loader/progress.py): shown on a terminal only, and never made
with tqdm's default multiprocessing lock, whose named semaphore a rank process ended by its parent
leaves behind (the resource tracker's "leaked semaphore" warning at every server exit)."""

import io
import multiprocessing.synchronize as mp_sync
import subprocess
import sys

import pytest

from sglang.srt.model_loader import progress as progress_mod


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def semlocks(monkeypatch):
    made = []
    original = mp_sync.SemLock.__init__

    def record(self, *args, **kwargs):
        made.append(type(self).__name__)
        original(self, *args, **kwargs)

    monkeypatch.setattr(mp_sync.SemLock, "__init__", record)
    return made


def test_no_terminal_no_bar_and_no_semaphore(monkeypatch, semlocks):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    items = [1, 2, 3]
    assert progress_mod.progress(items, "weights") is items
    assert semlocks == []


def test_terminal_bar_counts_with_a_thread_lock(monkeypatch, semlocks):
    from tqdm import tqdm

    monkeypatch.setattr(tqdm, "_lock", None, raising=False)
    err = _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    bar = progress_mod.progress(range(4), "weights", unit="file")
    assert list(bar) == [0, 1, 2, 3]
    assert semlocks == []
    assert "weights" in err.getvalue() and "4/4" in err.getvalue()


def test_a_server_exit_reports_no_leaked_semaphore(tmp_path):
    """A child that loads with a bar and is terminated by its parent: no tracker warning."""
    done = tmp_path / "loaded"
    code = (
        "import multiprocessing as mp, os, sys, time\n"
        "def child(flag):\n"
        "    from sglang.srt.model_loader.progress import progress\n"
        "    list(progress(range(3), 'weights'))\n"
        "    open(flag, 'w').close()\n"
        "    time.sleep(120)\n"
        "if __name__ == '__main__':\n"
        "    p = mp.get_context('spawn').Process(target=child, args=(sys.argv[1],)); p.start()\n"
        "    while not os.path.exists(sys.argv[1]) and p.is_alive(): time.sleep(0.1)\n"
        "    p.terminate(); p.join()\n"
    )
    script = tmp_path / "server.py"  # spawn re-imports the main module: a file, not -c
    script.write_text(code)
    out = subprocess.run(
        [sys.executable, str(script), str(done)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and done.exists(), out.stderr[-2000:]
    assert "leaked semaphore" not in out.stderr
