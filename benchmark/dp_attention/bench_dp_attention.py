"""DP attention vs plain TP on 2 ranks: KV capacity, serving where KV is (and is not) the
bottleneck, and the extra collectives per layer (docs/dp_attention.md).

The model: a dummy (random-weight) DeepSeek-V3 (MLA + MoE) sized for a small CPU machine, 8 layers
(the first dense), hidden 1024, 16 heads, q-LoRA 384, kv-LoRA 256 + rope 64 (one 320-value latent
row per token and layer), 16 routed experts (top 4) + 1 shared, served in bfloat16 (the CPU
default), one torch thread per rank. Configurations, both on 2 ranks:
- `tp2`: `--tp-size 2` (attention heads over 2 ranks; MLA's latent KV, one head, is stored whole on
  both ranks, so both hold every request's KV);
- `dp2`: `--tp-size 2 --dp-size 2 --enable-dp-attention` (each rank is a replica with its own
  requests and KV; dense MLPs and experts stay sharded over both ranks).

Parts (`--parts`, default all):
- `capacity`: `max_total_num_tokens` of the server (summed over replicas) at the same
  `--mem-fraction-static`, read from /get_server_info;
- `serving`: `python -m sglang.bench_serving` (random dataset, fixed lengths) against a server
  with the same per-rank KV pool (`--max-total-tokens`): a KV-bound run (concurrency high enough
  that tp2's pool holds only part of the requests) and a light one; output tok/s and TTFT P99;
- `collectives`: the model alone on 2 spawned ranks, one decode step of `--decode-batch` (16)
  requests in total (dp2: half per replica), every collective timed and its bytes counted, per
  layer; then one lone 256-token prefill (dp2: one replica prefills, the other runs IDLE).

    python benchmark/dp_attention/bench_dp_attention.py [--parts capacity serving collectives]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

import httpx
from tqdm import tqdm

from sglang.srt.utils.network import get_free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENIZER_DIR = os.path.join(REPO, "python", "sglang", "test", "assets", "tiny-deepseek-v32")
SHAPE = dict(
    architectures=["DeepseekV3ForCausalLM"],
    model_type="deepseek_v3",
    vocab_size=4096,
    hidden_size=1024,
    intermediate_size=2048,
    moe_intermediate_size=256,
    num_hidden_layers=8,
    first_k_dense_replace=1,
    num_attention_heads=16,
    num_key_value_heads=16,
    q_lora_rank=384,
    kv_lora_rank=256,
    qk_nope_head_dim=64,
    qk_rope_head_dim=64,
    v_head_dim=64,
    n_routed_experts=16,
    num_experts_per_tok=4,
    n_group=1,
    topk_group=1,
    n_shared_experts=1,
    routed_scaling_factor=1.0,
    norm_topk_prob=True,
    hidden_act="silu",
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=8192,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    torch_dtype="bfloat16",
)
CONFIGS = {"tp2": ("--tp-size", "2"), "dp2": ("--tp-size", "2", "--dp-size", "2", "--enable-dp-attention")}


def write_model(root: str) -> str:
    path = os.path.join(root, "deepseek-v3-dp-bench")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(SHAPE, f)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZER_DIR, name), path)
    return path


# ---------------------------------------------------------------------------- servers
class Server:
    def __init__(self, model: str, extra: tuple[str, ...], port: int, log_dir: str):
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(os.path.join(log_dir, f"server-{port}.log"), "w")
        cmd = [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            model,
            "--load-format",
            "dummy",
            "--port",
            str(port),
            "--num-threads",
            "1",
            "--log-level",
            "warning",
            *extra,
        ]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}); see {self.log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"server not healthy in 600 s; see {self.log.name}")

    def states(self) -> list[dict]:
        return httpx.get(self.url + "/get_server_info", timeout=60).json()["internal_states"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def capacity(model: str, log_dir: str, mem_fraction: float) -> dict:
    out = {}
    for name in tqdm(CONFIGS, desc="capacity"):
        server = Server(
            model, CONFIGS[name] + ("--mem-fraction-static", str(mem_fraction)), get_free_port(), log_dir
        )
        try:
            states = server.states()
            out[name] = {
                "per_replica": [s["max_total_num_tokens"] for s in states],
                "server": sum(s["max_total_num_tokens"] for s in states),
            }
        finally:
            server.stop()
    out["ratio"] = out["dp2"]["server"] / out["tp2"]["server"]
    return out


def serving(model: str, log_dir: str, pool: int, workloads: dict) -> dict:
    out: dict = defaultdict(dict)
    for name in CONFIGS:
        server = Server(model, CONFIGS[name] + ("--max-total-tokens", str(pool)), get_free_port(), log_dir)
        try:
            for wl, (n, conc, inp, outp) in tqdm(workloads.items(), desc=f"serving {name}"):
                result = os.path.join(log_dir, f"bench-{name}-{wl}.jsonl")
                cmd = [
                    sys.executable,
                    "-m",
                    "sglang.bench_serving",
                    "--backend",
                    "sglang",
                    "--base-url",
                    server.url,
                    "--tokenizer",
                    model,
                    "--dataset-name",
                    "random",
                    "--num-prompts",
                    str(n),
                    "--random-input-len",
                    str(inp),
                    "--random-output-len",
                    str(outp),
                    "--random-range-ratio",
                    "1.0",
                    "--max-concurrency",
                    str(conc),
                    "--flush-cache",
                    "--output-file",
                    result,
                    "--disable-tqdm",
                ]
                subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
                with open(result) as f:
                    row = json.loads(f.readlines()[-1])
                out[wl][name] = {
                    k: row[k] for k in ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms")
                }
                out[wl][name]["num_retractions"] = sum(s["num_retractions"] for s in server.states())
        finally:
            server.stop()
    for wl in workloads:
        out[wl]["throughput_ratio"] = (
            out[wl]["dp2"]["output_throughput"] / out[wl]["tp2"]["output_throughput"]
        )
    return dict(out)


# ---------------------------------------------------------------------------- collectives
def _time_collectives(coordinator: type) -> dict:
    """Wrap the coordinator's collectives (groups of 2+ ranks) with timers: op:group -> [calls, bytes, seconds]."""
    stats: dict = defaultdict(lambda: [0, 0, 0.0])
    for op in ("all_reduce", "all_gather", "broadcast"):
        orig = getattr(coordinator, op)

        def timed(self, tensor, *a, __orig=orig, __op=op, **kw):
            if self.size == 1:
                return __orig(self, tensor, *a, **kw)
            t0 = time.perf_counter()
            res = __orig(self, tensor, *a, **kw)
            s = stats[f"{__op}:{self.name}"]
            s[0] += 1
            s[1] += tensor.numel() * tensor.element_size()
            s[2] += time.perf_counter() - t0
            return res

        setattr(coordinator, op, timed)
    return stats


