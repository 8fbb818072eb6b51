"""How a ServerArgs field is declared and how the fields become `launch_server` flags.

A field is declared with `arg(default, help, group, choices, aliases)`: its one line of `--help`,
its group there (upstream's group names), its accepted values and upstream's other spellings live
in that one place. argparse is built from the fields (flag = `--` + name with `-`), so every flag
is also an `sgl.Engine(...)` keyword. Knows no ServerArgs: the dataclass is an argument.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import field, fields
from typing import Any, Callable, Mapping, Optional, Sequence, Union

# Argument groups of `--help`, in upstream SGLang's order and with its names (ours adds
# "Context parallelism" and "Compatibility"; upstream keeps those flags under other headings).
G_MODEL = "Model and tokenizer"
G_HTTP = "HTTP server"
G_DTYPE = "Quantization and data type"
G_MEMORY = "Memory and scheduling"
G_RUNTIME = "Runtime options"
G_CP = "Context parallelism"
G_LOGGING = "Logging"
G_API = "API related"
G_DP = "Data parallelism"
G_MULTI_NODE = "Multi-node distributed serving"
G_KERNELS = "Kernel backends"
G_MOE = "MoE"
G_OPTIMIZATION = "Optimization/debug options"
G_PD = "PD disaggregation"
G_COMPAT = "Upstream flags accepted for compatibility"
GROUP_ORDER = (
    G_MODEL,
    G_HTTP,
    G_DTYPE,
    G_MEMORY,
    G_RUNTIME,
    G_CP,
    G_LOGGING,
    G_API,
    G_DP,
    G_MULTI_NODE,
    G_KERNELS,
    G_MOE,
    G_OPTIMIZATION,
    G_PD,
    G_COMPAT,
)

# Upstream spellings that mean one of our values (accepted, normalised, logged at start-up).
VALUE_ALIASES = {
    "cp_strategy": {
        "interleave": ("round-robin", "upstream's name for round-robin: token i goes to CP rank i mod cp")
    },
}


def arg(
    default: Any,
    help: str,
    group: str,
    choices: Union[Sequence[str], Callable[[], Sequence[str]], None] = None,
    aliases: Sequence[str] = (),
    default_text: Optional[str] = None,
) -> Any:
    """A ServerArgs field and its flag, declared in one place: default, one line of help, the
    `--help` group, the accepted values (a list, or a function returning it), extra upstream
    spellings of the flag and, for a None default resolved later, what it resolves to. `help`
    says what the flag does; `--help` appends the choices' meaning and the default itself.

    Values known only to the model layer (the registered attention backends) are not declared
    here: the entry point passes them to `add_cli_args` and checks them at start-up."""
    meta = {
        "help": help,
        "group": group,
        "choices": choices,
        "aliases": tuple(aliases),
        "default_text": default_text,
    }
    return field(default=default, metadata=meta)


def field_choices(f: dataclasses.Field) -> Optional[list[str]]:
    choices = f.metadata.get("choices")
    if callable(choices):
        choices = choices()
    return list(choices) if choices is not None else None


def flag(name: str) -> str:
    """The flag of a field, without its leading `--` (`tp_size` -> `tp-size`)."""
    return name.replace("_", "-")


def _parse_type(type_str: Any):
    text = str(type_str)
    if "float" in text:
        return float
    if "int" in text:
        return int
    return str


def add_cli_args(
    parser: argparse.ArgumentParser, cls: type, choices: Optional[Mapping[str, Sequence[str]]] = None
) -> None:
    """One flag per field of dataclass `cls`, in upstream's groups; each help line ends with the
    default. `choices` gives the accepted values of fields that do not declare them."""
    choices = choices or {}
    groups = {name: parser.add_argument_group(name) for name in GROUP_ORDER}
    for f in fields(cls):
        group = groups[f.metadata["group"]]
        names = ["--" + flag(f.name), *f.metadata["aliases"]]
        default = f.metadata.get("default_text") or ("off" if f.type in ("bool", bool) else f.default)
        default = "none" if default is None else default
        help_text = f"{f.metadata['help']} (default: {default})".replace("%", "%%")
        if f.type in ("bool", bool):
            group.add_argument(*names, dest=f.name, action="store_true", default=f.default, help=help_text)
            continue
        accepted = field_choices(f)
        if accepted is None and f.name in choices:
            accepted = list(choices[f.name])
        group.add_argument(
            *names, dest=f.name, type=_parse_type(f.type), default=f.default, choices=accepted, help=help_text
        )


def build_parser(cls: type, choices: Optional[Mapping[str, Sequence[str]]] = None) -> argparse.ArgumentParser:
    """The `python -m sglang.launch_server` parser of dataclass `cls`."""
    parser = argparse.ArgumentParser(
        prog="python -m sglang.launch_server",
        description="Serve a model over HTTP: SGLang's native /generate and the OpenAI-compatible /v1 API.",
    )
    add_cli_args(parser, cls, choices)
    return parser
