"""Platform objects: names, backends, CPU memory info and no-op streams; torch_npu stays unimported.

The accelerator choices (backend from --device, the node-local device set before anything is
allocated, the KV pool sized from the device's free memory) are checked against a stand-in device
module in place of `torch.cuda` / `torch.npu`: this machine has no GPU or NPU."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from sglang.srt.platforms import CpuPlatform, current_platform, get_platform
from sglang.srt.platforms.cpu import read_meminfo


def test_get_platform_names_and_backends():
    assert [(get_platform(n).device_type, get_platform(n).dist_backend) for n in ("cpu", "cuda", "npu")] == [
        ("cpu", "gloo"),
        ("cuda", "nccl"),
        ("npu", "hccl"),
    ]
    assert get_platform("cuda:1").device_type == "cuda"
    # attention backend served when --attention-backend is not given: the fused-kernel one on CPU
    assert [get_platform(n).default_attention_backend for n in ("cpu", "cuda", "npu")] == [
        "cpu",
        "torch_native",
        "torch_native",
    ]
    with pytest.raises(ValueError, match="unknown platform 'tpu'"):
        get_platform("tpu")


def test_cpu_platform():
    p = CpuPlatform()
    assert p.device(3) == torch.device("cpu") and p.device_count() == 1 and CpuPlatform.is_available()
    p.set_device(0)
    assert p.current_device() == torch.device("cpu")
    assert p.memory_shared_by_local_ranks and p.default_mem_fraction_static(1) is None
    p.synchronize()
    free, total = p.memory_info()
    assert 0 < free <= total
    s = p.new_stream()
    with p.stream(s):
        ev = p.new_event()
        ev.record()
        s.wait_event(ev)
    assert ev.query() and p.current_stream() is not None


def test_current_platform_on_this_machine():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert current_platform().device_type in (expected, "npu")


def test_read_meminfo_parses_and_falls_back(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    400 kB\n")
    assert read_meminfo(str(f)) == (400 * 1024, 1000 * 1024)
    free, total = read_meminfo(str(tmp_path / "missing"))  # sysconf fallback
    assert 0 < free <= total


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="torch_npu installed")
def test_importing_platforms_does_not_import_torch_npu():
    code = "import sys, sglang.srt.platforms as p; p.get_platform('npu'); p.current_platform(); print('torch_npu' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "False"


# ---------------------------------------------------------------------------- accelerator ranks
# A stand-in for torch.cuda / torch.npu (we have no GPU or NPU here): devices with their own
# free memory, a current device, and a log of every call in order.
GIB = 2**30


class StandInDeviceModule:
    def __init__(self, count: int, free_gib: list[float], total_gib: float = 80.0):
        self.count, self.free, self.total = count, [int(f * GIB) for f in free_gib], int(total_gib * GIB)
        self.current = 0
        self.calls: list[tuple] = []

    def device_count(self) -> int:
        return self.count

    def set_device(self, device) -> None:
        self.calls.append(("set_device", torch.device(device)))
        self.current = torch.device(device).index

    def current_device(self) -> int:
        return self.current

    def mem_get_info(self, device=None):
        index = self.current if device is None else torch.device(device).index
        self.calls.append(("mem_get_info", index))
        return self.free[index], self.total

    def synchronize(self) -> None:
        pass


@pytest.fixture
def stand_in(monkeypatch):
    """CudaPlatform and NpuPlatform driving one stand-in module; torch itself sees no accelerator,
    and loading fused kernels is recorded (accelerators have none yet)."""
    from sglang.srt.platforms import CudaPlatform, NpuPlatform

    module = StandInDeviceModule(count=8, free_gib=[70, 60, 50, 40, 30, 20, 10, 5])
    for cls in (CudaPlatform, NpuPlatform):
        monkeypatch.setattr(cls, "module", lambda self: module)
        monkeypatch.setattr(cls, "is_available", classmethod(lambda cls: True))
        monkeypatch.setattr(cls, "fused_kernels", lambda self: module.calls.append(("fused_kernels",)))
    return module


# (torch.device("npu") exists only once torch_npu has registered it, so the ranks bound here are
# CUDA ones; NpuPlatform shares their code in AcceleratorPlatform, its backend is checked above.)
@pytest.mark.parametrize("device, backend", [("cpu", "gloo"), ("cuda", "nccl")])
def test_backend_follows_device_flag_not_visible_accelerators(stand_in, device, backend):
    """--device picks the backend, whatever is visible: the stand-in makes both CUDA and NPU
    'available', and a --device cpu rank still uses gloo on the CPU."""
    from sglang.srt.platforms.rank_device import bind_rank

    assert current_platform().device_type == "npu"  # what the old code took the backend from
    rank = bind_rank(device, world_rank=0, world_size=2)
    assert rank.dist_backend == backend and rank.device.type == device
    if device == "cpu":
        assert stand_in.calls == []  # a CPU rank touches no accelerator


def test_local_rank_not_global_rank_picks_the_device():
    from sglang.srt.platforms.rank_device import local_rank_of, ranks_per_node

    assert [local_rank_of(r, 16, nnodes=2) for r in range(16)] == list(range(8)) * 2
    assert [local_rank_of(r, 4) for r in range(4)] == [0, 1, 2, 3] and ranks_per_node(16, 2) == 8
    with pytest.raises(ValueError, match="multiple of --nnodes"):
        local_rank_of(0, 6, nnodes=4)
    with pytest.raises(ValueError, match="out of range"):
        local_rank_of(16, 16, nnodes=2)


def test_bind_rank_sets_the_local_device_first_and_loads_kernels(stand_in):
    """Rank 13 of a 2-node x 8-device world: device 5 of its node is made current before anything
    else touches the device, then the platform's kernels load (before the rank reports ready)."""
    from sglang.srt.platforms.rank_device import bind_rank

    rank = bind_rank("cuda", world_rank=13, world_size=16, nnodes=2)
    assert (rank.local_rank, rank.local_world_size, rank.device) == (5, 8, torch.device("cuda", 5))
    assert stand_in.calls == [("set_device", torch.device("cuda", 5)), ("fused_kernels",)]
    assert rank.platform.memory_info() == (20 * GIB, 80 * GIB)  # device 5's memory, not device 0's


