"""Request-field checks of the request path that `tokenizer_input.prepare_requests` does not do:
the bootstrap fields of a request (`bootstrap_host`, `bootstrap_port`, `bootstrap_room`, each a
value or, for a batch, a list with one entry per prompt: what sglang-router adds for PD
disaggregation). Checked in the tokenizer process against this server's PD role
(`DisaggregationRole`), so that bad ones get an HTTP 400 instead of reaching the scheduler; a
normal server ignores them.
"""

from __future__ import annotations

import numbers
from typing import Any, Optional

from sglang.srt.disaggregation.role import DisaggregationRole

MAX_ROOM = 2**63 - 1


def _pick(value: Any, i: int, batch: bool) -> Any:
    return value[i] if batch and isinstance(value, list) else value


def bootstrap_of(obj, i: int) -> tuple[Optional[str], Optional[int], Optional[int]]:
    """(host, port, room) of prompt `i` of a GenerateReqInput."""
    batch = not obj.is_single
    return (
        _pick(obj.bootstrap_host, i, batch),
        _pick(obj.bootstrap_port, i, batch),
        _pick(obj.bootstrap_room, i, batch),
    )


def check_bootstrap(obj, role: DisaggregationRole, num_prepared: int) -> None:
    """ValueError for a request this server's PD role cannot take."""
    given = any(v is not None for v in (obj.bootstrap_host, obj.bootstrap_room))
    if not role.enabled:
        return  # a normal server ignores bootstrap fields (a router may send them anyway)
    if not given:
        raise ValueError(
            f"this server runs --disaggregation-mode {role.mode}: a request needs bootstrap_host, bootstrap_port and "
            "bootstrap_room (send it through sglang-router --pd-disaggregation)"
        )
    if num_prepared != obj.batch_size:
        raise ValueError("n > 1 is not supported with PD disaggregation (send n separate requests)")
    for name in ("bootstrap_host", "bootstrap_port", "bootstrap_room"):
        value = getattr(obj, name)
        if isinstance(value, list) and (obj.is_single or len(value) != obj.batch_size):
            raise ValueError(f"'{name}' must have one entry per prompt ({obj.batch_size})")
    for i in range(obj.batch_size):
        host, port, room = bootstrap_of(obj, i)
        if not isinstance(host, str) or not host:
            raise ValueError("'bootstrap_host' must be a host name or address")
        if port is not None and (
            not isinstance(port, numbers.Integral) or isinstance(port, bool) or not 0 < port < 65536
        ):
            raise ValueError("'bootstrap_port' must be an integer in 1..65535")
        if not isinstance(room, numbers.Integral) or isinstance(room, bool) or not 0 <= room <= MAX_ROOM:
            raise ValueError(f"'bootstrap_room' must be an integer in [0, {MAX_ROOM}]")
