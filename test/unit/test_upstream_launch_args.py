"""Upstream SGLang's launch-line flags without a server: `--config` YAML, upstream's spellings of
values and flags, refusals by name, the built-in chat templates, and the defaults they bring
(max_new_tokens null, --allow-auto-truncate, generation_config.json, request and decode logs)."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from sglang.srt.entrypoints.openai.chat_templates import (
    BUILTIN_CHAT_TEMPLATES,
    named_tokenizer_template,
    resolve_chat_template,
)
from sglang.srt.entrypoints.openai.sampling_defaults import model_sampling_defaults
from sglang.srt.managers.io_struct import GenerateReqInput, SchedulerReadyInfo
from sglang.srt.managers.tokenizer.tokenizer_input import prepare_requests
from sglang.srt.server_args import ServerArgs, prepare_server_args
from sglang.test.tiny_models import TINY_LLAMA_DIR

INFO = SchedulerReadyInfo(
    max_total_num_tokens=1000, max_req_input_len=63, context_len=64, vocab_size=100, max_running_requests=8
)


def parse(*argv: str) -> ServerArgs:
    return prepare_server_args(["--model-path", TINY_LLAMA_DIR, *argv])


def test_config_file_with_command_line_override(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("port: 31000\nmax_running_requests: 4\nenable-metrics: true\ncuda_graph_bs: [1, 2]\n")
    a = parse("--config", str(cfg), "--port", "32000")
    assert (a.port, a.max_running_requests, a.enable_metrics, a.cuda_graph_bs) == (32000, 4, True, [1, 2])
    a = parse(f"--config={cfg}")
    assert a.port == 31000
    cfg.write_text("max_runing_requests: 4\n")
    with pytest.raises(SystemExit):
        parse("--config", str(cfg))
    assert "key 'max_runing_requests': unknown" in capsys.readouterr().err
    cfg.write_text("kv_cache_dtype: fp8_e4m3\n")  # upstream's flag, taken since issue 30
    assert parse("--config", str(cfg)).kv_cache_dtype == "fp8_e4m3"
    cfg.write_text("speculative_algorithm: EAGLE\n")
    with pytest.raises(SystemExit):
        parse("--config", str(cfg))
    assert "upstream flag --speculative-algorithm is not supported by this engine" in capsys.readouterr().err
    cfg.write_text("enable_metrics: 3\n")
    with pytest.raises(SystemExit):
        parse("--config", str(cfg))
    assert "is a switch" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, hint",
    [
        ("--is-embedding", "this engine serves generation only (no embedding models)"),
        ("--enable-lora", "no LoRA adapters in this engine"),
        ("--speculative-algorithm", "no speculative decoding in this engine"),
    ],
)
def test_unsupported_upstream_flags_refused_by_name(flag, hint, capsys):
    with pytest.raises(SystemExit):
        parse("--device", "cpu", flag, "x")
    assert f"upstream flag {flag} is not supported by this engine ({hint})" in capsys.readouterr().err


def test_upstream_cpu_launch_line_parses_with_notes():
    a = parse(
        *("--device", "cpu", "--host", "0.0.0.0", "--disable-overlap-schedule", "--trust-remote-code"),
        *("--enable-torch-compile", "--torch-compile-max-bs", "4", "--cuda-graph-max-bs", "8"),
        *("--cuda-graph-bs", "1", "2", "4", "--disable-custom-all-reduce", "--enable-p2p-check"),
        "--enable-cache-report",
    )
    a.validate()
    assert a.torch_compile_max_bs == 4 and a.cuda_graph_bs == [1, 2, 4]
    notes = a.compat_notes()
    for flag in ("torch-compile-max-bs", "cuda-graph-bs", "enable-p2p-check", "enable-cache-report"):
        assert any(n.startswith(f"--{flag}: ") for n in notes), flag


def test_dtype_aliases_and_dsa_cp_spellings():
    assert parse("--dtype", "float").dtype == "float32"
    assert parse("--dtype", "half", "--device", "cuda").dtype == "float16"
    a = parse(
        "--tp-size", "4", "--enable-nsa-prefill-context-parallel", "--nsa-prefill-cp-mode", "in-seq-split"
    )
    assert (a.cp_size, a.cp_strategy) == (4, "zigzag")
    a = parse(
        "--tp", "2", "--enable-dsa-prefill-context-parallel", "--dsa-prefill-cp-mode", "round-robin-split"
    )
    assert (a.cp_size, a.cp_strategy) == (2, "round-robin")
    assert any("--cp-size 2" in n for n in a.compat_notes())
    with pytest.raises(ValueError, match="--enable-dsa-prefill-context-parallel"):
        parse("--enable-dsa-prefill-context-parallel").validate()


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--tokenizer-mode", "slow"], "--tokenizer-mode slow is not supported"),
        (["--json-model-override-args", "{bad"], "--json-model-override-args is not valid JSON"),
        (["--json-model-override-args", "[1]"], "must be a JSON object"),
        (["--log-requests-level", "4"], "--log-requests-level must be in 0..3"),
        (["--decode-log-interval", "0"], "--decode-log-interval must be >= 1"),
    ],
)
def test_compat_flag_values_checked(argv, match):
    with pytest.raises(ValueError, match=match):
        parse(*argv).validate()


def test_chat_templates_builtin_file_inline_and_refused(tmp_path):
    from sglang.srt.utils.hf_transformers_utils import apply_chat_template, get_tokenizer

    tok = get_tokenizer(TINY_LLAMA_DIR)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
    ]
    expected = {
        "chatml": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
        "qwen": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi",
        "llama-2": "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nhi [/INST] hello ",
        "llama-3-instruct": "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>",
        "mistral": "[INST] Be brief.\n\nhi[/INST]hello",
        "deepseek-v3": "Be brief.<｜User｜>hi<｜Assistant｜>hello<｜end▁of▁sentence｜><｜User｜>bye<｜Assistant｜>",
    }
    for name, piece in expected.items():
        text = apply_chat_template(tok, messages, chat_template=resolve_chat_template(name))
        assert piece in text, (name, text)
    assert apply_chat_template(tok, messages[1:2], chat_template=resolve_chat_template("qwen")).startswith(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    )
    assert set(expected) <= set(BUILTIN_CHAT_TEMPLATES)
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0]['content'] }}!")
    assert resolve_chat_template(str(path)) == "{{ messages[0]['content'] }}!"
    assert resolve_chat_template("{% for m in messages %}x{% endfor %}").startswith("{%")
    assert resolve_chat_template(None) is None
    with pytest.raises(ValueError, match="--chat-template 'chatmll' is neither a built-in template name"):
        resolve_chat_template("chatmll")


def test_hf_chat_template_name_picks_a_named_template():
    class Tok:
        chat_template = {"default": "{{ 'd' }}", "tool_use": "{{ 't' }}"}

    assert named_tokenizer_template(Tok(), "tool_use") == "{{ 't' }}"
    with pytest.raises(ValueError, match="--hf-chat-template-name 'rag'.*default, tool_use"):
        named_tokenizer_template(Tok(), "rag")


class CharTokenizer:
    def encode(self, text, add_special_tokens=True):
        return [ord(c) % 100 for c in text]


def test_null_max_new_tokens_runs_to_the_context_limit():
    (req,) = prepare_requests(
        GenerateReqInput(input_ids=[1] * 40, sampling_params={"max_new_tokens": None}), None, INFO
    )
    assert req.sampling_params.max_new_tokens == 64 - 40
    (req,) = prepare_requests(GenerateReqInput(input_ids=[1] * 4, sampling_params={}), None, INFO)
    assert req.sampling_params.max_new_tokens == 60  # absent: 128, clamped to the context
    (req,) = prepare_requests(
        GenerateReqInput(input_ids=[1] * 4, sampling_params={"max_new_tokens": 10}), None, INFO
    )
    assert req.sampling_params.max_new_tokens == 10


def test_allow_auto_truncate_keeps_the_last_tokens():
    ids = list(range(1, 81))
    with pytest.raises(ValueError, match="maximum input length"):
        prepare_requests(GenerateReqInput(input_ids=ids), CharTokenizer(), INFO)
    obj = GenerateReqInput(input_ids=ids, sampling_params={"max_new_tokens": 50})
    (req,) = prepare_requests(obj, CharTokenizer(), INFO, auto_truncate=True)
    assert req.input_ids == ids[-63:]
    assert req.sampling_params.max_new_tokens == 1  # clamped to the context, not refused


def test_generation_config_sampling_defaults(tmp_path):
    from sglang.srt.entrypoints.openai.sampling_defaults import sampling_defaults

    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{TINY_LLAMA_DIR}/{name}", tmp_path / name)
    assert model_sampling_defaults(str(tmp_path)) == {}
    gen = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "do_sample": True, "eos_token_id": 2}
    (tmp_path / "generation_config.json").write_text(json.dumps(gen))
    want = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert model_sampling_defaults(str(tmp_path)) == want
    assert sampling_defaults(ServerArgs(model_path=str(tmp_path))) == want
    assert sampling_defaults(ServerArgs(model_path=str(tmp_path), sampling_defaults="openai")) == {}


def test_json_model_override_args_reach_the_hf_config():
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.server_args_compat import model_override_args

    args = parse("--json-model-override-args", '{"max_position_embeddings": 96, "rope_theta": 1234.0}')
    cfg = ModelConfig(TINY_LLAMA_DIR, dtype="float32", override_args=model_override_args(args))
    assert cfg.context_len == 96 and cfg.hf_config.rope_theta == 1234.0


def test_request_logger_levels(caplog):
    from sglang.srt.managers.tokenizer.request_log import RequestLogger

    (req,) = prepare_requests(GenerateReqInput(input_ids=[7] * 30, sampling_params={"top_k": 3}), None, INFO)
    out = {"text": "x" * 5000, "output_ids": [1, 2], "meta_info": {"finish_reason": {"type": "length"}}}
    with caplog.at_level(logging.INFO):
        RequestLogger(0).received(req)
        RequestLogger(1).received(req)
        RequestLogger(2).finished(req.rid, out)
        RequestLogger(3).finished(req.rid, out)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("Receive: ") and "prompt_tokens=30" in lines[0] and "top_k" not in lines[0]
    assert "'top_k': 3" in lines[1] and "input_ids" not in lines[1]
    assert "more characters" in lines[2] and len(lines[2]) < 2300
    assert "x" * 5000 in lines[3] and "'type': 'length'" in lines[3]


def test_decode_log_interval_counts_decode_steps():
    from types import SimpleNamespace

    from sglang.srt.managers.scheduler.scheduler_output import StepStats

    def step(num_tokens, outputs):
        item = SimpleNamespace(num_tokens=num_tokens, req=SimpleNamespace(output_ids=outputs))
        return SimpleNamespace(items=[item])

    stats = StepStats(0.0, decode_log_interval=3)
    stats.add_step(step(10, []))  # a prefill step does not count
    for _ in range(2):
        stats.add_step(step(1, [5]))
    assert not stats.due(0.0)
    stats.add_step(step(1, [5]))
    assert stats.due(0.0)
    assert not StepStats(0.0).due(1.0)  # without it: every 10 s in which a step ran


def test_refused_upstream_flags_are_not_our_flags():
    """A flag in the refusal table that a field also declares would be refused and accepted at once."""
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.server_args_cli import build_parser

    ours = {opt for action in build_parser(ServerArgs)._actions for opt in action.option_strings}
    assert not set(ServerArgs.UPSTREAM_FLAGS) & ours
