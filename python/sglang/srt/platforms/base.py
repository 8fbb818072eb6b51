"""The `Platform` interface: everything that differs between CPU, CUDA and Ascend NPU.

Layers, runners and the distributed runtime ask a Platform object instead of checking
`torch.cuda` / `torch_npu` themselves. Accelerator platforms share `AcceleratorPlatform`, which
drives the device module torch registers for them (`torch.cuda`, `torch.npu`).
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Optional

import torch


class NullStream:
    """Stand-in stream for devices without streams (CPU): every operation is a no-op."""

    def synchronize(self) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Optional["NullEvent"] = None) -> "NullEvent":
        return event if event is not None else NullEvent()


class NullEvent:
    """Stand-in event: always complete."""

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class Platform:
    """A device family. Subclasses set `name`, `device_type` and `dist_backend`."""

    name: str = "base"
    device_type: str = "cpu"
    dist_backend: str = "gloo"
    # Auto dynamic chunking keeps chunk sizes (and so prefixes) multiples of this: the tile of
    # the platform's prefill attention kernel, so no chunk ends in a part-filled tile.
    prefill_chunk_alignment: int = 64
    # ... and never plans a chunk (but the last) below this: the kernel's smallest efficient query block.
    prefill_min_chunk: int = 1
    # The attention backend served when `--attention-backend` is not given (layers/attention/registry.py).
    default_attention_backend: str = "torch_native"
    # The implementation of the DSA ops (sgl_kernel_npu: lightning indexer, sparse flash attention)
    # the `dsa` attention backend runs when --nsa-prefill/decode-backend is auto.
    dsa_ops_impl: str = "reference"

    @classmethod
    def is_available(cls) -> bool:
        raise NotImplementedError

    def device_count(self) -> int:
        raise NotImplementedError

    def device(self, local_rank: int = 0) -> torch.device:
        """The torch device a rank with this node-local index uses."""
        raise NotImplementedError

    def set_device(self, local_rank: int = 0) -> None:
        """Make `device(local_rank)` the current device of this process."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait for all queued work on the current device."""
        raise NotImplementedError

    def memory_info(self, local_rank: int = 0) -> tuple[int, int]:
        """(free_bytes, total_bytes) of the memory the KV cache and weights live in."""
        raise NotImplementedError

    # streams / events (no-ops where a device has none)
    def current_stream(self) -> Any:
        raise NotImplementedError

    def new_stream(self) -> Any:
        raise NotImplementedError

    def stream(self, stream: Any) -> ContextManager:
        """Context manager making `stream` current."""
        raise NotImplementedError

    def new_event(self, enable_timing: bool = False) -> Any:
        raise NotImplementedError

    def configure_process(self) -> None:
        """Process-wide tuning for a process that runs a model (called once by ModelRunner)."""

    def prepacked_linear(self, dtype: torch.dtype, device: torch.device) -> Optional[tuple[Any, Any]]:
        """(pack(weight) -> packed, kernel(x2d, packed, bias) -> y) for a packed-weight linear
        of this dtype, or None (plain F.linear). See layers/linear_prepack.py."""
        return None

    def fused_kernels(self) -> Optional[Any]:
        """The module of fused kernels for this platform (signatures and torch references in
        kernels/cpu/reference.py), or None: callers keep their torch implementations. Looked up
        through `sglang.srt.kernels.dispatch`, which caches the answer per device type."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device_type={self.device_type!r}, dist_backend={self.dist_backend!r})"


class AcceleratorPlatform(Platform):
    """A platform whose device module follows the `torch.cuda` API (`torch.cuda`, `torch.npu`)."""

    def module(self) -> Any:
        """The torch device module (imports any plugin it needs)."""
        raise NotImplementedError

    def device_count(self) -> int:
        return int(self.module().device_count())

    def device(self, local_rank: int = 0) -> torch.device:
        count = self.device_count()
        if count == 0:
            raise RuntimeError(f"no {self.device_type} device is visible")
        return torch.device(self.device_type, local_rank % count)

    def set_device(self, local_rank: int = 0) -> None:
        self.module().set_device(self.device(local_rank))

    def synchronize(self) -> None:
        self.module().synchronize()

    def memory_info(self, local_rank: int = 0) -> tuple[int, int]:
        free, total = self.module().mem_get_info(self.device(local_rank))
        return int(free), int(total)

    def current_stream(self) -> Any:
        return self.module().current_stream()

    def new_stream(self) -> Any:
        return self.module().Stream()

    def stream(self, stream: Any) -> ContextManager:
        return self.module().stream(stream)

    def new_event(self, enable_timing: bool = False) -> Any:
        return self.module().Event(enable_timing=enable_timing)


def null_stream_context(stream: Any = None) -> ContextManager:
    return contextlib.nullcontext(stream)
