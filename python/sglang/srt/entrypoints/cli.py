"""`python -m sglang.launch_server` arguments to checked ServerArgs.

argparse refuses a value outside a flag's choices, the registered attention backends included
(the model layer gives them: `configs/startup_checks.flag_choices`); then the flags are checked
against each other (`ServerArgs.validate`) and against the model layer and the checkpoint
(`check_server_args_against_model`), before anything starts. Every refusal but argparse's is a
ValueError naming the flag.
"""

from __future__ import annotations

from sglang.srt.entrypoints.openai.chat_templates import resolve_chat_template
from sglang.srt.configs.startup_checks import check_server_args_against_model, flag_choices
from sglang.srt.model_loader.hf_resolve import resolve_model_paths
from sglang.srt.server_args import ServerArgs, prepare_server_args


def server_args_from_argv(argv: list[str]) -> ServerArgs:
    """Parse and check `launch_server` arguments (SystemExit from argparse, ValueError after)."""
    server_args = resolve_model_paths(prepare_server_args(argv, choices=flag_choices()))
    check_server_args(server_args)
    return server_args


def check_server_args(server_args: ServerArgs) -> None:
    """All the start-up checks of the flags: among themselves, then against the model layer."""
    server_args.validate()
    resolve_chat_template(server_args.chat_template)  # a name, a file or Jinja text
    check_server_args_against_model(server_args)