def test_more_local_ranks_than_devices_is_a_clear_error(stand_in):
    from sglang.srt.platforms.rank_device import bind_rank

    stand_in.count = 2
    with pytest.raises(ValueError, match="local rank 2 needs npu device 2, but this node has 2 visible"):
        bind_rank("npu", world_rank=2, world_size=4)
    assert stand_in.calls == []


def test_init_rank_distributed_binds_before_joining_with_the_platform_backend(stand_in, monkeypatch):
    """distributed/init.py: the device is bound (set_device) before torch.distributed is joined,
    with --device's backend, and the groups live on the rank's device."""
    from sglang.srt.distributed import init as dist_init
    from sglang.srt.distributed.parallel_layout import ParallelLayout
    from sglang.srt.distributed.parallel_state import ParallelGroups

    joined, built = [], []
    monkeypatch.setattr(
        dist_init, "init_distributed", lambda *a: (joined.append(a), stand_in.calls.append(("join",)))
    )
    monkeypatch.setattr(ParallelGroups, "build", staticmethod(lambda *a: built.append(a) or "groups"))
    layout = ParallelLayout(tp=4)
    assert dist_init.init_rank_distributed(layout, 3, "cuda", "127.0.0.1:1234", 60, nnodes=1) == "groups"
    assert stand_in.calls == [("set_device", torch.device("cuda", 3)), ("fused_kernels",), ("join",)]
    assert joined == [(4, 3, "127.0.0.1:1234", "nccl", 60)]
    assert built == [(layout, 3, "nccl", torch.device("cuda", 3))]
    # one rank: no torch.distributed, but the device is still bound
    stand_in.calls.clear()
    single = dist_init.init_rank_distributed(ParallelLayout(), 0, "cuda", None)
    assert single.world.device == torch.device("cuda", 0) and stand_in.calls[0] == (
        "set_device",
        torch.device("cuda", 0),
    )


