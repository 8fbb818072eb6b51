"""Upstream SGLang's frontend language against our server, judged by upstream's own client package
(sglang 0.5.23, `sglang.test.upstream_client`): `sgl.gen` with `max_tokens` and `stop`, streamed,
`run_batch`, chat roles (ChatML: the server's SmolLM2 template), `fork`, `select` and the admin
calls. The programs (`upstream_programs.py`) run in one subprocess with upstream's `sglang` first on
the path; each answer must equal what our native routes give for the same text (greedy, float32),
and `select`'s choice and scores must equal upstream's scoring of transformers' float32 logprobs.

Two server features these programs rely on: `stop_regex` (upstream sends an empty list with every
`gen`) and prompt logprobs (`logprob_start_len`, `input_token_logprobs`, which `select` reads)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import httpx
import pytest
from server_helpers import launch_server
from upstream_inputs import (
    CONSTRAINED_PROMPT,
    CONSTRAINED_REGEX,
    CONSTRAINED_SCHEMA,
    QUESTIONS,
    SELECT_CHOICES,
    SELECT_PROMPT,
)

from sglang.srt.model_loader.default_model import find_default_model
from sglang.test import upstream_client

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

PROGRAMS = Path(__file__).with_name("upstream_programs.py")
LOGPROB_TOL = 2e-3  # issue 28's bound for prompt logprobs vs transformers, float32


@pytest.fixture(scope="module")
def server():
    handle = launch_server(("--load-format", "auto"), model=find_default_model())
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def runs(server, tmp_path_factory) -> dict:
    """Every program's record (one client process: upstream's import takes seconds)."""
    target = upstream_client.ensure_installed()
    out = tmp_path_factory.mktemp("upstream-client") / "runs.json"
    done = upstream_client.run_client(str(PROGRAMS), [server.url, str(out)], target, timeout=600)
    assert done.returncode == 0 and out.is_file(), f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return json.loads(out.read_text())


def _case(runs: dict, name: str) -> dict:
    record = runs[name]
    # upstream's interpreter reports a failed request as a warning (a streamed one ends empty)
    seen = "\n".join(record["warnings"]) + record.get("traceback", "")
    if not record["ok"] or "Error in stream_executor" in seen:
        pytest.fail(f"{name}: {record.get('error')}\n{seen[-4000:]}")
    return record


def _generate(server, text: str, **params) -> dict:
    body = {"text": text, "sampling_params": {"temperature": 0, **params}}
    r = httpx.post(server.url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _chat(server, messages: list[dict], max_tokens: int) -> str:
    body = {"model": "default", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_client_is_upstreams(runs) -> None:
    import sglang

    target = upstream_client.default_dir().resolve()
    assert Path(runs["sglang_file"]).resolve().is_relative_to(target)
    assert runs["sglang_version"] == upstream_client.UPSTREAM_VERSION
    assert not Path(sglang.__file__).resolve().is_relative_to(target)  # this process: ours


def test_gen_stop_and_max_tokens(server, runs) -> None:
    rec = _case(runs, "gen")
    stop, length = rec["stop"], rec["length"]
    assert stop["text"] == "The capital of France is" + stop["answer"]
    assert "\n" not in stop["answer"] and stop["answer"].strip()
    assert (
        stop["answer"] == _generate(server, "The capital of France is", max_new_tokens=16, stop="\n")["text"]
    )
    assert stop["meta"]["finish_reason"] in (
        {"type": "stop", "matched": "\n"},
        {"type": "length", "length": 16},
    )
    assert length["meta"]["completion_tokens"] == 5
    assert length["meta"]["finish_reason"] == {"type": "length", "length": 5}
    ours = _generate(server, "Count: 1, 2, 3,", max_new_tokens=5, ignore_eos=True)
    assert length["answer"] == ours["text"]


def test_gen_stream(server, runs) -> None:
    rec = _case(runs, "stream")
    assert len(rec["pieces"]) >= 2 and "".join(rec["pieces"]) == rec["answer"]
    ours = _generate(server, "The capital of France is", max_new_tokens=12, ignore_eos=True)
    assert rec["answer"] == ours["text"]


def test_run_batch(server, runs) -> None:
    rec = _case(runs, "batch")
    assert [t.split("\nA:")[0] for t in rec["texts"]] == [f"Q: {q}" for q in QUESTIONS]
    for question, answer in zip(QUESTIONS, rec["answers"]):
        assert answer == _generate(server, f"Q: {question}\nA:", max_new_tokens=12, stop="\n")["text"]


def test_chat_roles(server, runs) -> None:
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    rec = _case(runs, "chat")
    # upstream picks a template by model path; SmolLM2 matches none of its rules
    assert (rec["template"], rec["template_by_model_path"]) == ("chatml", "default")
    messages = rec["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    tokenizer = get_tokenizer(find_default_model())
    assert rec["text"] == tokenizer.apply_chat_template(messages, tokenize=False)  # the server's template
    assert rec["a1"] == messages[2]["content"] == _chat(server, messages[:2], 12)
    assert rec["a2"] == messages[4]["content"] == _chat(server, messages[:4], 12)


def test_fork(server, runs) -> None:
    rec = _case(runs, "fork")
    assert len(rec["fork_texts"]) == 2
    for i, (text, tip) in enumerate(zip(rec["fork_texts"], rec["fork_tips"])):
        prefix = text[: len(text) - len(tip)]
        assert text.endswith(tip) and prefix.endswith(f"Now, expand tip {i + 1} into a paragraph:\n")
        assert tip == _generate(server, prefix, max_new_tokens=10, stop="\n\n")["text"]
    assert f"Tip 1:{rec['fork_tips'][0]}\nTip 2:{rec['fork_tips'][1]}\n" in rec["text"]
    head = rec["text"][: len(rec["text"]) - len(rec["summary"])]
    assert (
        head.endswith("In summary,") and rec["summary"] == _generate(server, head, max_new_tokens=8)["text"]
    )


def test_select_matches_transformers(runs) -> None:
    rec = _case(runs, "select")
    for choices, run in zip(SELECT_CHOICES, rec["runs"]):
        ref = _upstream_select_scores(SELECT_PROMPT, choices)
        got = run["meta"]["normalized_prompt_logprobs"]
        assert len(got) == len(choices)
        assert all(abs(g - r) <= LOGPROB_TOL for g, r in zip(got, ref)), (got, ref)
        assert run["decision"] == choices[max(range(len(choices)), key=ref.__getitem__)]
        assert run["text"] == SELECT_PROMPT + run["decision"]
    # the second list tells the normalisation apart: the mean picks the long choice
    assert rec["runs"][1]["decision"] == " Berlin, the capital of Germany"


def test_gen_regex_and_json_schema(server, runs) -> None:
    rec = _case(runs, "constrained")
    assert re.fullmatch(CONSTRAINED_REGEX, rec["regex"]), rec["regex"]
    assert json.loads(rec["json_schema"])["answer"] in ("yes", "no")
    for kind, value in (("regex", CONSTRAINED_REGEX), ("json_schema", CONSTRAINED_SCHEMA)):
        ours = _generate(server, CONSTRAINED_PROMPT, max_new_tokens=24, **{kind: value})
        assert rec[kind] == ours["text"], kind


def test_admin_calls(runs) -> None:
    rec = _case(runs, "admin")  # sgl.flush_cache() (POST /flush_cache) and sgl.get_server_info()
    assert {"model_path", "internal_states", "version"} <= set(rec["server_info_keys"])


def _upstream_select_scores(prompt: str, choices: list[str]) -> list[float]:
    """What upstream 0.5.23's `RuntimeEndpoint.select` with its default `token_length_normalized`
    scores, computed from transformers' float32 logprobs: the mean logprob of prompt + choice's
    tokens from `prompt_tokens - 2` on (token healing), the first dropped when the prompt ends with
    its text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang.test.smollm2_reference import cached_hf_dir

    hf_dir = cached_hf_dir(find_default_model())
    tokenizer = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32, local_files_only=True, attn_implementation="eager"
    ).eval()
    start = max(len(tokenizer(prompt).input_ids) - 2, 1)
    scores = []
    for choice in choices:
        ids = tokenizer(prompt + choice).input_ids
        with torch.no_grad():
            logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
        values = [logprobs[i - 1, ids[i]].item() for i in range(start, len(ids))]
        score = sum(values) / len(values)
        if prompt.endswith(tokenizer.decode([ids[start]])):
            score = (score * len(values) - values[0]) / (len(values) - 1)
        scores.append(score)
    assert all(math.isfinite(s) for s in scores)
    return scores
