"""PortArgs: the ZMQ endpoints between the processes of one server."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import Any


@dataclass
class PortArgs:
    """ZMQ endpoints between the processes of one server (ipc:// files in a private temp dir).

    With attention DP (`--dp-size D --enable-dp-attention`) the data-parallel controller binds
    `scheduler_input_ipc_name` (the tokenizer's target, unchanged), each replica's entry rank binds
    `replica_input_ipc_name(d)` and sends its control replies and load reports to
    `dp_controller_ipc_name`; token ids still go straight to the detokenizer."""

    tokenizer_ipc_name: str
    scheduler_input_ipc_name: str
    detokenizer_ipc_name: str
    dp_controller_ipc_name: str = ""

    @staticmethod
    def init_new(server_args: Any = None) -> "PortArgs":
        """Fresh endpoints in a new private directory (`server_args`: unused, upstream's signature)."""
        base = tempfile.mkdtemp(prefix="sglang-ipc-")
        return PortArgs(
            tokenizer_ipc_name=f"ipc://{base}/tokenizer",
            scheduler_input_ipc_name=f"ipc://{base}/scheduler",
            detokenizer_ipc_name=f"ipc://{base}/detokenizer",
            dp_controller_ipc_name=f"ipc://{base}/dp_controller",
        )

    def replica_input_ipc_name(self, dp_rank: int, dp_size: int) -> str:
        """Where replica `dp_rank`'s entry rank takes its messages (the tokenizer's target when
        there is one replica)."""
        return (
            self.scheduler_input_ipc_name if dp_size == 1 else f"{self.scheduler_input_ipc_name}-dp{dp_rank}"
        )

    def control_reply_ipc_name(self, dp_size: int) -> str:
        """Where scheduler entry ranks send control replies: the tokenizer, or the DP controller."""
        return self.tokenizer_ipc_name if dp_size == 1 else self.dp_controller_ipc_name
