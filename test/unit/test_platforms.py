"""Platform objects: names, backends, CPU memory info and no-op streams; torch_npu stays unimported."""

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
        ("cpu", "gloo"), ("cuda", "nccl"), ("npu", "hccl"),
    ]
    assert get_platform("cuda:1").device_type == "cuda"
    # attention backend served when --attention-backend is not given: the fused-kernel one on CPU
    assert [get_platform(n).default_attention_backend for n in ("cpu", "cuda", "npu")] == [
        "cpu", "torch_native", "torch_native",
    ]
    with pytest.raises(ValueError, match="unknown platform 'tpu'"):
        get_platform("tpu")


def test_cpu_platform():
    p = CpuPlatform()
    assert p.device(3) == torch.device("cpu") and p.device_count() == 1 and CpuPlatform.is_available()
    p.set_device(0)
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
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