def _collective_rank(rank: int, name: str, model: str, port: int, steps: int, batch: int, q) -> None:
    import torch

    torch.set_num_threads(1)
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed.group_coordinator import GroupCoordinator
    from sglang.srt.distributed.init import init_distributed
    from sglang.srt.distributed.parallel_layout import ParallelLayout
    from sglang.srt.distributed.parallel_state import ParallelGroups
    from sglang.srt.model_executor.forward_batch import DPForwardInfo
    from sglang.srt.model_loader.dummy_loader import init_dummy_weights
    from sglang.srt.models.registry import ModelRegistry
    from sglang.test.forward_helpers import ForwardHarness

    init_distributed(2, rank, f"127.0.0.1:{port}", "gloo")
    layout = ParallelLayout(tp=2, attn_dp=2) if name == "dp2" else ParallelLayout(tp=2)
    groups = ParallelGroups.build(layout, rank)
    stats = _time_collectives(GroupCoordinator)
    cfg = ModelConfig(model).hf_config
    net = ModelRegistry.resolve(cfg.architectures)(cfg, groups, torch.bfloat16).eval()
    init_dummy_weights(net, seed=1)
    h = ForwardHarness(cfg, torch.bfloat16, max_total_tokens=8192, max_requests=32, max_context_len=512)
    h.token_to_kv_pool = net.create_kv_pool(8192, 1, torch.bfloat16)
    per_replica = batch // layout.attn_dp
    reqs = [h.new_request() for _ in range(per_replica)]
    dp = (
        DPForwardInfo(groups.dp_rank, (per_replica,) * layout.attn_dp, (per_replica,) * layout.attn_dp)
        if layout.attn_dp > 1
        else None
    )
    prefill = h.build_batch([(r, list(range(3, 3 + 128))) for r in reqs])
    prefill.dp = (
        None if dp is None else DPForwardInfo(dp.replica, (128 * per_replica,) * 2, (per_replica,) * 2)
    )
    h.run(net, prefill)
    stats.clear()
    t0 = time.perf_counter()
    for _ in range(steps):
        batch = h.build_batch([(r, [5]) for r in reqs])
        batch.dp = dp
        h.run(net, batch)
    total = time.perf_counter() - t0
    ops = {k: [v[0] / steps, v[1] / steps, 1000 * v[2] / steps] for k, v in stats.items()}
    # one new 256-token prompt while nothing else runs (light load): under dp2 one replica prefills
    # it with all heads on its rank while the other runs an IDLE forward; under tp2 both ranks share it
    prefill_s = []
    for _ in range(3):
        if layout.attn_dp == 1 or groups.dp_rank == 0:
            one = h.build_batch([(h.new_request(), list(range(3, 3 + 256)))])
        else:
            one = None
        info = DPForwardInfo(groups.dp_rank, (256, 0), (1, 0)) if layout.attn_dp > 1 else None
        if one is None:
            one = h.idle_batch(info)
        one.dp = info
        t1 = time.perf_counter()
        h.run(net, one)
        prefill_s.append(time.perf_counter() - t1)
    q.put(
        (
            rank,
            {
                "step_ms": 1000 * total / steps,
                "layers": cfg.num_hidden_layers,
                "prefill_256_ms": 1000 * sorted(prefill_s)[1],
                "ops": ops,
            },
        )
    )


