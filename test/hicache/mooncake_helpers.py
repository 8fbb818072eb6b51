"""A real `mooncake_master` for the HiCache mooncake tests: started on free ports of 127.0.0.1,
killed at teardown; and a store client in the test process that lends the store its memory (the
"store service"), so pages outlive the engines that wrote them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from sglang.srt.distributed.init import get_free_port
from sglang.srt.mem_cache.hicache.mooncake_config import MooncakeConfig
from sglang.srt.mem_cache.hicache.mooncake_storage import connect_store

MASTER_BIN = Path(sys.executable).with_name("mooncake_master")
LEASE_MS = 200  # the master's read lease: a page read is removable this long after


def free_port() -> int:
    return get_free_port()


class MooncakeMaster:
    def __init__(self, log_dir: Path):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        log = open(log_dir / f"mooncake_master_{self.port}.log", "w")
        self.proc = subprocess.Popen(
            [
                str(MASTER_BIN),
                f"--rpc_port={self.port}",
                "--rpc_address=127.0.0.1",
                f"--metrics_port={free_port()}",
                "--enable_metric_reporting=false",
                "--rpc_thread_num=2",
                f"--default_kv_lease_ttl={LEASE_MS}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "GLOG_minloglevel": "1"},
        )
        log.close()
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"mooncake_master did not start (see {log_dir})") from None
                time.sleep(0.05)

    def config(self, segment: int = 0, **kw) -> MooncakeConfig:
        return MooncakeConfig(self.address, local_hostname="127.0.0.1", global_segment_size=segment, **kw)

    def extra_config(self, page_tokens: int = 8) -> str:
        """The engines' --hicache-storage-backend-extra-config: no memory of their own lent."""
        return json.dumps(
            {
                "master_server_address": self.address,
                "local_hostname": "127.0.0.1",
                "global_segment_size": 0,
                "page_tokens": page_tokens,
            }
        )

    def store_service(self, segment: int = 64 << 20):
        """A client lending `segment` bytes to the store (close it before `kill`)."""
        return connect_store(self.config(segment), 16 << 20)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
