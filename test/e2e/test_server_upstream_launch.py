"""Upstream SGLang's launch lines and defaults against a real server (tiny Llama, dummy float32
weights, a copy of its directory with a generation_config.json): `--config` with a command-line
override, upstream's CPU launch line and its start-up notes, `--chat-template chatml` as the
prompt the tokenizer sees (`--log-requests-level 3`), chat without `max_tokens` running to the
context limit, generation_config.json's sampling defaults, `--decode-log-interval`; and the
refusals at start-up (an upstream flag not supported here, a bogus chat template name)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys

import httpx
import pytest

from server_helpers import REPO, TINY_LLAMA, launch_server

pytestmark = pytest.mark.slow  # starts its own server and three failing launches

CONTEXT = 256
CHATML_PROMPT = "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
CPU_LAUNCH_LINE = ("--device", "cpu", "--enable-torch-compile", "--torch-compile-max-bs", "4")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama-genconfig")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{TINY_LLAMA}/{name}", path / name)
    # top_k 1: sampling that does not set top_k itself is greedy under --sampling-defaults model
    (path / "generation_config.json").write_text('{"top_k": 1, "eos_token_id": 2}')
    return str(path)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    config = tmp_path_factory.mktemp("config") / "server.yaml"
    # the command line's --context-length overrides the file's
    config.write_text(
        "context_length: 64\nchat-template: chatml\nlog_requests: true\nlog-requests-level: 3\n"
        "disable_custom_all_reduce: true\n"
    )
    handle = launch_server(
        (
            "--config",
            str(config),
            "--context-length",
            str(CONTEXT),
            "--log-level",
            "info",
            "--decode-log-interval",
            "4",
            *CPU_LAUNCH_LINE,
        ),
        model=model_dir,
    )
    yield handle
    handle.stop()


def _chat(server, **body) -> dict:
    body = {"model": "default", "messages": [{"role": "user", "content": "hi there"}], **body}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _logged_prompts(server) -> list[list[int]]:
    full = open(server.log_path, errors="replace").read()
    return [ast.literal_eval(m) for m in re.findall(r"Receive: .*?input_ids=(\[[0-9, ]*\])", full)]


def test_upstream_cpu_line_and_config_notes_logged(server):
    log = open(server.log_path, errors="replace").read()
    for flag in ("--enable-torch-compile: ", "--torch-compile-max-bs: ", "--disable-custom-all-reduce: "):
        assert flag in log, log[-3000:]


def test_chat_template_chatml_is_the_prompt_the_tokenizer_sees(server):
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    out = _chat(server, max_tokens=2, temperature=0)
    expected = get_tokenizer(TINY_LLAMA).encode(CHATML_PROMPT, add_special_tokens=False)
    assert out["usage"]["prompt_tokens"] == len(expected)
    assert list(expected) in _logged_prompts(server)


def test_chat_without_max_tokens_runs_to_the_context_limit(server):
    """No max_tokens: to EOS or the context limit (upstream), past /generate's 128; the config
    file's context length (64) lost to the command line's (256)."""
    out = _chat(server, temperature=0, ignore_eos=True)
    usage = out["usage"]
    assert out["choices"][0]["finish_reason"] == "length"
    assert usage["prompt_tokens"] + usage["completion_tokens"] == CONTEXT
    assert usage["completion_tokens"] > 128
    # /generate keeps upstream's 128 when max_new_tokens is absent
    r = httpx.post(
        f"{server.url}/generate",
        json={"text": "hello", "sampling_params": {"temperature": 0, "ignore_eos": True}},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == 128


def test_generation_config_defaults_make_sampling_greedy(server):
    """generation_config.json's top_k 1 applies when the request sets no top_k: temperature 1
    with different seeds gives the greedy text; with top_k -1 in the request it does not."""
    greedy = _chat(server, max_tokens=12, temperature=0, ignore_eos=True)["choices"][0]["message"]["content"]
    sampled = {
        _chat(server, max_tokens=12, temperature=1.0, seed=s, ignore_eos=True)["choices"][0]["message"][
            "content"
        ]
        for s in (1, 2, 3)
    }
    assert sampled == {greedy}
    free = {
        _chat(server, max_tokens=12, temperature=1.0, top_k=-1, seed=s, ignore_eos=True)["choices"][0][
            "message"
        ]["content"]
        for s in (1, 2, 3)
    }
    assert len(free) > 1


def test_decode_log_interval_logs_throughput(server):
    _chat(server, max_tokens=16, temperature=0, ignore_eos=True)
    log = open(server.log_path, errors="replace").read()
    assert re.search(r"steps \d+, prefill [0-9.]+ tok/s, decode [0-9.]+ tok/s", log), log[-3000:]


def _launch_fails(*args: str) -> str:
    dummy_model = ("--model-path", TINY_LLAMA, "--load-format", "dummy")
    out = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", *dummy_model, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(REPO),
    )
    assert out.returncode == 2, out.stdout + out.stderr
    return out.stderr


def test_upstream_flag_refused_by_name():
    err = _launch_fails(*CPU_LAUNCH_LINE, "--speculative-algorithm", "EAGLE")
    hint = "(no speculative decoding in this engine)"
    assert f"upstream flag --speculative-algorithm is not supported by this engine {hint}" in err
    assert "unrecognized arguments" not in err
    err = _launch_fails("--max-runing-requests", "4")
    assert "unrecognized arguments: --max-runing-requests 4 (did you mean --max-running-requests?)" in err


def test_bogus_chat_template_refused_at_startup():
    err = _launch_fails("--chat-template", "no-such-template")
    assert "--chat-template 'no-such-template' is neither a built-in template name" in err
