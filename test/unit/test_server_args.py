"""ServerArgs: every flag is declared once with its help, group and choices; `--help` shows them
with the default; upstream spellings and compatibility flags are accepted and explained."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys

import pytest

from sglang.srt.configs.startup_checks import flag_choices
from sglang.srt.entrypoints.cli import check_server_args
from sglang.srt.server_args import (
    GROUP_ORDER,
    G_COMPAT,
    VALUE_ALIASES,
    ServerArgs,
    field_choices,
    prepare_server_args,
)
from sglang.test.tiny_models import TINY_LLAMA_DIR


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@pytest.mark.parametrize("f", dataclasses.fields(ServerArgs), ids=lambda f: f.name)
def test_every_field_has_one_line_of_help_and_a_group(f):
    help_text = f.metadata.get("help")
    assert help_text and help_text.strip() == help_text, f"{f.name}: no help"
    assert "\n" not in help_text and len(help_text) < 240, f"{f.name}: help must be one line"
    assert "default" not in help_text.lower(), (
        f"{f.name}: the default is appended by --help, not written in help"
    )
    assert f.metadata.get("group") in GROUP_ORDER, f"{f.name}: unknown group {f.metadata.get('group')!r}"
    if f.default is None and f.type not in ("bool", bool):
        # a None default that is resolved later says to what
        assert f.metadata.get("default_text") or f.name in {
            "api_key",
            "chat_template",
            "pp_trace_path",
        }, f.name


def test_help_lists_every_flag_in_its_group_with_choices_and_default():
    out = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "400", "PATH": ""},
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    sections: dict[str, list[str]] = {}  # group -> one entry per flag (its lines joined)
    current = None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line[:-1]
            sections[current] = []
        elif current is not None and line.startswith("  -"):
            sections[current].append(line)
        elif current is not None and line.strip() and sections[current]:
            sections[current][-1] += " " + line.strip()
    assert [s for s in sections if s in GROUP_ORDER] == list(GROUP_ORDER)
    for f in dataclasses.fields(ServerArgs):
        lines = [
            ln
            for ln in sections[f.metadata["group"]]
            if ln.strip().startswith(_flag(f.name) + " ")
            or ln.strip() == _flag(f.name)
            or ln.strip().startswith(_flag(f.name) + ",")
        ]
        assert len(lines) == 1, f"{_flag(f.name)} not (once) in group {f.metadata['group']!r}"
        line = lines[0]
        assert "(default: " in line, line
        choices = field_choices(f) or flag_choices().get(f.name)
        if choices:  # upstream's spellings of a value are accepted too (listed after ours)
            choices = list(choices) + [a for a in VALUE_ALIASES.get(f.name, {}) if a not in choices]
            assert "{" + ",".join(choices) + "}" in line, line


def test_aliases_and_values_parse():
    args = prepare_server_args(
        [
            "--model",
            TINY_LLAMA_DIR,
            "--tensor-parallel-size",
            "2",
            "--attn-cp-size",
            "2",
            "--nccl-init-addr",
            "127.0.0.1:1234",
            "--watchdog-timeout",
            "7.5",
            "--max-queued-requests",
            "3",
            "--trust-remote-code",
        ]
    )
    assert (args.model_path, args.tp_size, args.cp_size) == (TINY_LLAMA_DIR, 2, 2)
    assert args.dist_init_addr == "127.0.0.1:1234" and args.watchdog_timeout == 7.5
    assert args.max_queued_requests == 3 and args.trust_remote_code


def test_bad_choice_is_refused_by_argparse_and_by_validate():
    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        parser.parse_args(["--dtype", "int3"])
    with pytest.raises(ValueError, match="--dtype must be one of"):
        ServerArgs(model_path=TINY_LLAMA_DIR, dtype="int3").validate()
    with pytest.raises(ValueError, match="--attention-backend must be one of"):
        check_server_args(ServerArgs(model_path=TINY_LLAMA_DIR, attention_backend="flashinfer"))


def test_attention_backend_choices_come_from_the_model_layer():
    """ServerArgs declares no backend names; the entry point hands the registry's to argparse."""
    assert (
        field_choices(next(f for f in dataclasses.fields(ServerArgs) if f.name == "attention_backend"))
        is None
    )
    assert {"cpu", "torch_native", "dsa", "nsa"} <= set(flag_choices()["attention_backend"])
    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser, choices=flag_choices())
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        parser.parse_args(["--attention-backend", "flashinfer"])
    args = prepare_server_args(
        ["--model-path", TINY_LLAMA_DIR, "--attention-backend", "nsa"], choices=flag_choices()
    )
    assert args.attention_backend == "nsa"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"watchdog_timeout": 0.0}, "--watchdog-timeout must be > 0"),
        ({"max_queued_requests": 0}, "--max-queued-requests must be >= 1"),
    ],
)
def test_validate_names_the_flag(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ServerArgs(model_path=TINY_LLAMA_DIR, **kwargs).validate()


def test_cp_strategy_interleave_is_round_robin_with_a_note():
    args = ServerArgs(model_path=TINY_LLAMA_DIR, cp_strategy="interleave")
    assert args.cp_strategy == "round-robin"
    assert any("interleave" in n and "round-robin" in n for n in args.compat_notes())
    assert ServerArgs(model_path=TINY_LLAMA_DIR, cp_strategy="zigzag").compat_notes() == []


def test_compatibility_flags_are_accepted_and_explained():
    compat = [f.name for f in dataclasses.fields(ServerArgs) if f.metadata["group"] == G_COMPAT]
    assert set(compat) >= {
        "disable_cuda_graph",
        "disable_overlap_schedule",
        "enable_mixed_chunk",
        "skip_server_warmup",
    }
    values = {"torch_compile_max_bs": ["4"], "cuda_graph_max_bs": ["8"], "cuda_graph_bs": ["1", "2", "4"]}
    argv = [x for n in compat for x in (_flag(n), *values.get(n, []))]
    args = prepare_server_args(["--model-path", TINY_LLAMA_DIR, *argv])
    args.validate()
    notes = args.compat_notes()
    assert len(notes) == len(compat)
    for name in compat:
        assert any(n.startswith(_flag(name) + ": ") and len(n) > len(_flag(name)) + 10 for n in notes), name
    assert ServerArgs(model_path=TINY_LLAMA_DIR).compat_notes() == []


def test_chunked_prefill_size_defaults_to_the_platforms_choice():
    """Not given: the device platform's (2048 on CPU, 8192 on the accelerator platforms); given:
    as given, -1 disables chunking."""
    from sglang.srt.platforms import get_platform

    assert ServerArgs(model_path=TINY_LLAMA_DIR).chunked_prefill_size == 2048
    assert get_platform("cpu").default_chunked_prefill_size() == 2048
    assert (
        get_platform("cuda").default_chunked_prefill_size()
        == get_platform("npu").default_chunked_prefill_size()
        == 8192
    )
    assert ServerArgs(model_path=TINY_LLAMA_DIR, chunked_prefill_size=8192).chunked_prefill_size == 8192
    assert not ServerArgs(model_path=TINY_LLAMA_DIR, chunked_prefill_size=-1).chunked_prefill_enabled


@pytest.mark.parametrize(
    "flags,match",
    [
        ({"tp_size": 3}, "4 attention heads must be divisible by the attention tp size \\(3"),
        (
            {"tp_size": 6, "dp_size": 2, "enable_dp_attention": True},
            "divisible by the attention tp size \\(3",
        ),
        ({"tp_size": 4, "cp_size": 2}, None),  # attention tp 2: 4 heads, 2 KV heads split evenly
        ({"tp_size": 4}, None),  # 2 KV heads replicated on 2 ranks each
    ],
)
def test_attention_heads_against_the_attention_tp_size(flags, match):
    """Checked from config.json at start-up (tiny Llama: 4 heads, 2 KV heads), not by every rank."""
    args = ServerArgs(model_path=TINY_LLAMA_DIR, **flags)
    if match is None:
        check_server_args(args)
        return
    with pytest.raises(ValueError, match=match):
        check_server_args(args)
