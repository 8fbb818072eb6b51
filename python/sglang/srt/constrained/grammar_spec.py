"""What a request constrains its output to: one `GrammarSpec` (kind, text), taken from its sampling
parameters, and the cheap checks the request path runs before a request reaches the scheduler.

Kinds (upstream SGLang's sampling parameters): `json_schema` (a JSON schema as text; upstream's
`"$$ANY$$"` means any JSON value), `regex`, `ebnf` (an xgrammar / GBNF grammar with a `root` rule)
and `structural_tag` (upstream's shape: `{"type": "structural_tag", "structures": [{"begin",
"schema", "end"}], "triggers": [...]}`, or xgrammar's own `{"type": "structural_tag", "format":
...}`). OpenAI's `response_format` maps onto them (`response_format_params`); `json_object` is
`json_schema` `{"type": "object"}`, as upstream does.

`validate_spec` builds the grammar without a tokenizer (xgrammar's parsers: fast, no vocabulary).
The HTTP process does not call it (it never imports xgrammar, which imports torch: ~2 s on its
event loop at the first constrained request); the scheduler's grammar manager builds every grammar
and finishes an invalid one with an HTTP 400 naming the error (`grammar_manager.grammar_error`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

KINDS = ("json_schema", "regex", "ebnf", "structural_tag")
ANY_JSON = "$$ANY$$"  # upstream's json_schema for "any JSON value"
ANY_JSON_SCHEMA = '{"type": ["object", "array"]}'  # what xgrammar's builtin JSON grammar accepts
JSON_OBJECT_SCHEMA = '{"type": "object"}'


class GrammarError(ValueError):
    """A grammar that does not parse or compile (HTTP 400 with this message)."""


@dataclass(frozen=True)
class GrammarSpec:
    """One constraint: `kind` in KINDS and its text. Hashable: the compile cache's key."""

    kind: str
    text: str


def spec_of(params: Any) -> Optional[GrammarSpec]:
    """The constraint a SamplingParams asks for (None: unconstrained). More than one is an error."""
    given = [(k, getattr(params, k, None)) for k in KINDS]
    given = [(k, v) for k, v in given if v is not None]
    if not given:
        return None
    if len(given) > 1:
        names = ", ".join(k for k, _ in given)
        raise GrammarError(
            f"only one of json_schema, regex, ebnf and structural_tag may be set (got {names})"
        )
    kind, value = given[0]
    return GrammarSpec(kind, value)


def as_text(kind: str, value: Any) -> str:
    """A sampling parameter's value as grammar text: JSON schemas and structural tags may be given as
    objects (dumped to JSON), the others must be strings."""
    if isinstance(value, str):
        return value
    if kind in ("json_schema", "structural_tag") and isinstance(value, (dict, list, bool)):
        return json.dumps(value)
    raise GrammarError(f"{kind} must be a string, got {type(value).__name__}")


def _structural_tag(text: str) -> Any:
    """xgrammar's structural tag for upstream's shape (structures + triggers), or its own shape."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise GrammarError(f"structural_tag is not valid JSON: {e}") from None
    if isinstance(obj, dict) and "structures" in obj:
        return _structures(obj)
    return obj


def _structures(obj: dict) -> tuple[list, list[str]]:
    """Upstream's form: (xgrammar tag items, triggers); GrammarError naming the malformed field."""
    import xgrammar as xgr

    structures, triggers = obj["structures"], obj.get("triggers")
    if not isinstance(structures, list) or not structures:
        raise GrammarError("structural_tag 'structures' must be a non-empty list of {begin, schema, end}")
    if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) for t in triggers):
        raise GrammarError("structural_tag 'triggers' must be a non-empty list of strings")
    tags = []
    for i, s in enumerate(structures):
        if not isinstance(s, dict):
            raise GrammarError(f"structural_tag structures[{i}] must be an object with begin / schema / end")
        for key in ("begin", "end"):
            if not isinstance(s.get(key), str):
                raise GrammarError(f"structural_tag structures[{i}] needs a string '{key}'")
        schema = s.get("schema", s.get("schema_", {}))
        if not isinstance(schema, (dict, bool)):
            raise GrammarError(f"structural_tag structures[{i}] 'schema' must be a JSON schema object")
        if not any(s["begin"].startswith(t) for t in triggers):
            raise GrammarError(f"structural_tag structures[{i}] begin {s['begin']!r} starts with no trigger")
        tags.append(xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(schema), end=s["end"]))
    return tags, triggers


def to_grammar(spec: GrammarSpec, any_whitespace: bool = True):
    """The xgrammar `Grammar` of a spec (no tokenizer). GrammarError naming the problem.
    `any_whitespace` False: JSON (a schema's, or any object / array) with json.dumps' separators
    (", " and ": ") and no other whitespace, so a key and its separator are forced as one string."""
    import xgrammar as xgr

    try:
        if spec.kind == "json_schema":
            if spec.text == ANY_JSON and any_whitespace:
                return xgr.Grammar.builtin_json_grammar()
            schema = ANY_JSON_SCHEMA if spec.text == ANY_JSON else spec.text
            return xgr.Grammar.from_json_schema(schema, any_whitespace=any_whitespace)
        if spec.kind == "regex":
            return xgr.Grammar.from_regex(spec.text)
        if spec.kind == "ebnf":
            return xgr.Grammar.from_ebnf(spec.text)
        tag = _structural_tag(spec.text)
        if isinstance(tag, tuple):
            return xgr.Grammar.from_structural_tag(*tag)
        return xgr.Grammar.from_structural_tag(tag)
    except GrammarError:
        raise
    except Exception as e:  # xgrammar raises RuntimeError / ValueError / its own errors
        raise GrammarError(f"invalid {spec.kind}: {_short(e)}") from None


def validate_spec(spec: Optional[GrammarSpec]) -> None:
    """GrammarError when the spec's grammar does not build (the request path's 400)."""
    if spec is not None:
        to_grammar(spec)


def _short(e: Exception) -> str:
    """xgrammar's message without its C++ source prefix (`[time] file.cc:83: ...`)."""
    text = str(e).strip()
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
        head, sep, rest = text.partition(": ")
        if sep and (".cc:" in head or ".h:" in head):
            text = rest
    return text.splitlines()[0] if text else type(e).__name__


def response_format_params(fmt: Any) -> dict[str, str]:
    """Sampling parameters of an OpenAI `response_format` (a pydantic model or dict): `text` none,
    `json_object` / `json_schema` a json_schema, `structural_tag` a structural_tag."""
    if fmt is None:
        return {}
    d = fmt.model_dump(by_alias=True) if hasattr(fmt, "model_dump") else dict(fmt)
    kind = d.get("type")
    if kind in (None, "text"):
        return {}
    if kind == "json_object":
        return {"json_schema": JSON_OBJECT_SCHEMA}
    if kind == "json_schema":
        body = d.get("json_schema")
        if not isinstance(body, dict):
            raise GrammarError("response_format json_schema needs a 'json_schema' object with a 'schema'")
        schema = body.get("schema", body.get("schema_"))
        if schema is None:
            return {"json_schema": ANY_JSON}
        return {"json_schema": as_text("json_schema", schema)}
    if kind == "structural_tag":
        return {"structural_tag": json.dumps(d)}
    raise GrammarError(
        f"response_format type {kind!r} is not supported (text, json_object, json_schema, structural_tag)"
    )
