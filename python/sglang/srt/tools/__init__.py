"""Command-line helpers (`python -m sglang.srt.tools.<name>`)."""
