"""Served decode ITL at batch 1 and 8 and prefill tokens/s of SmolLM2: W8A8-INT8 vs bf16 vs float32.

One of our servers per mode, one after the other, each driven by `python -m sglang.bench_serving
--backend openai` (greedy, `ignore_eos`, seeded random prompts, the same for every mode):
  decode b1   4 requests of 128 in / 128 out, one at a time: median inter-token latency
  decode b8   16 requests of 128 in / 128 out, concurrency 8: median inter-token latency
  prefill     4 prompts of 2048 tokens, 1 out, one at a time: 2048 / median TTFT
Modes: `w8a8` (the W8A8 checkpoint written by write_w8a8_checkpoint.py, `--dtype` from --w8a8-dtype),
`bfloat16` and `float32` (the float checkpoint, `--dtype` that mode). Each measurement is repeated
--repeats times with new prompts (seed 1 + r) and the median kept.

    python benchmark/quant/served_dtypes.py --w8a8 DIR [--float-dir DIR] [--modes w8a8,bfloat16,float32]
    python benchmark/quant/served_dtypes.py --dummy-llama-1b     # a ~1B Llama, random weights
    python benchmark/quant/served_dtypes.py --dummy-qwen3-moe    # a Qwen3-MoE, random weights

Without --float-dir, the SmolLM2 GGUF converted to bf16 by benchmark/vs_vllm (its .work/smollm2-hf).
`--dummy-llama-1b`: a Llama of ~1.07B parameters (hidden 2048, MLP 8192, 16 layers, 32 / 8 heads,
SmolLM2's tokenizer and vocabulary) with random weights (`--load-format dummy`) in every mode, the
W8A8 server quantizing them at start-up (`--quantization w8a8_int8`). `--dummy-qwen3-moe`: the
same for a Qwen3-MoE of ~0.8B parameters, ~0.5B active per token (hidden 2048, 8 layers, 32 / 4
heads of 128, 16 routed experts of 768, top 8: `w8a8_moe_experts.py`'s shapes), where the
W8A8 server runs its routed experts on the packed int8 kernel too. `--w8a8-lm-head` (with
`--dummy-llama-1b`): the W8A8 server loads a random compressed-tensors checkpoint of the same Llama
whose LM head is int8 too (untied; `random_w8a8.py`) instead of quantizing dummy weights online.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
VS_VLLM = os.path.join(os.path.dirname(HERE), "vs_vllm")
sys.path.insert(0, VS_VLLM)

import servers  # noqa: E402  (benchmark/vs_vllm/servers.py)

DEFAULT_FLOAT_DIR = os.path.join(VS_VLLM, ".work", "smollm2-hf")  # the GGUF converted by vs_vllm
LLAMA_1B = {  # ~1.07B parameters (the embedding tied to the LM head)
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}
QWEN3_MOE = {  # ~0.8B parameters, ~0.5B active per token (the embedding tied to the LM head)
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 16,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_hidden_layers": 8,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}
DUMMIES = {"llama-1b-dummy": LLAMA_1B, "qwen3-moe-dummy": QWEN3_MOE}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)
# name, requests, input len, output len, concurrency, metric
MEASUREMENTS = (
    ("decode b1", 4, 128, 128, 1, "median_itl_ms"),
    ("decode b8", 16, 128, 128, 8, "median_itl_ms"),
    ("prefill", 4, 2048, 1, 1, "median_ttft_ms"),
)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--w8a8", help="the W8A8 checkpoint directory (compressed-tensors or w8a8_int8)")
    ap.add_argument(
        "--dummy-llama-1b", action="store_true", help="a ~1B Llama with random weights instead (see above)"
    )
    ap.add_argument(
        "--dummy-qwen3-moe", action="store_true", help="a Qwen3-MoE with random weights instead (see above)"
    )
    ap.add_argument(
        "--float-dir", default=DEFAULT_FLOAT_DIR, help="the float checkpoint (bf16 / float32 modes)"
    )
    ap.add_argument(
        "--modes", default="w8a8,bfloat16,float32", help="comma-separated subset of w8a8,bfloat16,float32"
    )
    ap.add_argument("--w8a8-dtype", default="auto", help="--dtype of the W8A8 server (its activations)")
    ap.add_argument(
        "--w8a8-lm-head", action="store_true", help="with --dummy-llama-1b: the W8A8 model's LM head in int8"
    )
    ap.add_argument("--ours-args", default="", help="extra launch_server flags for every mode")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work-dir", default=os.path.join(VS_VLLM, ".work"))
    args = ap.parse_args()
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(args.modes) - {"w8a8", "bfloat16", "float32"})
    if unknown:
        ap.error(f"--modes: unknown {unknown}; expected some of w8a8, bfloat16, float32")
    if args.float_dir == DEFAULT_FLOAT_DIR:
        from sglang.srt.model_loader.default_model import find_default_model

        servers.ensure_hf_dir(find_default_model(), args.float_dir)
    args.w8a8_args, args.float_args = [], []
    if args.dummy_llama_1b and args.dummy_qwen3_moe:
        ap.error("--dummy-llama-1b and --dummy-qwen3-moe: one model per run")
    dummy = "llama-1b-dummy" if args.dummy_llama_1b else "qwen3-moe-dummy" if args.dummy_qwen3_moe else None
    if dummy:
        args.w8a8 = args.float_dir = write_dummy(args.work_dir, args.float_dir, dummy)
        args.float_args = ["--load-format", "dummy"]
        args.w8a8_args = ["--load-format", "dummy", "--quantization", "w8a8_int8"]
        if args.w8a8_lm_head:
            args.w8a8 = w8a8_head_checkpoint(args, dummy)
            args.w8a8_args = []
    elif not args.w8a8:
        ap.error("--w8a8 DIR, --dummy-llama-1b or --dummy-qwen3-moe is required")
    if args.w8a8_lm_head and dummy != "llama-1b-dummy":
        ap.error(
            "--w8a8-lm-head: with --dummy-llama-1b only (a checkpoint: write_w8a8_checkpoint.py --lm-head)"
        )
    for flag, d in (("--w8a8", args.w8a8), ("--float-dir", args.float_dir)):
        if not os.path.isfile(os.path.join(d, "config.json")):
            ap.error(f"{flag} {d}: no config.json there")
    return args


def w8a8_head_checkpoint(args: argparse.Namespace, dummy: str) -> str:
    from random_w8a8 import write_random_w8a8  # benchmark/quant/random_w8a8.py

    with open(os.path.join(args.float_dir, "config.json")) as f:
        cfg = json.load(f)
    out = os.path.join(args.work_dir, dummy + "-w8a8-head")
    return write_random_w8a8(cfg, out, args.float_dir, TOKENIZER_FILES)


def write_dummy(work_dir: str, tokenizer_dir: str, name: str) -> str:
    """DUMMIES[name]'s config.json and the tokenizer files of `tokenizer_dir` in work_dir/name."""
    path = os.path.join(work_dir, name)
    os.makedirs(path, exist_ok=True)
    with open(tokenizer_dir + "/config.json") as f:
        vocab = json.load(f)["vocab_size"]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({**DUMMIES[name], "vocab_size": vocab}, f, indent=1)
    for name in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(tokenizer_dir, name)):
            shutil.copy(os.path.join(tokenizer_dir, name), path)
    return path


