"""The bootstrap service's two ends, as the transfer backends and the server entry use them.

A prefill server runs one bootstrap server (in its main process); each prefill rank registers its
`PrefillRankInfo` there, and a decode rank looks the prefill ranks up and checks that the server
lives (its heartbeat). `disaggregation/bootstrap.py` implements both over HTTP (upstream's
protocol); a backend receives its client through `KVManagerArgs`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional

from sglang.srt.disaggregation.base.messages import PrefillRankInfo, PrefillTopology


class BaseKVBootstrapServer(ABC):
    """Where one prefill server's ranks register (served from a background thread)."""

    @abstractmethod
    def start(self) -> "BaseKVBootstrapServer": ...

    @abstractmethod
    def close(self) -> None: ...


class BaseBootstrapClient(ABC):
    """The calls a transfer backend makes to a bootstrap server at `url`."""

    @abstractmethod
    def register_rank(self, url: str, info: PrefillRankInfo) -> None:
        """Register a prefill rank (retried while the server starts); RuntimeError when refused."""

    @abstractmethod
    def query_topology(self, url: str) -> Optional[PrefillTopology]:
        """The prefill server's ranks; None while not all of them registered or while the server
        cannot be reached."""

    @abstractmethod
    def is_alive(self, url: str) -> bool:
        """Whether the bootstrap server answers (the decode side's heartbeat)."""
