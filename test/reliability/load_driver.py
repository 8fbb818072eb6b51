"""Load with faults against a running server: N requests from C concurrent clients, random
lengths, spread over `/generate` (httpx) and `/v1/completions` / `/v1/chat/completions` (the
`openai` client); a share of them streaming and dropped by the client mid-stream.

`run_load(url, ...)` returns a `LoadReport`; every request either completes (checked: 200, a
finish reason, no more tokens than asked, a stream that ends with its final chunk) or is dropped
by its client; anything else is an error. Used by test_load.py; also a CLI:

    python test/reliability/load_driver.py --url http://127.0.0.1:30000 --requests 1000 --clients 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Optional

import httpx
import openai

ROUTES = ("generate", "completions", "chat")
WORDS = "the a of and to in is was for on with as by at from it an be this that are or have".split()


@dataclass
class RequestSpec:
    index: int
    route: str
    prompt_ids: list[int]
    max_new_tokens: int
    stream: bool
    drop_after: Optional[int]  # chunks to read before the client drops the stream (None: read all)
    n: int = 1  # parallel samples (SGLang's / OpenAI's n)
    logprobs: bool = False

    @property
    def text(self) -> str:
        return " ".join(WORDS[t % len(WORDS)] for t in self.prompt_ids)


@dataclass
class LoadReport:
    requests: int = 0
    samples: int = 0  # requests x n: what the server counts
    completed: int = 0
    dropped: int = 0  # streams the client closed before their end
    dropped_samples: int = 0  # their samples (n each): at most this many aborts on the server
    streams_planned_to_drop: int = 0
    errors: list[str] = field(default_factory=list)
    by_route: dict[str, int] = field(default_factory=dict)
    output_tokens: int = 0
    duration_s: float = 0.0
    max_health_latency_s: float = 0.0
    health_failures: int = 0
    max_info_latency_s: float = 0.0  # /get_server_info polled during the load
    health_generate_failures: int = 0

    def summary(self) -> dict:
        return {
            "requests": self.requests,
            "samples": self.samples,
            "completed": self.completed,
            "dropped_by_client": self.dropped,
            "dropped_samples": self.dropped_samples,
            "planned_drops": self.streams_planned_to_drop,
            "errors": len(self.errors),
            "by_route": self.by_route,
            "output_tokens": self.output_tokens,
            "duration_s": round(self.duration_s, 1),
            "max_health_latency_s": round(self.max_health_latency_s, 3),
            "health_failures": self.health_failures,
            "max_info_latency_s": round(self.max_info_latency_s, 3),
            "health_generate_failures": self.health_generate_failures,
        }


def make_specs(
    n: int, drop_fraction: float, vocab: int, seed: int, max_prompt: int, max_new: int
) -> list[RequestSpec]:
    """Random requests: a shared prefix (prefix-cache hits) or not, random lengths; exactly
    round(n * drop_fraction) streams dropped mid-stream, the rest half non-streaming, half full streams."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, vocab) for _ in range(32)] for _ in range(8)]
    n_drop = round(n * drop_fraction)
    drops = set(rng.sample(range(n), n_drop))
    specs = []
    for i in range(n):
        length = rng.randint(1, max_prompt)
        ids = [rng.randrange(3, vocab) for _ in range(length)]
        if rng.random() < 0.5:
            ids = (prefixes[rng.randrange(len(prefixes))] + ids)[:max_prompt]
        dropped = i in drops
        stream = dropped or rng.random() < 0.25
        route = ROUTES[i % len(ROUTES)]
        specs.append(
            RequestSpec(
                index=i,
                route=route,
                prompt_ids=ids,
                max_new_tokens=rng.randint(8, max_new) if dropped else rng.randint(1, max_new),
                stream=stream,
                drop_after=rng.randint(1, 3) if dropped else None,
                n=2 if route != "chat" and rng.random() < 0.1 else 1,
                logprobs=rng.random() < 0.1,
            )
        )
    return specs


