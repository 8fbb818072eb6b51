"""Structured outputs under load (issue 29): 50 concurrent constrained requests (json_schema, regex
and ebnf; `/generate`, `/v1/completions` and `/v1/chat/completions`; some streaming) with random
client aborts against one real server (SmolLM2, xgrammar, one torch thread), while an unconstrained
stream runs beside them.

Every request completes (200, a finish reason; a `stop` output matches its regex / grammar) or is
aborted by its client; afterwards nothing is left behind (no request in the tokenizer manager or
the scheduler, no grammar matcher and no request in the grammar queue, the KV pool and the request
table back to their initial free counts, before and after `/flush_cache`: `leaks_after_load`); and the scheduler loop
never stalls: the unconstrained stream keeps receiving tokens, its largest gap between two chunks
below `MAX_GAP_S` (generous: the box is shared; compiles run off the loop)."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from dataclasses import dataclass
from typing import Optional

import httpx
import openai
import pytest
from server_helpers import internal_state, launch_server, leaks_after_load

from sglang.srt.model_loader.default_model import find_default_model

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

REQUESTS = 50
ABORT_SHARE = 0.3
MAX_NEW = 24
MAX_GAP_S = 5.0
REGEX = r"(yes|no), [0-9]{2}"
EBNF = 'root ::= "The answer is " ("A" | "B" | "C") "."'
ROUTES = ("generate", "completions", "chat")


def schema(i: int) -> str:
    """Distinct schemas (distinct compiles during the load), a few repeated (cache hits)."""
    props = {"name": {"type": "string", "maxLength": 8}, f"n{i % 6}": {"type": "integer"}}
    return json.dumps({"type": "object", "properties": props, "required": list(props)})


@dataclass
class Plan:
    index: int
    route: str
    kind: str
    text: str
    stream: bool
    abort_after: Optional[float]  # seconds before the client gives up (None: waits for the end)

    def params(self) -> dict:
        return {self.kind: self.text}


def plans(seed: int) -> list[Plan]:
    rng = random.Random(seed)
    out = []
    for i in range(REQUESTS):
        kind = ("json_schema", "regex", "ebnf")[i % 3]
        text = {"json_schema": schema(i), "regex": REGEX, "ebnf": EBNF}[kind]
        aborted = rng.random() < ABORT_SHARE
        out.append(
            Plan(
                i,
                ROUTES[(i // 3) % 3],
                kind,
                text,
                stream=rng.random() < 0.4,
                abort_after=rng.uniform(0.2, 3.0) if aborted else None,
            )
        )
    return out


def matches(plan: Plan, text: str) -> bool:
    if plan.kind == "regex":
        return re.fullmatch(REGEX, text) is not None
    if plan.kind == "ebnf":
        return re.fullmatch(r"The answer is [ABC]\.", text) is not None
    return isinstance(json.loads(text), dict)


class Driver:
    def __init__(self, url: str):
        self.http = httpx.AsyncClient(base_url=url, timeout=600)
        self.oai = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
        self.outcomes: dict[int, str] = {}
        self.errors: list[str] = []

    async def close(self) -> None:
        await self.http.aclose()
        await self.oai.close()

    async def run(self, plan: Plan) -> None:
        try:
            call = self._one(plan)
            if plan.abort_after is not None:
                try:
                    result = await asyncio.wait_for(call, plan.abort_after)
                except asyncio.TimeoutError:
                    self.outcomes[plan.index] = "aborted"  # the connection closed: the server aborts
                    return
            else:
                result = await call
            reason, text = result
            if reason not in ("stop", "length"):
                self.errors.append(f"#{plan.index} {plan.route}/{plan.kind}: finish {reason!r}")
            elif reason == "stop" and not matches(plan, text):
                self.errors.append(f"#{plan.index} {plan.route}/{plan.kind}: {text!r} does not match")
            self.outcomes[plan.index] = reason
        except Exception as e:  # noqa: BLE001 - every failure is counted
            self.errors.append(f"#{plan.index} {plan.route}/{plan.kind} stream={plan.stream}: {e!r}"[:300])

    async def _one(self, plan: Plan) -> tuple[Optional[str], str]:
        common = dict(
            model="default", max_tokens=MAX_NEW, temperature=0.7, seed=plan.index, stream=plan.stream
        )
        content = "Answer briefly: yes or no, and a number; or pick A, B or C; or give a name as JSON."
        if plan.route == "generate":
            return await self._generate(plan, content)
        if plan.route == "completions":
            call = self.oai.completions.create(prompt=content, extra_body=plan.params(), **common)
        else:
            messages = [{"role": "user", "content": content}]
            call = self.oai.chat.completions.create(messages=messages, extra_body=plan.params(), **common)
        resp = await call
        if not plan.stream:
            c = resp.choices[0]
            return c.finish_reason, c.text if plan.route == "completions" else c.message.content
        pieces, reason = [], None
        async for chunk in resp:
            for c in chunk.choices:
                pieces.append((c.text if plan.route == "completions" else c.delta.content) or "")
                reason = c.finish_reason or reason
        return reason, "".join(pieces)

    async def _generate(self, plan: Plan, content: str) -> tuple[Optional[str], str]:
        params = {"max_new_tokens": MAX_NEW, "temperature": 0.7, "seed": plan.index, **plan.params()}
        body = {"text": content, "sampling_params": params, "stream": plan.stream}
        if not plan.stream:
            r = await self.http.post("/generate", json=body)
            assert r.status_code == 200, r.text
            out = r.json()
            return (out["meta_info"]["finish_reason"] or {}).get("type"), out["text"]
        last: dict = {}
        async with self.http.stream("POST", "/generate", json=body) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                    last = json.loads(line[5:])
        return (last["meta_info"]["finish_reason"] or {}).get("type"), last["text"]


async def watch_stream(url: str, stop: asyncio.Event, gaps: list[float]) -> int:
    """An unconstrained /generate stream (ignore_eos) read until `stop`; the gaps between its chunks."""
    body = {
        "text": "Count slowly:",
        "stream": True,
        "sampling_params": {"max_new_tokens": 4000, "temperature": 0, "ignore_eos": True},
    }
    chunks = 0
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        async with client.stream("POST", "/generate", json=body) as r:
            assert r.status_code == 200
            last = None
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                now = time.monotonic()
                if last is not None:
                    gaps.append(now - last)
                last, chunks = now, chunks + 1
                if stop.is_set():
                    break  # closing the stream aborts the request
    return chunks


async def load(url: str, seed: int) -> tuple[Driver, list[float], int, int]:
    driver = Driver(url)
    stop, gaps = asyncio.Event(), []
    watcher = asyncio.create_task(watch_stream(url, stop, gaps))
    while not gaps and not watcher.done():  # the stream is flowing before the load starts
        await asyncio.sleep(0.05)
    before = len(gaps)
    try:
        await asyncio.gather(*(driver.run(p) for p in plans(seed)))
    finally:
        during = len(gaps) - before
        stop.set()
        chunks = await watcher
        await driver.close()
    return driver, gaps, during, chunks


def test_constrained_load_with_aborts_leaks_nothing_and_never_stalls():
    handle = launch_server(
        (
            "--load-format",
            "auto",
            "--num-threads",
            "1",
            "--max-running-requests",
            "64",
            "--chunked-prefill-size",
            "256",
        ),
        model=find_default_model(),
    )
    try:
        with handle.client() as client:
            initial = internal_state(client)
        driver, gaps, during, chunks = asyncio.run(load(handle.url, seed=29))
        assert handle.proc.poll() is None, f"server died; log {handle.log_path}"
        assert not driver.errors, driver.errors[:5]
        assert len(driver.outcomes) == REQUESTS
        aborted = sum(v == "aborted" for v in driver.outcomes.values())
        assert 0 < aborted < REQUESTS, driver.outcomes
        # the unconstrained stream received tokens all along the load
        assert during > 10, (during, chunks)
        assert max(gaps) < MAX_GAP_S, f"loop stalled {max(gaps):.2f} s; log {handle.log_path}"
        with handle.client() as client:
            leaks = leaks_after_load(client, initial, timeout=120)
        print(
            f"\nstructured load: {REQUESTS} requests, {aborted} aborted by the client, "
            f"{during} stream chunks during the load, max gap {max(gaps):.2f} s, largest {sorted(gaps)[-5:]}"
        )
        assert all(v == 0 for v in leaks.values()), leaks
    finally:
        handle.stop()