def test_default_mem_fraction_is_upstreams_on_accelerators_only():
    assert [get_platform("cuda").default_mem_fraction_static(tp) for tp in (1, 2, 4, 8, 16)] == [
        0.88,
        0.87,
        0.85,
        0.81,
        0.79,
    ]
    assert get_platform("npu").default_mem_fraction_static(1) == 0.88
    assert get_platform("cpu").default_mem_fraction_static(1) is None


def _args(**kw):
    from types import SimpleNamespace

    base = dict(page_size=1, max_total_tokens=None, mem_fraction_static=None, max_running_requests=None)
    return SimpleNamespace(**{**base, **kw})


def test_kv_pool_from_the_rank_device_free_memory(stand_in):
    """The pool is sized from the rank's own device (mem_get_info of the current device) with
    upstream's formula: pool = free_after_load - free_before_load x (1 - f)."""
    from types import SimpleNamespace

    from sglang.srt.model_executor.memory_budget import MemoryReading, plan_kv_pool
    from sglang.srt.platforms.rank_device import bind_rank

    rank = bind_rank("cuda", world_rank=1, world_size=2)
    before = rank.platform.memory_info()[0]  # device 1: 60 GiB free
    stand_in.free[1] -= 10 * GIB  # the weights take 10 GiB of device 1
    stand_in.free[0] -= 50 * GIB  # device 0 is busy: must not matter
    memory = MemoryReading.after_load(rank.platform, before, local_ranks=2, tp_size=2)
    assert memory == MemoryReading(60 * GIB, 50 * GIB, sharers=1, default_fraction=0.87)
    cell = 2**20  # 1 MiB per token
    cfg = SimpleNamespace(context_len=4096)
    # --mem-fraction-static 0.9: 50 - 60 x 0.1 = 44 GiB of pool
    assert plan_kv_pool(_args(mem_fraction_static=0.9), cfg, cell, memory).max_total_tokens == 44 * 1024
    # no flag: upstream's default for tp 2 (0.87): 50 - 60 x 0.13 = 42.2 GiB
    assert plan_kv_pool(_args(), cfg, cell, memory).max_total_tokens == int((50 - 60 * 0.13) * 1024)
    # page-aligned, and --max-total-tokens wins
    assert (
        plan_kv_pool(_args(page_size=64, mem_fraction_static=0.9), cfg, 3 * 2**20, memory).max_total_tokens
        % 64
        == 0
    )
    assert plan_kv_pool(_args(max_total_tokens=1000), cfg, cell, memory).max_total_tokens == 1000
    # a fraction that leaves nothing after the weights: a clear error naming the flags
    with pytest.raises(ValueError, match="no memory left for the KV pool.*--mem-fraction-static"):
        plan_kv_pool(_args(mem_fraction_static=0.1), cfg, cell, memory)


def test_cpu_ranks_of_one_host_split_its_memory(monkeypatch):
    """On CPU the ranks of a host share its RAM: each takes its share of the budget, and without
    --mem-fraction-static the pool holds a few full contexts (at most a quarter of the RAM)."""
    from types import SimpleNamespace

    from sglang.srt.model_executor.memory_budget import MemoryReading, plan_kv_pool

    cpu = CpuPlatform()
    monkeypatch.setattr(CpuPlatform, "memory_info", lambda self: (18 * GIB, 32 * GIB))
    memory = MemoryReading.after_load(cpu, 20 * GIB, local_ranks=4, tp_size=4)
    assert memory == MemoryReading(20 * GIB, 18 * GIB, sharers=4, default_fraction=None)
    cell = 2**20
    # f = 0.5: (18 - 20 x 0.5) / 4 ranks = 2 GiB each
    assert (
        plan_kv_pool(
            _args(mem_fraction_static=0.5), SimpleNamespace(context_len=4096), cell, memory
        ).max_total_tokens
        == 2048
    )
    # default: min(4 contexts, a quarter of this rank's share of the available RAM)
    assert plan_kv_pool(_args(), SimpleNamespace(context_len=256), cell, memory).max_total_tokens == 4 * 256
    assert plan_kv_pool(_args(), SimpleNamespace(context_len=10**6), cell, memory).max_total_tokens == int(
        18 * 1024 / 4 / 4
    )