def measure(url: str, tokenizer: str, spec: tuple, repeats: int, out_file: str) -> dict:
    name, num, inp, out, conc, key = spec
    load_before = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    runs = servers.bench_serving_runs(url, tokenizer, num, inp, out, conc, out_file, repeats)
    values = [r[key] for r in runs]
    med = statistics.median(values)
    value = inp / med * 1000.0 if name == "prefill" else med
    return {"value": value, "runs": values, "metric": key, "load_before": load_before}


def run_mode(args: argparse.Namespace, mode: str, work: str) -> dict:
    model, dtype = (args.w8a8, args.w8a8_dtype) if mode == "w8a8" else (args.float_dir, mode)
    port = servers.free_port()
    extra = shlex.split(args.ours_args) + (args.w8a8_args if mode == "w8a8" else args.float_args)
    cmd = servers.ours_server_cmd(model, port, extra, dtype)
    server = servers.start_server(f"ours {mode}", cmd, port, os.path.join(work, f"server_{mode}.log"))
    out = {"model": model, "dtype": dtype}
    try:
        servers.wait_ready_ours(server)
        for spec in MEASUREMENTS:
            path = os.path.join(work, f"{mode}_{spec[0].replace(' ', '_')}.jsonl")
            out[spec[0]] = measure(server.url, model, spec, args.repeats, path)
    finally:
        servers.stop_server(server)
    return out


def table(results: dict) -> str:
    rows = [
        "| mode | decode ITL b1, ms | decode ITL b8, ms | prefill 2048, tokens/s | load before (b1 / b8 / prefill) |",
        "|---|---|---|---|---|",
    ]
    for mode, r in results["modes"].items():
        loads = " / ".join(r[s[0]]["load_before"].split(",")[0] for s in MEASUREMENTS)
        rows.append(
            f"| {mode} (`--dtype {r['dtype']}`) | {r['decode b1']['value']:.1f} | "
            f"{r['decode b8']['value']:.1f} | {r['prefill']['value']:.0f} | {loads} |"
        )
    floats = [r for m, r in results["modes"].items() if m != "w8a8"]
    if "w8a8" in results["modes"] and floats:
        w = results["modes"]["w8a8"]
        best_b1 = min(r["decode b1"]["value"] for r in floats)
        best_b8 = min(r["decode b8"]["value"] for r in floats)
        best_pf = max(r["prefill"]["value"] for r in floats)
        rows.append(
            f"| w8a8 / best float | {w['decode b1']['value'] / best_b1:.2f}× | "
            f"{w['decode b8']['value'] / best_b8:.2f}× | {w['prefill']['value'] / best_pf:.2f}× | |"
        )
    return "\n".join(rows)


def main() -> None:
    args = parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="dtypes-", dir=args.work_dir)
    results = {"cpu": servers.cpu_info(), "argv": sys.argv[1:], "modes": {}}
    for mode in args.modes:
        results["modes"][mode] = run_mode(args, mode, work)
    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(table(results))
    print(f"results: {os.path.join(work, 'results.json')}")


if __name__ == "__main__":
    main()
