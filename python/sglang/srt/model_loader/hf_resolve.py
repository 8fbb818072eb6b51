"""A `--model-path` / `--tokenizer-path` that is a Hugging Face model id, turned into a local directory.

Resolved once, at start-up in the launching process (`resolve_model_paths`, called by the CLI and by
`Engine` before any process is spawned), so every later reader (config, tokenizer, weights, every
rank) sees the same local snapshot directory; `served_model_name` stays the id as given, as upstream.

Order: a path that exists locally is used as it is; otherwise an id is looked up in the local HF cache
(`--download-dir`, else `HF_HUB_CACHE` / `HF_HOME`, read when called) at `--revision` (a branch, tag
or commit; default `main`); a complete snapshot there (config.json and weights) is used without a
network call. Else, unless offline (`HF_HUB_OFFLINE=1` or `TRANSFORMERS_OFFLINE=1`), only the files
the loader reads are downloaded with `huggingface_hub` (its tqdm progress bar): config and tokenizer
files, the chat template, generation_config.json, and the weights of one format (safetensors, else
torch `.bin`). Offline and absent, or not found on the Hub: a ValueError naming the id and the cache.
A GGUF repo (no safetensors / `.bin`, `.gguf` files: the file holds config and tokenizer) resolves
to its one `.gguf` file; with several, the error lists them (download one, pass its path).
"""

from __future__ import annotations

import fnmatch
import os
import re
from typing import Any, Optional

# Files of a model repo the engine reads (top-level only), besides the weights.
CONFIG_PATTERNS = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
WEIGHT_PATTERNS = {
    "safetensors": ("*.safetensors", "model.safetensors.index.json"),
    "pt": ("*.bin", "pytorch_model.bin.index.json"),
}
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_REPO_ID_RE = re.compile(r"^(?:[\w.-]+/)?[\w.-]+$")
_TRUE = ("1", "on", "yes", "true")


