"""sglang: a clean-room, SGLang-compatible LLM serving engine."""

from sglang.version import __version__


def __getattr__(name):
    # Lazy so that `import sglang` stays cheap for CLI tools and subprocesses.
    if name == "Engine":
        from sglang.srt.entrypoints.engine import Engine

        return Engine
    raise AttributeError(name)


__all__ = ["Engine", "__version__"]
