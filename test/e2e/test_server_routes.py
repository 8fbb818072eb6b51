"""The routes and signals upstream SGLang's clients and routers use (issue 28), against one real
server of SmolLM2-135M (its HF directory converted from the embedded GGUF, dummy float32 weights)
with `--enable-metrics` and a tiny chat template that prints tool calls: /tokenize and
/detokenize (and /v1/), /v1/models/{id}, /get_load, /start_profile + /stop_profile, CORS, the
ready line, the new metrics, and the /v1 fields that used to be dropped silently.

Rendering checks compare a chat request with the completion of the text its template should
render: equal prompt token counts and equal greedy answers (same server, same weights)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang.test.polling import wait_until
from server_helpers import API_KEY, ServerHandle, launch_server, wait_idle

pytestmark = pytest.mark.slow  # starts its own server

READY_LINE = "The server is fired up and ready to roll!"
# Prints every message, a tool message's call id and an assistant's tool calls; generation prompt
# as chatml. A message left open by continue_final_message loses its "<|im_end|>\n" (HF's rule).
TOOL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}"
    "{% if m.tool_call_id %} [call {{ m.tool_call_id }}]{% endif %}{{ '\\n' + m.content }}"
    "{% for c in m.tool_calls or [] %}<tool {{ c.function.name }}({{ c.function.arguments.city }})>{% endfor %}"
    "{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
GREEDY = {"temperature": 0, "max_tokens": 4, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def smollm2_dir() -> str:
    from sglang.srt.model_loader.default_model import find_default_model
    from sglang.test.smollm2_reference import cached_hf_dir

    try:
        return cached_hf_dir(find_default_model())
    except RuntimeError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def srv(smollm2_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    template = tmp_path_factory.mktemp("tmpl") / "tools.jinja"
    template.write_text(TOOL_TEMPLATE)
    args = ("--enable-metrics", "--chat-template", str(template), "--log-level", "info")
    handle = launch_server(args, api_key=API_KEY, model=smollm2_dir)
    yield handle
    handle.stop()


@pytest.fixture
def http(srv: ServerHandle) -> Iterator[httpx.Client]:
    with srv.client() as c:
        yield c


@pytest.fixture
def oai(srv: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


# ---------------------------------------------------------------------------- ready line, CORS
def test_ready_line_in_log(srv: ServerHandle) -> None:
    log = Path(srv.log_path)
    assert wait_until(lambda: READY_LINE in log.read_text(errors="replace"), 10, 0.1), srv.log()


def _get_health(sock: socket.socket, host: str) -> bytes:
    sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: keep-alive\r\n\r\n".encode())
    return sock.recv(4096)


def test_idle_keep_alive_connection_outlives_client_pool_expiry(srv: ServerHandle) -> None:
    """A connection idle for longer than httpx's 5 s pool expiry is still open: with uvicorn's 5 s
    default the server closed it just as a pooled client could send on it (a lost request under
    load, "Connection error" in the openai SDK)."""
    parsed = urlparse(srv.url)
    with socket.create_connection((parsed.hostname, parsed.port), timeout=10) as sock:
        assert _get_health(sock, parsed.netloc).startswith(b"HTTP/1.1 200")
        time.sleep(6.0)
        assert _get_health(sock, parsed.netloc).startswith(b"HTTP/1.1 200"), "idle connection closed"


def test_http_process_never_loads_torch(srv: ServerHandle) -> None:
    """The HTTP process (tokenizer, chat templates, start-up checks of the checkpoint) runs without
    torch: importing it costs every server start ~2-3 CPU-s in a process that needs none of it."""
    maps = Path(f"/proc/{srv.proc.pid}/maps")
    if not maps.exists():
        pytest.skip("needs Linux /proc")
    assert "libtorch" not in maps.read_text()


def test_cors_preflight_and_simple_request(srv: ServerHandle) -> None:
    origin = "http://example.test"
    pre = httpx.options(
        srv.url + "/v1/chat/completions",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type,x-custom",
        },
    )
    assert pre.status_code == 200, pre.text  # answered before the API-key check
    assert pre.headers["access-control-allow-origin"] in ("*", origin)
    assert "POST" in pre.headers["access-control-allow-methods"]
    allowed = pre.headers["access-control-allow-headers"].lower()
    assert "authorization" in allowed and "x-custom" in allowed
    r = httpx.get(srv.url + "/v1/models", headers={"Origin": origin, **srv.headers})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] in ("*", origin)


# ---------------------------------------------------------------------------- tokenize
def test_tokenize_detokenize_round_trip(http: httpx.Client, smollm2_dir: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    text = "The capital of France is Paris. Ünïcödé ok?"
    max_len = http.get("/v1/models").json()["data"][0]["max_model_len"]
    for prefix in ("", "/v1"):
        r = http.post(f"{prefix}/tokenize", json={"prompt": text})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["tokens"] == tok.encode(text) and body["count"] == len(body["tokens"]) > 5
        assert body["max_model_len"] == max_len
        back = http.post(f"{prefix}/detokenize", json={"tokens": body["tokens"]})
        assert back.status_code == 200 and back.json() == {"text": text}
    batch = http.post("/tokenize", json={"prompt": ["a b", text], "add_special_tokens": False}).json()
    assert batch["tokens"] == [tok.encode("a b"), tok.encode(text)]
    assert batch["count"] == [len(t) for t in batch["tokens"]]
    texts = http.post("/detokenize", json={"tokens": batch["tokens"]}).json()["text"]
    assert texts == ["a b", text]
    bad = http.post("/detokenize", json={"tokens": [10**9]})
    assert bad.status_code == 400 and "tokens" == bad.json()["error"]["param"]


# ---------------------------------------------------------------------------- models, load
def test_models_by_id(oai: openai.OpenAI, http: httpx.Client) -> None:
    served = oai.models.list().data[0].id
    card = oai.models.retrieve(served)
    assert card.id == served and card.object == "model"
    with pytest.raises(openai.NotFoundError) as err:
        oai.models.retrieve("no-such-model")
    assert "no-such-model" in str(err.value)
    r = http.get("/v1/models/no-such-model")
    assert r.status_code == 404 and r.json()["error"]["code"] == 404


def test_get_load_follows_a_running_request(http: httpx.Client, oai: openai.OpenAI) -> None:
    wait_idle(http)
    idle = http.get("/get_load").json()
    assert idle == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": idle[0]["num_tokens"]}]
    stream = oai.completions.create(
        model="default",
        prompt="count: 1 2 3",
        max_tokens=400,
        stream=True,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    next(iter(stream))  # the request runs now
    busy = http.get("/get_load").json()
    stream.close()  # aborts it
    assert busy[0]["num_reqs"] == 1 and busy[0]["num_tokens"] > idle[0]["num_tokens"]
    wait_idle(http)


# ---------------------------------------------------------------------------- profiler
def test_profile_writes_a_trace(http: httpx.Client, oai: openai.OpenAI, tmp_path: Path) -> None:
    r = http.post("/start_profile", json={"output_dir": str(tmp_path), "profile_id": "t1"})
    assert r.status_code == 200, r.text
    again = http.post("/start_profile", json={"output_dir": str(tmp_path)})
    assert again.status_code == 400 and "already running" in again.text
    oai.completions.create(model="default", prompt="hello", **GREEDY)
    r = http.post("/stop_profile")
    assert r.status_code == 200, r.text
    traces = list(tmp_path.glob("t1-rank*.trace.json"))
    assert len(traces) == 1, list(tmp_path.iterdir())
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert any("forward" in str(e.get("name", "")).lower() or e.get("ph") == "X" for e in events)
    assert http.post("/stop_profile").status_code == 400  # nothing running
    bad = http.post("/start_profile", json={"profile_by_stage": True})
    assert bad.status_code == 400 and "profile_by_stage" in bad.text


# ---------------------------------------------------------------------------- metrics
def _scrape(http: httpx.Client) -> dict[str, float]:
    values = {}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for s in family.samples:
            if "le" not in s.labels:
                values[s.name] = s.value
    return values


def test_metrics_after_requests(http: httpx.Client, oai: openai.OpenAI) -> None:
    wait_idle(http)
    before = _scrape(http)
    n = 3
    for i in range(n):
        oai.completions.create(model="default", prompt=f"metrics {i}", **{**GREEDY, "max_tokens": 8})
    wait_idle(http)
    after = _scrape(http)
    assert after["sglang:gen_throughput"] > 0
    assert after["sglang:queue_time_seconds_count"] - before.get("sglang:queue_time_seconds_count", 0) == n
    assert after["sglang:queue_time_seconds_sum"] >= before.get("sglang:queue_time_seconds_sum", 0)
    assert after["sglang:num_retracted_reqs"] == 0
    for name in (
        "num_prefill_prealloc_queue_reqs",
        "num_prefill_inflight_queue_reqs",
        "num_decode_prealloc_queue_reqs",
        "num_decode_transfer_queue_reqs",
        "kv_transfer_latency_ms",
    ):
        assert after[f"sglang:{name}"] == 0  # a normal server: no PD queues


# ---------------------------------------------------------------------------- /v1 fields
def _same_as_completion(oai: openai.OpenAI, chat: object, rendered: str) -> None:
    """The chat request rendered exactly `rendered`: same prompt tokens, same greedy answer."""
    comp = oai.completions.create(model="default", prompt=rendered, **GREEDY)
    assert chat.usage.prompt_tokens == comp.usage.prompt_tokens
    assert chat.choices[0].message.content == comp.choices[0].text


def test_continue_final_message_renders_it_open(oai: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "The color is"}]
    open_ = oai.chat.completions.create(
        model="default",
        messages=msgs,
        **{**GREEDY, "extra_body": {"ignore_eos": True, "continue_final_message": True}},
    )
    closed = oai.chat.completions.create(model="default", messages=msgs, **GREEDY)
    head = "<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\nThe color is"
    _same_as_completion(oai, open_, head)
    _same_as_completion(oai, closed, head + "<|im_end|>\n<|im_start|>assistant\n")
    assert open_.usage.prompt_tokens < closed.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError, match="continue_final_message"):
        oai.chat.completions.create(
            model="default", messages=msgs[:1], extra_body={"continue_final_message": True}, max_tokens=1
        )


def test_tool_call_history_reaches_the_template(oai: openai.OpenAI) -> None:
    call = {
        "id": "call_7",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    msgs = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_7", "content": "sunny"},
    ]
    chat = oai.chat.completions.create(model="default", messages=msgs, tool_choice="none", **GREEDY)
    rendered = (
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<tool get_weather(Paris)><|im_end|>\n"
        "<|im_start|>tool [call call_7]\nsunny<|im_end|>\n<|im_start|>assistant\n"
    )
    _same_as_completion(oai, chat, rendered)


def test_continuous_usage_stats_in_every_chunk(oai: openai.OpenAI) -> None:
    chunks = list(
        oai.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            **GREEDY,
        )
    )
    assert len(chunks) >= 4 and all(c.usage is not None for c in chunks)
    completion = [c.usage.completion_tokens for c in chunks]
    assert completion == sorted(completion) and completion[-1] == 4
    assert len({c.usage.prompt_tokens for c in chunks}) == 1
    plain = list(
        oai.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "hi"}], stream=True, **GREEDY
        )
    )
    assert all(c.usage is None for c in plain)


def test_tool_choice_without_tools(oai: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    for choice in ("none", "auto"):
        assert oai.chat.completions.create(
            model="default", messages=msgs, tool_choice=choice, max_tokens=1
        ).choices
    named = {"type": "function", "function": {"name": "f"}}
    for choice in ("required", named):
        with pytest.raises(openai.BadRequestError) as err:
            oai.chat.completions.create(model="default", messages=msgs, tool_choice=choice, max_tokens=1)
        assert err.value.body["param"] == "tool_choice"


def test_fields_honoured_or_refused_by_name(http: httpx.Client) -> None:
    base = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for extra in (
        {"separate_reasoning": True},
        {"separate_reasoning": False, "stream_reasoning": False},
        {"stop_regex": []},
    ):
        r = http.post("/v1/chat/completions", json={**base, **extra})
        assert r.status_code == 200, (extra, r.text)
    for name, value in (
        ("lora_path", "adapter"),
        ("return_hidden_states", True),
        ("session_params", {"id": "s"}),
        ("cache_salt", "s"),
    ):
        r = http.post("/v1/chat/completions", json={**base, name: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == name, r.text
        r = http.post(
            "/v1/completions", json={"model": "default", "prompt": "hi", "max_tokens": 2, name: value}
        )
        assert r.status_code == 400 and name in r.json()["error"]["message"], r.text
    # stop_regex with a value is honoured: "." matches the first character generated
    r = http.post(
        "/v1/completions",
        json={"model": "default", "prompt": "hi", "max_tokens": 16, "ignore_eos": True, "stop_regex": ["."]},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "stop" and body["usage"]["completion_tokens"] < 16, body


def test_chat_input_ids_skip_the_template(oai: openai.OpenAI, http: httpx.Client) -> None:
    ids = http.post("/tokenize", json={"prompt": "<|im_start|>user\nhello<|im_end|>\n"}).json()["tokens"]
    extra = {"ignore_eos": True, "input_ids": ids}
    chat = oai.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "ignored"}], **{**GREEDY, "extra_body": extra}
    )
    comp = oai.completions.create(model="default", prompt=ids, **GREEDY)
    assert chat.usage.prompt_tokens == len(ids) and chat.choices[0].message.content == comp.choices[0].text