def collectives(model: str, steps: int, batch: int) -> dict:
    ctx = mp.get_context("spawn")
    out = {}
    for name in tqdm(CONFIGS, desc="collectives"):
        q = ctx.Queue()
        port = get_free_port()
        procs = [
            ctx.Process(target=_collective_rank, args=(r, name, model, port, steps, batch, q))
            for r in range(2)
        ]
        for p in procs:
            p.start()
        results = dict(q.get(timeout=1200) for _ in procs)
        for p in procs:
            p.join(60)
        out[name] = results[0]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", nargs="+", default=["capacity", "serving", "collectives"])
    ap.add_argument("--mem-fraction-static", type=float, default=0.2)
    ap.add_argument("--pool", type=int, default=4096, help="KV tokens per rank for the serving runs")
    ap.add_argument("--steps", type=int, default=20, help="decode steps timed for the collectives")
    ap.add_argument(
        "--decode-batch", type=int, default=16, help="requests in the collectives' decode step (all replicas)"
    )
    ap.add_argument("--workloads", nargs="+", default=["kv_bound", "light"], help="serving workloads to run")
    ap.add_argument(
        "--rounds", type=int, default=1, help="serving: alternate tp2 / dp2 servers this many times"
    )
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="dp-bench-")
    model = write_model(root)
    results: dict = {"shape": SHAPE}
    if "capacity" in args.parts:
        results["capacity"] = capacity(model, root, args.mem_fraction_static)
    if "serving" in args.parts:
        # (prompts, concurrency, input len, output len): 32 requests of 512 tokens each at 16 in flight
        # need 8192 KV tokens; a 4096-token pool per rank holds 8 of them under tp2, 16 under dp2
        workloads = {"kv_bound": (32, 16, 256, 256), "light": (8, 2, 256, 128)}
        workloads = {k: v for k, v in workloads.items() if k in args.workloads}
        rounds = [serving(model, root, args.pool, workloads) for _ in range(args.rounds)]
        results["serving"] = rounds[0] if len(rounds) == 1 else {"rounds": rounds}
    if "collectives" in args.parts:
        results["collectives"] = collectives(model, args.steps, args.decode_batch)
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
