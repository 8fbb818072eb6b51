"""This server's PD role, as the processes outside the scheduler ask about it: the tokenizer
manager (do requests carry bootstrap fields; is the health probe a self-contained PD request) and
the entrypoint (does the main process run the bootstrap server).

From the flags only: importing it loads no transfer backend and nothing of the scheduler (whose
side is `factory.create_disaggregation`, the component it holds).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DisaggregationRole:
    mode: str = "null"  # --disaggregation-mode: "null", "prefill" or "decode" (messages name it)
    transfer_backend: str = "mooncake"  # --disaggregation-transfer-backend

    @classmethod
    def of(cls, server_args) -> "DisaggregationRole":
        return cls(server_args.disaggregation_mode, server_args.disaggregation_transfer_backend)

    @property
    def enabled(self) -> bool:
        """A prefill or decode server: every request carries bootstrap fields."""
        return self.mode != "null"

    def runs_bootstrap_server(self) -> bool:
        """A prefill server whose transfer backend moves KV: its ranks register at a bootstrap
        server in its main process (the fake backend's rooms need none)."""
        if self.mode != "prefill":
            return False
        from sglang.srt.disaggregation.factory import BACKENDS  # the backends load only on a prefill server

        return BACKENDS[self.transfer_backend]().moves_kv
