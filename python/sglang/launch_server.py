"""`python -m sglang.launch_server [flags]`: start the HTTP server (flags = ServerArgs fields)."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from sglang.srt.entrypoints.cli import server_args_from_argv

    try:
        server_args = server_args_from_argv(argv)
    except (ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    from sglang.srt.entrypoints.http_server import launch_server

    try:
        launch_server(server_args)
    except KeyboardInterrupt:
        return 0
    except Exception as err:  # noqa: BLE001 - start-up failure (a child's traceback is in the message)
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
