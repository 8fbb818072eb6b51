"""What a PD server's self-contained requests carry: a bootstrap host that means "no peer" (the
request runs with the fake backend: warm-up, /health_generate). The messages between ranks are
the backends' (base/messages.py, mooncake/messages.py)."""

from __future__ import annotations

import dataclasses
import random

# A bootstrap host that means "no peer": the request runs with the fake backend (warm-up, health).
FAKE_BOOTSTRAP_HOST = "2.2.2.2"


def fake_bootstrap(obj):
    """A copy of a single GenerateReqInput that a PD server serves on its own (fake backend)."""
    params = dict(obj.sampling_params or {})
    params["max_new_tokens"] = max(2, params.get("max_new_tokens") or 0)  # the decode side runs a step too
    return dataclasses.replace(
        obj,
        bootstrap_host=FAKE_BOOTSTRAP_HOST,
        bootstrap_port=None,
        bootstrap_room=random.getrandbits(62),
        sampling_params=params,
    )