def _describe(err: BaseException) -> str:
    """The error and its causes (the openai SDK hides httpx's reason behind "Connection error.")."""
    parts: list[str] = []
    seen: set[int] = set()
    cur: Optional[BaseException] = err
    while cur is not None and id(cur) not in seen and len(parts) < 4:
        seen.add(id(cur))
        parts.append(repr(cur)[:200])
        cur = cur.__cause__ or cur.__context__
    return " <- ".join(parts)


class Runner:
    def __init__(self, url: str, api_key: Optional[str], report: LoadReport):
        self.url = url
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=128)
        self.http = httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits)
        self.oai = openai.AsyncOpenAI(
            base_url=url + "/v1",
            api_key=api_key or "none",
            max_retries=0,
            timeout=600,
            http_client=httpx.AsyncClient(timeout=600, limits=limits),
        )
        self.report = report

    async def close(self) -> None:
        await self.http.aclose()
        await self.oai.close()

    def _error(self, spec: RequestSpec, what: str) -> None:
        self.report.errors.append(f"#{spec.index} {spec.route} stream={spec.stream}: {what}")

    async def run(self, spec: RequestSpec) -> None:
        try:
            if spec.route == "generate":
                await self._generate(spec)
            else:
                await self._openai(spec)
        except Exception as err:  # noqa: BLE001 - every failure is counted, none stops the load
            self._error(spec, _describe(err))

    def _check_all(self, spec: RequestSpec, finals: list[tuple[Optional[str], int]]) -> None:
        """Every sample of a request finished with a reason, within max_new_tokens each."""
        if len(finals) != spec.n:
            return self._error(spec, f"{len(finals)} finished samples for n={spec.n}")
        bad = [f for f in finals if f[0] not in ("stop", "length") or f[1] > spec.max_new_tokens]
        if bad:
            return self._error(spec, f"bad finish {bad[0]} (max {spec.max_new_tokens})")
        self.report.completed += 1
        self.report.output_tokens += sum(t for _, t in finals)

    async def _generate(self, spec: RequestSpec) -> None:
        body = {
            "input_ids": spec.prompt_ids,
            "stream": spec.stream,
            "return_logprob": spec.logprobs,
            "sampling_params": {"max_new_tokens": spec.max_new_tokens, "n": spec.n},
        }

        def final(meta: dict) -> tuple[Optional[str], int]:
            return (meta["finish_reason"] or {}).get("type"), meta["completion_tokens"]

        if not spec.stream:
            r = await self.http.post("/generate", json=body)
            if r.status_code != 200:
                return self._error(spec, f"HTTP {r.status_code}: {r.text[:200]}")
            outs = r.json() if isinstance(r.json(), list) else [r.json()]
            return self._check_all(spec, [final(o["meta_info"]) for o in outs])
        async with self.http.stream("POST", "/generate", json=body) as r:
            if r.status_code != 200:
                return self._error(spec, f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
            chunks, finals = 0, {}
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                out = json.loads(data)
                if "error" in out:
                    return self._error(spec, f"in-band error {out['error']}")
                chunks += 1
                if out["meta_info"]["finish_reason"]:
                    finals[out.get("index", 0)] = final(out["meta_info"])
                if spec.drop_after is not None and chunks >= spec.drop_after and len(finals) < spec.n:
                    self.report.dropped += 1
                    self.report.dropped_samples += spec.n
                    return  # leaving the block closes the connection mid-stream
            self._check_all(spec, list(finals.values()))

    async def _openai(self, spec: RequestSpec) -> None:
        common = dict(model="default", max_tokens=spec.max_new_tokens, stream=spec.stream, n=spec.n)
        if spec.route == "completions":
            call = self.oai.completions.create(
                prompt=spec.prompt_ids, logprobs=2 if spec.logprobs else None, **common
            )
        else:
            call = self.oai.chat.completions.create(
                messages=[{"role": "user", "content": spec.text}], logprobs=spec.logprobs, **common
            )
        if not spec.stream:
            resp = await call
            if len(resp.choices) != spec.n:
                return self._error(spec, f"{len(resp.choices)} choices for n={spec.n}")
            per = resp.usage.completion_tokens // spec.n
            return self._check_all(spec, [(c.finish_reason, per) for c in resp.choices])
        stream = await call
        chunks, reasons, pieces = 0, {}, {}
        try:
            async for chunk in stream:
                for choice in chunk.choices:
                    chunks += 1
                    if choice.finish_reason:
                        reasons[choice.index] = choice.finish_reason
                    text = choice.text if spec.route == "completions" else (choice.delta.content or "")
                    pieces[choice.index] = pieces.get(choice.index, 0) + (1 if text else 0)
                if spec.drop_after is not None and chunks >= spec.drop_after and len(reasons) < spec.n:
                    self.report.dropped += 1
                    self.report.dropped_samples += spec.n
                    return
        finally:
            await stream.close()
        # a stream read to its end: each sample carries a finish reason (at most one text piece per token)
        self._check_all(spec, [(r, min(pieces.get(i, 0), spec.max_new_tokens)) for i, r in reasons.items()])


async def _watch_health(url: str, report: LoadReport, stop: asyncio.Event, api_key: Optional[str]) -> None:
    """During the load: /health and /get_server_info every 0.5 s (200 and fast), /health_generate
    every 3 s (200: a busy server is healthy)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=url, timeout=60, headers=headers) as client:
        last_deep = time.monotonic()
        while not stop.is_set():
            for path in ("/health", "/get_server_info"):
                start = time.monotonic()
                try:
                    ok = (await client.get(path)).status_code == 200
                except httpx.HTTPError:
                    ok = False
                elapsed = time.monotonic() - start
                if path == "/health":
                    report.max_health_latency_s = max(report.max_health_latency_s, elapsed)
                else:
                    report.max_info_latency_s = max(report.max_info_latency_s, elapsed)
                report.health_failures += 0 if ok else 1
            if time.monotonic() - last_deep > 3.0:
                last_deep = time.monotonic()
                try:
                    r = await client.get("/health_generate")
                    report.health_generate_failures += 0 if r.status_code == 200 else 1
                except httpx.HTTPError:
                    report.health_generate_failures += 1
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except asyncio.TimeoutError:
                pass


async def run_load_async(
    url: str, specs: list[RequestSpec], clients: int, api_key: Optional[str] = None
) -> LoadReport:
    report = LoadReport(
        requests=len(specs),
        samples=sum(s.n for s in specs),
        streams_planned_to_drop=sum(s.drop_after is not None for s in specs),
    )
    for s in specs:
        report.by_route[s.route] = report.by_route.get(s.route, 0) + 1
    runner = Runner(url, api_key, report)
    queue: asyncio.Queue = asyncio.Queue()
    for s in specs:
        queue.put_nowait(s)

    async def client_loop() -> None:
        while True:
            try:
                spec = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await runner.run(spec)

    stop = asyncio.Event()
    watcher = asyncio.create_task(_watch_health(url, report, stop, api_key))
    start = time.monotonic()
    try:
        await asyncio.gather(*(client_loop() for _ in range(clients)))
    finally:
        report.duration_s = time.monotonic() - start
        stop.set()
        await watcher
        await runner.close()
    return report


def run_load(
    url: str,
    n: int = 1000,
    clients: int = 64,
    drop_fraction: float = 0.2,
    vocab: int = 552,
    seed: int = 0,
    max_prompt: int = 160,
    max_new: int = 24,
    api_key: Optional[str] = None,
) -> LoadReport:
    specs = make_specs(n, drop_fraction, vocab, seed, max_prompt, max_new)
    return asyncio.run(run_load_async(url, specs, clients, api_key))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--drop-fraction", type=float, default=0.2)
    p.add_argument("--vocab", type=int, default=552)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    report = run_load(args.url, args.requests, args.clients, args.drop_fraction, args.vocab, args.seed)
    print(json.dumps(report.summary(), indent=1))
    for e in report.errors[:20]:
        print("error:", e)


if __name__ == "__main__":
    main()
