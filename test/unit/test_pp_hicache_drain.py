"""A later pipeline stage stopped by SIGTERM (how servers stop) first replays every TIERS message it
has received (`hicache_ring.StageHiCache.sigterm_drains`): a SIGTERM that lands while a replay
runs waits for its end; the ones queued behind it are replayed too; then the stage exits with
status 0. Real parts: the pipeline inbox, `StageTiers` over a `FileStorage` directory, a real
SIGTERM to this process (the test runs in the main thread, where Python delivers signals)."""

from __future__ import annotations

import os
import signal
import threading
import time
from types import SimpleNamespace

import pytest

from sglang.srt.distributed.p2p import Message
from sglang.srt.distributed.pp_comm import Inbox
from sglang.srt.managers.pp.hicache_ring import StageHiCache, Terminated
from sglang.srt.managers.pp.messages import MsgType
from sglang.srt.mem_cache.hicache.file_storage import FileStorage
from sglang.srt.mem_cache.hicache.pipeline import ClearStorage, StageTiers


class SlowStorage(FileStorage):
    """A file store whose `clear` (the op replayed here) takes a while and is counted."""

    def __init__(self, *args, started: threading.Event, **kwargs):
        super().__init__(*args, **kwargs)
        self.cleared = 0
        self.started = started

    def clear(self) -> int:
        self.started.set()
        time.sleep(0.4)
        self.cleared += 1
        return super().clear()


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals: main thread")
def test_sigterm_mid_replay_replays_every_received_tiers_then_exits(tmp_path):
    started = threading.Event()
    storage = SlowStorage(str(tmp_path), "ns", 16, started=started)
    inbox = Inbox()
    stage = StageHiCache(StageTiers(None, storage), SimpleNamespace(inbox=inbox), is_last=True)
    for i in range(3):
        inbox.put(Message(MsgType.TIERS, -1, [ClearStorage()]))

    def terminate_mid_replay() -> None:
        started.wait(5)
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=terminate_mid_replay)
    killer.start()
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as exit_info:
        with stage.sigterm_drains():
            while True:  # the stage loop: take the next message, handle it
                stage.handle(inbox.take(StageHiCache.KINDS))
    killer.join()
    assert exit_info.value.code == 0
    assert storage.cleared == 3  # the one cut into, and the two queued behind it
    assert inbox.take(MsgType.TIERS, block=False) is None
    assert signal.getsignal(signal.SIGTERM) is previous  # the handler is scoped to the loop


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals: main thread")
def test_tiers_still_arriving_after_the_sigterm_are_replayed(tmp_path):
    """A TIERS message the receiver thread puts in the inbox after the SIGTERM (it was still being
    read when the signal came) is replayed within the drain's grace; then the stage exits."""
    storage = SlowStorage(str(tmp_path), "ns", 16, started=threading.Event())
    inbox = Inbox()
    stage = StageHiCache(StageTiers(None, storage), SimpleNamespace(inbox=inbox), is_last=True)
    late = threading.Timer(0.3, lambda: inbox.put(Message(MsgType.TIERS, -1, [ClearStorage()])))
    timer = threading.Timer(0.1, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.start()
    late.start()
    with pytest.raises(Terminated):
        with stage.sigterm_drains():
            stage.handle(inbox.take(StageHiCache.KINDS))  # blocks: nothing queued yet
    late.join()
    assert storage.cleared == 1


def test_sigterm_while_waiting_exits_after_the_grace(tmp_path):
    storage = SlowStorage(str(tmp_path), "ns", 16, started=threading.Event())
    inbox = Inbox()
    stage = StageHiCache(StageTiers(None, storage), SimpleNamespace(inbox=inbox), is_last=True)
    timer = threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.start()
    with pytest.raises(Terminated):
        with stage.sigterm_drains():
            stage.handle(inbox.take(StageHiCache.KINDS))  # blocks: nothing queued
    assert storage.cleared == 0  # after the drain's grace (nothing came), no replay
