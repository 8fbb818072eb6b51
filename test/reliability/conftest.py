"""The load-and-fault suite (issue 19): real `launch_server` processes on a tiny dummy-weight
Llama, driven over HTTP by many concurrent clients, with faults injected (dropped streams, killed
ranks, a hanging forward, a frozen scheduler). The server helpers are the e2e suite's."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))  # server_helpers