def is_offline() -> bool:
    """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE, read now (huggingface_hub reads them once, at import)."""
    from huggingface_hub import constants

    env = [os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", "")]
    return any(v.strip().lower() in _TRUE for v in env) or bool(constants.HF_HUB_OFFLINE)


def hf_cache_dir(download_dir: Optional[str] = None) -> str:
    """Where model snapshots live: `--download-dir`, else HF_HUB_CACHE, else $HF_HOME/hub, else the default."""
    if download_dir:
        return os.path.abspath(os.path.expanduser(download_dir))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return os.path.expanduser(os.environ[var])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def looks_like_model_id(path: str) -> bool:
    """`org/name` or `name` as the Hub spells ids (not a path that starts with `/`, `.` or `~`)."""
    if not path or path.startswith(("/", ".", "~")) or "--" in path or ".." in path:
        return False
    return bool(_REPO_ID_RE.match(path)) and len(path) <= 96 and not path.endswith((".gguf", ".git"))


def _repo_folder(cache_dir: str, model_id: str) -> str:
    return os.path.join(cache_dir, "models--" + model_id.replace("/", "--"))


def cached_snapshot(model_id: str, revision: Optional[str], cache_dir: str) -> Optional[str]:
    """The cached snapshot directory of `model_id` at `revision` (branch, tag or commit), or None."""
    folder = _repo_folder(cache_dir, model_id)
    revision = revision or "main"
    commit = revision if _COMMIT_RE.match(revision) else None
    ref = os.path.join(folder, "refs", revision)
    if commit is None and os.path.isfile(ref):
        with open(ref, encoding="utf-8") as f:
            commit = f.read().strip()
    snapshot = os.path.join(folder, "snapshots", commit) if commit else None
    return snapshot if snapshot and os.path.isdir(snapshot) else None


def has_weights(directory: str) -> bool:
    """config.json and weight files of some format the loader reads."""
    if not os.path.isfile(os.path.join(directory, "config.json")):
        return False
    names = os.listdir(directory)
    return any(n.endswith((".safetensors", ".bin", ".gguf")) for n in names)


def select_repo_files(repo_files: list[str], load_format: str = "auto") -> list[str]:
    """The top-level files of a repo the loader reads: config / tokenizer files and one weight format
    (`auto`: safetensors when the repo has them, else `.bin`)."""
    top = [f for f in repo_files if "/" not in f]
    wanted = [f for f in top if f in CONFIG_PATTERNS]
    formats = ("safetensors", "pt") if load_format in ("auto", "dummy") else (load_format,)
    for fmt in formats:
        patterns = WEIGHT_PATTERNS.get(fmt, ())
        weights = [f for f in top if any(fnmatch.fnmatch(f, p) for p in patterns)]
        if any(not f.endswith(".json") for f in weights):
            return wanted + (weights if load_format != "dummy" else [])
    return wanted


def _missing_message(model_id: str, revision: Optional[str], cache_dir: str, reason: str) -> str:
    at = f" at revision {revision!r}" if revision else ""
    return (
        f"model {model_id!r}{at} is not a local path and is not in the Hugging Face cache {cache_dir!r} "
        f"({reason}); download it first (e.g. `huggingface-cli download {model_id}` while online, "
        f"HF_HUB_CACHE or --download-dir naming the cache), or pass a local directory"
    )


def resolve_model_id(
    model_id: str,
    revision: Optional[str] = None,
    download_dir: Optional[str] = None,
    load_format: str = "auto",
) -> str:
    """A local directory for `model_id`: itself when it exists, else its HF snapshot (cached or
    downloaded). ValueError naming the id and the cache directory when it cannot be had."""
    if os.path.exists(model_id) or not looks_like_model_id(model_id):
        return model_id
    cache_dir = hf_cache_dir(download_dir)
    snapshot = cached_snapshot(model_id, revision, cache_dir)
    if snapshot is not None and load_format in ("auto", "gguf") and not has_weights(snapshot):
        ggufs = sorted(n for n in os.listdir(snapshot) if n.endswith(".gguf"))
        if len(ggufs) == 1:  # a GGUF repo's one file, fetched earlier
            return os.path.join(snapshot, ggufs[0])
    if snapshot is not None and (has_weights(snapshot) or load_format == "dummy" or is_offline()):
        return snapshot
    if is_offline():
        raise ValueError(_missing_message(model_id, revision, cache_dir, "HF_HUB_OFFLINE is set"))
    return _download(model_id, revision, cache_dir, load_format)


def _download(model_id: str, revision: Optional[str], cache_dir: str, load_format: str) -> str:
    """Download the files the loader reads into the HF cache; their snapshot directory."""
    from huggingface_hub import HfApi, snapshot_download

    try:
        files = HfApi().list_repo_files(model_id, revision=revision)
        gguf = _only_gguf(model_id, files, load_format)
        allow = [gguf] if gguf else select_repo_files(files, load_format)
        snapshot = snapshot_download(model_id, revision=revision, cache_dir=cache_dir, allow_patterns=allow)
        return os.path.join(snapshot, gguf) if gguf else snapshot
    except _GGUFChoice:
        raise
    except Exception as exc:  # noqa: BLE001 - no network, unknown id, gated repo: one clear error
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        raise ValueError(_missing_message(model_id, revision, cache_dir, reason)) from exc


class _GGUFChoice(ValueError):
    """A GGUF repo with several files: the user picks one."""


def _only_gguf(model_id: str, repo_files: list[str], load_format: str) -> Optional[str]:
    """The one top-level `.gguf` file of a repo without safetensors / `.bin` weights (a GGUF repo:
    the file carries config and tokenizer), or None. Several: `_GGUFChoice` naming them."""
    top = [f for f in repo_files if "/" not in f]
    ggufs = sorted(f for f in top if f.endswith(".gguf"))
    if not ggufs or load_format not in ("auto", "gguf"):
        return None
    if load_format == "auto" and any(f.endswith((".safetensors", ".bin")) for f in top):
        return None  # auto prefers the HF weights
    if len(ggufs) == 1:
        return ggufs[0]
    shown = ", ".join(ggufs[:8]) + (", ..." if len(ggufs) > 8 else "")
    raise _GGUFChoice(
        f"model {model_id!r} is a GGUF repo with {len(ggufs)} files ({shown}): download the one you want "
        f"(`huggingface-cli download {model_id} <file>.gguf`) and pass its local path as --model-path"
    )


_SNAPSHOT_RE = re.compile(r"(?:^|/)models--([\w.-]+?)(?:--([\w.-]+))?/snapshots/[^/]+(?:/[^/]+\.gguf)?/?$")


def hub_id_of_snapshot(path: str) -> Optional[str]:
    """`org/name` for a directory of the HF cache's layout (`.../models--org--name/snapshots/<commit>`),
    else None: what /get_server_info reports for a model given as a Hub id (as upstream, which
    passes the id through)."""
    m = _SNAPSHOT_RE.search(path[len("dummy:") :] if path.startswith("dummy:") else path)
    if m is None:
        return None
    return f"{m.group(1)}/{m.group(2)}" if m.group(2) else m.group(1)


def resolve_model_paths(args: Any) -> Any:
    """`args` (a ServerArgs) with `model_path` / `tokenizer_path` ids replaced by local snapshot
    directories (`served_model_name` keeps the id); unchanged when both are local paths."""
    changes = {}
    for name in ("model_path", "tokenizer_path"):
        value = getattr(args, name)
        if name == "tokenizer_path" and value == args.model_path and "model_path" in changes:
            changes[name] = changes["model_path"]  # the same id: its snapshot (or GGUF file) as well
            continue
        prefix = "dummy:" if value.startswith("dummy:") else ""
        fmt = "dummy" if prefix or name == "tokenizer_path" else args.load_format
        local = resolve_model_id(value[len(prefix) :], args.revision, args.download_dir, fmt)
        if prefix + local != value:
            changes[name] = prefix + local
    return args.replace(**changes) if changes else args
