"""The `Platform` interface: everything that differs between CPU, CUDA and Ascend NPU.

Layers, runners and the distributed runtime ask a Platform object instead of checking
`torch.cuda` / `torch_npu` themselves. Accelerator platforms share `AcceleratorPlatform`, which
drives the device module torch registers for them (`torch.cuda`, `torch.npu`).
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Optional

import torch

from sglang.srt.platforms import launch_defaults

from sglang.srt.platforms.kernel_table import KernelTable


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
    """A device family. Subclasses set `name`, `device_type` and `dist_backend`. An object holds the
    state of its process on that device (`platforms.get_platform` keeps one per process): the
    kernel table and, where the platform has one, the `--dtype auto` choice."""

    name: str = "base"
    device_type: str = "cpu"
    dist_backend: str = "gloo"
    # Auto dynamic chunking keeps chunk sizes (and so prefixes) multiples of this: the tile of
    # the platform's prefill attention kernel, so no chunk ends in a part-filled tile.
    prefill_chunk_alignment: int = 64
    # ... and never plans a chunk (but the last) below this: the kernel's smallest efficient query block.
    prefill_min_chunk: int = 1
    # The attention backend served when `--attention-backend` is not given (layers/attention/registry.py).
    default_attention_backend: str = launch_defaults.ATTENTION_BACKEND_DEFAULTS["cuda"]
    # Whether the local ranks of a node draw on one memory (CPU: host RAM), so that the KV pool
    # budget is split between them; accelerator ranks each own a device.
    memory_shared_by_local_ranks: bool = False
    # The implementation of the DSA ops (sgl_kernel_npu: lightning indexer, sparse flash attention)
    # the `dsa` attention backend runs when --nsa-prefill/decode-backend is auto.
    dsa_ops_impl: str = "reference"
    # LM head logits in float32 unless --disable-fp32-lm-head (upstream: only with --enable-fp32-lm-head)
    float32_logits_by_default: bool = False
    # a bf16 model's residual stream in float32 unless --disable-fp32-residual (layers/layernorm.py)
    float32_residual_by_default: bool = False
    # CP: prompts without a cached prefix below this many new tokens are not split (--cp-min-split-tokens);
    # upstream's static split makes TTFT 15-21 % worse below 4K tokens on GPUs (sglang#37944)
    cp_min_split_tokens: int = 4096
    # HiCache: host <-> device copies run on a copy stream, ordered by events, from pinned host
    # memory (accelerators), or block the calling thread (CPU: both tiers are RAM)
    async_copies: bool = False

    def __init__(self) -> None:
        # the fused kernel build and prefill dtypes, looked up once (kernel_dispatch.py asks them)
        self.kernels = KernelTable(self)

    @classmethod
    def is_available(cls) -> bool:
        raise NotImplementedError

    def device_count(self) -> int:
        raise NotImplementedError

    def device(self, local_rank: int = 0) -> torch.device:
        """The torch device a rank with this node-local index uses (the node-local rank, never
        the global one: rank 9 of a 2 x 8 world is device 1 of its node)."""
        raise NotImplementedError

    def set_device(self, local_rank: int = 0) -> None:
        """Make `device(local_rank)` the current device of this process (before it allocates
        anything on the device)."""
        raise NotImplementedError

    def current_device(self) -> torch.device:
        """This process's current device (the one `set_device` chose)."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait for all queued work on the current device."""
        raise NotImplementedError

    def memory_info(self) -> tuple[int, int]:
        """(free_bytes, total_bytes) of the memory the KV cache and weights live in, on the
        current device."""
        raise NotImplementedError

    def default_mem_fraction_static(self, tp_size: int) -> Optional[float]:
        """`--mem-fraction-static` when the flag is not given, or None: size the pool by the
        platform's own rule (model_executor/memory_budget.py)."""
        return None

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

    def zeros(self, shape: tuple[int, ...], dtype: torch.dtype, device: Any) -> torch.Tensor:
        """A zero buffer for a long-lived pool (the KV cache) on `device`."""
        return torch.zeros(shape, dtype=dtype, device=device)

    def host_zeros(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A zero host buffer for a long-lived tier that copies to and from this device (HiCache's
        host pool)."""
        return torch.zeros(shape, dtype=dtype)

    def page_populator(self) -> Optional[Any]:
        """`populate(tensor, first_byte, nbytes) -> bool` committing pool pages ahead of their first
        write where pools are lazily committed host memory (mem_cache/kv_warm.py), else None."""
        return None

    def configure_process(self) -> None:
        """Process-wide tuning for a process that runs a model (called once by ModelRunner)."""

    def resolve_auto_dtype(self, hf_config: Any = None) -> torch.dtype:
        """`--dtype auto`: the half type the model config names (float16 / bfloat16), else bfloat16."""
        cfg_dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
        if isinstance(cfg_dtype, str):
            cfg_dtype = {"float16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16}.get(
                cfg_dtype
            )
        return cfg_dtype if cfg_dtype in (torch.float16, torch.bfloat16) else torch.bfloat16

    def use_explicit_dtype(self, dtype: torch.dtype) -> None:
        """An explicit `--dtype`: the model runs in it as given (no earlier auto choice applies)."""

    def prepacked_linear(self, dtype: torch.dtype, device: torch.device) -> Optional[tuple[Any, Any]]:
        """(pack(weight) -> packed, kernel(x2d, packed, bias) -> y) for a packed-weight linear
        of this dtype, or None (plain F.linear). See layers/linear_prepack.py."""
        return None

    def prefill_attention_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype prefill attention computes in for q / k / v of `dtype` (default: their own)."""
        return dtype

    def default_chunked_prefill_size(self) -> int:
        """`--chunked-prefill-size` when not given: most prompt tokens of one request per step
        (the table in launch_defaults.py, which ServerArgs reads without importing torch)."""
        return launch_defaults.default_chunked_prefill_size(self.device_type)

    def release_freed_memory(self) -> None:
        """Hand memory freed while loading back to the system (no-op where the allocator does)."""

    def bf16_vec_kernels(self) -> Optional[Any]:
        """The fused kernel module where bf16 linears and decode attention's scores run on bf16 dot
        products (`vdpbf16ps`) rather than oneDNN / float32 FMAs, else None. Asked once, through
        `self.kernels.bf16_vec()`."""
        return None

    def bf16_fma_kernels(self) -> Optional[Any]:
        """The fused kernel module whose bf16 linears widen bf16 weights to float32 in registers and
        run float32 FMAs, where that beats the device's own bf16 linear (CPUs without bf16 dot
        products), else None. Asked once, through `self.kernels.bf16_fma()`."""
        return None

    def amx_linear_kernels(self) -> Optional[Any]:
        """The fused kernel module where its bf16 linears run AMX tiles here (`bf16_linear`,
        `bf16_linear_f32out`), else None. Asked once, through `self.kernels.amx_linears()`."""
        return None

    def w8a8_linear(self) -> Optional[Any]:
        """The device's own W8A8-INT8 linear (platforms/accel_quant.py: (x, weight int8 [N, K],
        weight_scale [N, 1], bias) -> out, or None for shapes it cannot take), or None: the torch
        path (`int8_mm_op` or the exact blockwise GEMM). Asked once, through `self.kernels`."""
        return None

    def fp8_block_linear(self) -> Optional[Any]:
        """The device's own FP8 block linear (platforms/accel_fp8.py: (x, weight fp8 [N, K],
        scale_inv, block, bias) -> out, or None for shapes it cannot take), or None: the layers'
        tiled widening. Asked once, through `self.kernels`."""
        return None

    def check_quantization(self, method: Optional[str]) -> None:
        """A quantization method this platform cannot run (`fp8`, `w8a8_int8`, or None): refused
        with a ValueError naming it, before the model is built; nothing here."""

    def int8_linear_entry(self, ops: Any) -> Any:
        """Which W8A8 linear of the fused kernel module `ops` serves this platform (its `int8_linear`
        unless the platform knows better, e.g. the CPU's VNNI copy)."""
        return ops.int8_linear

    def fused_kernels(self) -> Optional[Any]:
        """The module of fused kernels for this platform (signatures and torch references in
        kernels/cpu/reference.py), or None: callers keep their torch implementations. Looked up
        once per platform object through `self.kernels` (platforms/kernel_dispatch.py)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device_type={self.device_type!r}, dist_backend={self.dist_backend!r})"


class AcceleratorPlatform(Platform):
    """A platform whose device module follows the `torch.cuda` API (`torch.cuda`, `torch.npu`)."""

    async_copies = True

    def host_zeros(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Pinned (page-locked) host memory: copies to and from the device run asynchronously."""
        return torch.zeros(shape, dtype=dtype, pin_memory=True)

    def module(self) -> Any:
        """The torch device module (imports any plugin it needs)."""
        raise NotImplementedError

    def device_count(self) -> int:
        return int(self.module().device_count())

    def device(self, local_rank: int = 0) -> torch.device:
        count = self.device_count()
        if count == 0:
            raise RuntimeError(f"no {self.device_type} device is visible")
        if not 0 <= local_rank < count:
            raise ValueError(
                f"local rank {local_rank} needs {self.device_type} device {local_rank}, but this node has "
                f"{count} visible; run at most {count} ranks per node (--tp-size x --pp-size / --nnodes)"
            )
        return torch.device(self.device_type, local_rank)

    def set_device(self, local_rank: int = 0) -> None:
        self.module().set_device(self.device(local_rank))

    def current_device(self) -> torch.device:
        return torch.device(self.device_type, int(self.module().current_device()))

    def synchronize(self) -> None:
        self.module().synchronize()

    def memory_info(self) -> tuple[int, int]:
        free, total = self.module().mem_get_info(self.current_device())
        return int(free), int(total)

    def default_mem_fraction_static(self, tp_size: int) -> Optional[float]:
        """Upstream SGLang's choice when the flag is not given (its earlier, size-free rule): the
        more tp ranks, the more each keeps back for communication buffers."""
        for at_least, fraction in ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87)):
            if tp_size >= at_least:
                return fraction
        return 0.88

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
