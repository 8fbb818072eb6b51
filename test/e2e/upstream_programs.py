"""Frontend-language programs run by upstream SGLang's own client package against a server.

Not a test module: `test_upstream_frontend.py` runs it with upstream's client first on the path
(`sglang.test.upstream_client.run_client`), as `python upstream_programs.py URL OUT.json`. Each case
records what the program saw (or the error it raised) in OUT.json; the test asserts on it.
"""

from __future__ import annotations

import json
import sys
import traceback
import warnings

import sglang as sgl
from upstream_inputs import (
    CONSTRAINED_PROMPT,
    CONSTRAINED_REGEX,
    CONSTRAINED_SCHEMA,
    FORK_PROMPT,
    QUESTIONS,
    SELECT_CHOICES,
    SELECT_PROMPT,
)


GREEDY = {"temperature": 0}


@sgl.function
def completion(s, prompt, max_tokens, stop=None, ignore_eos=False):
    s += prompt
    s += sgl.gen("answer", max_tokens=max_tokens, stop=stop, ignore_eos=ignore_eos, **GREEDY)


@sgl.function
def qa(s, question):
    s += "Q: " + question + "\nA:" + sgl.gen("answer", max_tokens=12, stop="\n", **GREEDY)


@sgl.function
def chat(s, question, follow_up):
    s += sgl.system("You are a terse assistant.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("a1", max_tokens=12, **GREEDY))
    s += sgl.user(follow_up)
    s += sgl.assistant(sgl.gen("a2", max_tokens=12, **GREEDY))


@sgl.function
def tips(s):
    s += FORK_PROMPT
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"Now, expand tip {i + 1} into a paragraph:\n"
        f += sgl.gen("detailed_tip", max_tokens=10, stop="\n\n", **GREEDY)
    seen = {"fork_texts": [f.text() for f in forks], "fork_tips": [f["detailed_tip"] for f in forks]}
    s += "Tip 1:" + forks[0]["detailed_tip"] + "\nTip 2:" + forks[1]["detailed_tip"] + "\n"
    s += "In summary," + sgl.gen("summary", max_tokens=8, **GREEDY)
    return seen


@sgl.function
def choose(s, choices):
    s += SELECT_PROMPT + sgl.select("city", choices=choices)


def case_gen(url):
    stop = completion.run(prompt="The capital of France is", max_tokens=16, stop="\n")
    length = completion.run(prompt="Count: 1, 2, 3,", max_tokens=5, ignore_eos=True)
    return {
        "stop": {"text": stop.text(), "answer": stop["answer"], "meta": stop.get_meta_info("answer")},
        "length": {"text": length.text(), "answer": length["answer"], "meta": length.get_meta_info("answer")},
    }


def case_stream(url):
    state = completion.run(prompt="The capital of France is", max_tokens=12, ignore_eos=True, stream=True)
    pieces = list(state.text_iter("answer"))
    state.stream_executor.worker.join(timeout=60)  # its failure (a warning) is recorded by then
    return {"pieces": pieces, "answer": state["answer"], "text": state.text()}


def case_batch(url):
    states = qa.run_batch([{"question": q} for q in QUESTIONS], num_threads=2, progress_bar=False)
    return {"texts": [s.text() for s in states], "answers": [s["answer"] for s in states]}


def case_chat(url):
    state = chat.run(question="What is the capital of France?", follow_up="And of Italy?")
    default_name = sgl.RuntimeEndpoint(url).chat_template.name
    return {
        "text": state.text(),
        "messages": state.messages(),
        "a1": state["a1"],
        "a2": state["a2"],
        "template": sgl.global_config.default_backend.chat_template.name,
        "template_by_model_path": default_name,
    }


def case_fork(url):
    state = tips.run()
    return {**state.ret_value, "text": state.text(), "summary": state["summary"]}


def case_select(url):
    out = []
    for choices in SELECT_CHOICES:
        state = choose.run(choices=choices)
        out.append({"decision": state["city"], "meta": state.get_meta_info("city"), "text": state.text()})
    return {"runs": out}


@sgl.function
def constrained(s, prompt, **gen):
    s += prompt + sgl.gen("answer", max_tokens=24, **gen, **GREEDY)


def case_constrained(url):
    """`sgl.gen(regex=...)` and `sgl.gen(json_schema=...)`: sent as /generate sampling params."""
    regex = constrained.run(prompt=CONSTRAINED_PROMPT, regex=CONSTRAINED_REGEX)
    schema = constrained.run(prompt=CONSTRAINED_PROMPT, json_schema=CONSTRAINED_SCHEMA)
    return {"regex": regex["answer"], "json_schema": schema["answer"]}


def case_admin(url):
    sgl.flush_cache()
    info = sgl.get_server_info()
    return {"server_info_keys": sorted(info)}


CASES = {
    "gen": case_gen,
    "stream": case_stream,
    "batch": case_batch,
    "chat": case_chat,
    "fork": case_fork,
    "select": case_select,
    "constrained": case_constrained,
    "admin": case_admin,
}


def main() -> None:
    url, out_path = sys.argv[1], sys.argv[2]
    names = sys.argv[3].split(",") if len(sys.argv) > 3 else list(CASES)
    # SmolLM2's name matches none of upstream's chat-template rules (it would pick "default"); its
    # template is ChatML, which upstream's client has under that name.
    sgl.set_default_backend(sgl.RuntimeEndpoint(url, chat_template_name="chatml"))
    results = {"sglang_file": sgl.__file__, "sglang_version": sgl.__version__}
    # upstream's interpreter turns a failed request into a warning (then a missing variable)
    seen: list[str] = []
    warnings.showwarning = lambda message, *args, **kwargs: seen.append(str(message))
    warnings.simplefilter("always")  # the same failure in two cases is reported twice
    for name in names:
        seen.clear()
        try:
            results[name] = {"ok": True, **CASES[name](url)}
        except Exception as err:  # noqa: BLE001 - recorded for the test to report
            results[name] = {"ok": False, "error": f"{err!r}", "traceback": traceback.format_exc()}
        results[name]["warnings"] = list(seen)
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
