"""How a ServerArgs field is declared and how the fields become `launch_server` flags.

A field is declared with `arg(default, help, group, choices, aliases)`: its one line of `--help`,
its group there (upstream's group names), its accepted values and upstream's other spellings live
in that one place. argparse is built from the fields (flag = `--` + name with `-`), so every flag
is also an `sgl.Engine(...)` keyword. Knows no ServerArgs: the dataclass is an argument.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys
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
    "dtype": {
        "half": ("float16", "upstream's name for float16"),
        "float": ("float32", "upstream's name for float32"),
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


def _is_list(type_str: Any) -> bool:
    return "list[" in str(type_str)


def _parse_type(type_str: Any):
    text = str(type_str).replace("Optional[", "")
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
        if accepted is not None:  # upstream's spellings of a value are accepted and normalised
            accepted += [a for a in VALUE_ALIASES.get(f.name, {}) if a not in accepted]
        group.add_argument(
            *names,
            dest=f.name,
            type=_parse_type(f.type),
            nargs="+" if _is_list(f.type) else None,
            default=f.default,
            choices=accepted,
            help=help_text,
        )


class LaunchArgumentParser(argparse.ArgumentParser):
    """argparse with upstream's `--config file.yaml` (its flags first, so the command line
    overrides them) and, for upstream flags this engine does not take, a refusal naming the flag
    and what to use instead (`upstream_flags`: flag -> hint); a flag nobody knows gets argparse's
    error with the closest flag."""

    def __init__(self, *args: Any, upstream_flags: Optional[Mapping[str, str]] = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.upstream_flags = dict(upstream_flags or {})
        self.add_argument(
            "--config",
            help="A YAML file of flags (name: value, `-` or `_` in names); the command line overrides it.",
        )

    def parse_args(self, args: Optional[Sequence[str]] = None, namespace: Any = None) -> argparse.Namespace:
        argv = self._expand_config(list(sys.argv[1:] if args is None else args))
        parsed, extras = self.parse_known_args(argv, namespace)
        if extras:
            self.error(self._unrecognized(extras))
        return parsed

    def _unrecognized(self, extras: list[str]) -> str:
        for item in extras:
            name = item.split("=", 1)[0]
            if name in self.upstream_flags:
                return f"upstream flag {name} is not supported by this engine ({self.upstream_flags[name]})"
        message = f"unrecognized arguments: {' '.join(extras)}"
        unknown = [x.split("=", 1)[0] for x in extras if x.startswith("--")]
        close = (
            difflib.get_close_matches(unknown[0], list(self._option_string_actions), n=1) if unknown else []
        )
        return message + (f" (did you mean {close[0]}?)" if close else "")

    def _expand_config(self, argv: list[str]) -> list[str]:
        """`--config PATH` replaced by the flags of its YAML mapping, put first (the rest of the
        command line overrides them)."""
        for i, item in enumerate(argv):
            if item == "--config" or item.startswith("--config="):
                if "=" in item:
                    path, rest = item.split("=", 1)[1], argv[i + 1 :]
                elif i + 1 < len(argv):
                    path, rest = argv[i + 1], argv[i + 2 :]
                else:
                    self.error("argument --config: expected a YAML file")
                return self._config_args(path) + argv[:i] + rest
        return argv

    def _config_args(self, path: str) -> list[str]:
        import yaml

        if not os.path.isfile(path):
            self.error(f"--config {path}: no such file")
        with open(path, encoding="utf-8") as f:
            try:
                data = yaml.safe_load(f)
            except yaml.YAMLError as err:
                self.error(f"--config {path}: not valid YAML ({err})")
        if data is None:
            return []
        if not isinstance(data, dict):
            self.error(f"--config {path}: expected a mapping of flag names to values")
        out: list[str] = []
        for key, value in data.items():
            name = "--" + str(key).lstrip("-").replace("_", "-")
            action = self._option_string_actions.get(name)
            if action is None or name == "--config":
                hint = self.upstream_flags.get(name)
                why = f"upstream flag {name} is not supported by this engine ({hint})" if hint else "unknown"
                self.error(f"--config {path}: key {key!r}: {why}")
            if isinstance(action, argparse._StoreTrueAction):
                if not isinstance(value, bool):
                    self.error(f"--config {path}: key {key!r} is a switch: true or false, got {value!r}")
                out += [name] if value else []
            elif isinstance(value, list):
                out += [name, *(str(v) for v in value)]
            elif value is not None:
                out += [name, str(value).lower() if isinstance(value, bool) else str(value)]
        return out


def build_parser(cls: type, choices: Optional[Mapping[str, Sequence[str]]] = None) -> argparse.ArgumentParser:
    """The `python -m sglang.launch_server` parser of dataclass `cls` (its `UPSTREAM_FLAGS`:
    upstream's flags refused by name)."""
    parser = LaunchArgumentParser(
        prog="python -m sglang.launch_server",
        description="Serve a model over HTTP: SGLang's native /generate and the OpenAI-compatible /v1 API.",
        upstream_flags=getattr(cls, "UPSTREAM_FLAGS", None),
    )
    add_cli_args(parser, cls, choices)
    return parser
