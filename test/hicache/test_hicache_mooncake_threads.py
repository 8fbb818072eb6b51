"""The `mooncake` backend called from several threads at once (the scheduler and the prefetch I/O
thread), against a real `mooncake_master`: a backend whose first setup failed is set up once
however many threads find it without a client, and `close` waits for the store calls in flight
before it closes the client. The real client is wrapped to widen the race windows (a slow setup, a
slow read) and to record the order of calls."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("mooncake.store")  # the `pd` extra

from mooncake_helpers import MooncakeMaster  # noqa: E402

from sglang.srt.mem_cache.hicache import mooncake_storage  # noqa: E402
from sglang.srt.mem_cache.hicache.mooncake_storage import MooncakeStorage, connect_store  # noqa: E402

PAGE = 8


@pytest.fixture(scope="module")
def master(tmp_path_factory):
    m = MooncakeMaster(tmp_path_factory.mktemp("mooncake-threads"))
    service = m.store_service()
    yield m
    service.close()
    m.kill()


class SlowClient:
    """The real client; `get` takes `get_delay_s` longer, and the calls' ends and `close` are logged."""

    def __init__(self, store, log: list, get_delay_s: float = 0.0):
        self.store, self.log, self.get_delay_s = store, log, get_delay_s

    def __getattr__(self, name):
        return getattr(self.store, name)

    def get(self, key):
        time.sleep(self.get_delay_s)
        out = self.store.get(key)
        self.log.append("get done")
        return out

    def close(self):
        self.log.append("close")
        self.store.close()


def test_a_client_is_set_up_once_however_many_threads_need_it(master):
    made: list = []
    lock = threading.Lock()

    def connect(config, size):
        with lock:
            made.append(None)
            first = len(made) == 1
        if first:
            raise RuntimeError("first setup fails")  # the backend starts without a client
        time.sleep(0.2)  # a slow setup: every thread below arrives while it runs
        return connect_store(config, size)

    st = MooncakeStorage(master.config(retry_interval_s=0.2), "once", PAGE, page_bytes=512, connect=connect)
    assert len(made) == 1 and st.stats.unreachable == 1
    time.sleep(0.3)  # past the retry interval
    names = st.page_hashes(list(range(64)), 8)
    answers: list = []
    threads = [threading.Thread(target=lambda n=n: answers.append(st.exists(n))) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert answers == [False] * len(names)  # plain misses
    assert len(made) == 2, f"{len(made) - 1} setups after the failed one"  # one client, not one per thread
    assert st.stats.unreachable == 1
    st.close()


def test_close_waits_for_the_calls_in_flight(master):
    log: list = []
    st = MooncakeStorage(
        master.config(),
        "close",
        PAGE,
        page_bytes=512,
        connect=lambda config, size: SlowClient(connect_store(config, size), log, get_delay_s=0.5),
    )
    name = st.page_hashes(list(range(8)), 1)[0]
    assert st.put(name, b"x" * 300)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(st.get(name)))
    reader.start()
    time.sleep(0.1)  # the read is in flight
    st.close()
    reader.join(30)
    assert got == [b"x" * 300] and log == ["get done", "close"]
    assert st.get(name) is None and not st.exists(name)  # closed: every call a miss, no client used
    assert log == ["get done", "close"]


def test_reads_racing_a_flapping_master_return_right_pages_or_misses(master, monkeypatch):
    """Reader threads while the master's probe flaps (as a master dropping out and coming back
    looks; probed at every call here): every read is the page written or a miss, nothing raises,
    one client is set up."""
    monkeypatch.setattr(mooncake_storage, "PROBE_INTERVAL_S", 0.0)
    made: list = []

    def connect(config, size):
        made.append(None)
        return connect_store(config, size)

    state = {"up": True, "calls": 0}

    def probe(config):
        state["calls"] += 1
        return state["up"]

    st = MooncakeStorage(
        master.config(retry_interval_s=0.01), "flap", PAGE, page_bytes=512, connect=connect, probe=probe
    )
    names = st.page_hashes(list(range(200, 264)), 8)
    payloads = {n: bytes([i + 1]) * 400 for i, n in enumerate(names)}
    assert st.put_many(names, [payloads[n] for n in names]) == len(names)
    errors: list = []
    wrong: list = []
    stop = time.monotonic() + 1.5

    def reader():
        try:
            while time.monotonic() < stop:
                for got, n in zip(st.get_run(names), names):
                    if got != payloads[n]:
                        wrong.append(n)
                for n in names[:2]:
                    got = st.get(n)
                    if got is not None and got != payloads[n]:
                        wrong.append(n)
                st.exists_many(names)
        except Exception as e:  # noqa: BLE001 - the test reports any
            errors.append(repr(e))

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    while time.monotonic() < stop:
        state["up"] = not state["up"]
        time.sleep(0.02)
    for t in threads:
        t.join(30)
    state["up"] = True
    assert not errors and not wrong
    assert len(made) == 1  # the client stays; only the probe flapped
    assert st.stats.unreachable > 0  # the flaps were seen
    time.sleep(0.05)
    assert st.get_run(names) == [payloads[n] for n in names]  # all readable once the master is back
    st.close()
