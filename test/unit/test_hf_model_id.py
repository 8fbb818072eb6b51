"""Hugging Face model ids in --model-path / --tokenizer-path: resolved from an HF cache layout the
fixture writes (models--Org--Name/snapshots/<hash>/, refs/main), with the network off
(HF_HUB_OFFLINE=1, HF_HUB_CACHE pointing at it); --revision picks another snapshot; an absent id
offline is a ValueError naming the id and the cache, printed by the CLI as one error line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from sglang.srt.entrypoints.cli import server_args_from_argv
from sglang.srt.model_loader.hf_resolve import (
    hub_id_of_snapshot,
    cached_snapshot,
    looks_like_model_id,
    resolve_model_id,
    select_repo_files,
)
from sglang.srt.server_args import ServerArgs
from sglang.test.tiny_models import TINY_LLAMA_DIR, write_random_checkpoint

MODEL_ID = "TinyOrg/tiny-llama"
MAIN_HASH = "a" * 40
V2_HASH = "b" * 40


def write_hf_cache(cache_dir, model_id: str = MODEL_ID) -> dict[str, str]:
    """An HF hub cache with two snapshots of a seeded random tiny Llama: refs/main -> MAIN_HASH (seed 0),
    refs/v2 -> V2_HASH (seed 1). Returns {revision: snapshot dir}."""
    repo = os.path.join(str(cache_dir), "models--" + model_id.replace("/", "--"))
    out = {}
    for ref, commit, seed in (("main", MAIN_HASH, 0), ("v2", V2_HASH, 1)):
        snapshot = os.path.join(repo, "snapshots", commit)
        write_random_checkpoint(TINY_LLAMA_DIR, snapshot, seed=seed)
        os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
        with open(os.path.join(repo, "refs", ref), "w", encoding="utf-8") as f:
            f.write(commit)
        out[ref] = snapshot
    return out


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hf-hub")
    return str(cache), write_hf_cache(cache)


@pytest.fixture
def offline(monkeypatch, hf_cache):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", hf_cache[0])
    return hf_cache


def test_looks_like_model_id():
    assert looks_like_model_id("Qwen/Qwen2.5-0.5B-Instruct")
    assert looks_like_model_id("gpt2")
    for path in ("/abs/path", "./rel", "~/models/x", "a/b/c", "x.gguf", "a--b/c", "dummy:x", ""):
        assert not looks_like_model_id(path), path


def test_select_repo_files_prefers_safetensors_and_skips_subfolders():
    repo = [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "README.md",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "onnx/model.onnx",
        "onnx/config.json",
    ]
    picked = select_repo_files(repo)
    assert "pytorch_model.bin" not in picked and "README.md" not in picked
    assert not any(f.startswith("onnx/") for f in picked)
    assert {"config.json", "tokenizer.json", "chat_template.jinja", "model.safetensors.index.json"} <= set(
        picked
    )
    assert select_repo_files(repo, "pt") == [f for f in picked if "safetensors" not in f] + [
        "pytorch_model.bin"
    ]
    bin_only = [
        "config.json",
        "pytorch_model-00001-of-00002.bin",
        "pytorch_model.bin.index.json",
        "training.md",
    ]
    assert select_repo_files(bin_only) == ["config.json", "pytorch_model-00001-of-00002.bin", bin_only[2]]
    dummy = select_repo_files(repo, "dummy")  # random weights: the config and tokenizer only
    assert "config.json" in dummy and not any(f.endswith((".safetensors", ".bin")) for f in dummy)


def test_cached_snapshot_by_branch_tag_and_commit(hf_cache):
    cache, snaps = hf_cache
    assert cached_snapshot(MODEL_ID, None, cache) == snaps["main"]
    assert cached_snapshot(MODEL_ID, "v2", cache) == snaps["v2"]
    assert cached_snapshot(MODEL_ID, V2_HASH, cache) == snaps["v2"]
    assert cached_snapshot(MODEL_ID, "c" * 40, cache) is None
    assert cached_snapshot("TinyOrg/absent", None, cache) is None


def test_resolve_offline_from_cache_and_revision(offline):
    _, snaps = offline
    assert resolve_model_id(MODEL_ID) == snaps["main"]
    assert resolve_model_id(MODEL_ID, revision="v2") == snaps["v2"]
    assert resolve_model_id(MODEL_ID, revision=V2_HASH) == snaps["v2"]
    assert resolve_model_id(TINY_LLAMA_DIR) == TINY_LLAMA_DIR  # a local path is used as it is


def test_download_dir_overrides_env(offline, tmp_path, monkeypatch):
    cache, snaps = offline
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # empty: only --download-dir has the model
    assert resolve_model_id(MODEL_ID, download_dir=cache) == snaps["main"]
    with pytest.raises(ValueError, match=str(tmp_path)):
        resolve_model_id(MODEL_ID)


def test_hf_home_is_honoured(offline, tmp_path, monkeypatch):
    cache, snaps = offline
    home = tmp_path / "hf-home"
    shutil.copytree(cache, home / "hub", symlinks=True)
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(home))
    assert resolve_model_id(MODEL_ID) == os.path.join(
        str(home / "hub"), os.path.relpath(snaps["main"], cache)
    )


def test_offline_absent_names_id_and_cache(offline):
    cache, _ = offline
    with pytest.raises(ValueError) as err:
        resolve_model_id("TinyOrg/not-downloaded")
    assert "TinyOrg/not-downloaded" in str(err.value) and cache in str(err.value)
    assert "HF_HUB_OFFLINE" in str(err.value)
    with pytest.raises(ValueError, match="'v9'"):
        resolve_model_id(MODEL_ID, revision="v9")


def test_cli_resolves_once_and_keeps_the_id_as_served_name(offline):
    _, snaps = offline
    args = server_args_from_argv(
        ["--model-path", MODEL_ID, "--revision", "v2", "--load-format", "safetensors"]
    )
    assert args.model_path == snaps["v2"] and args.tokenizer_path == snaps["v2"]
    assert args.served_model_name == MODEL_ID
    assert args.revision == "v2"
    # a separate tokenizer id resolves on its own; the args are unchanged by a second resolve
    args = server_args_from_argv(["--model-path", snaps["main"], "--tokenizer-path", MODEL_ID])
    assert args.model_path == snaps["main"] and args.tokenizer_path == snaps["main"]
    assert ServerArgs.from_kwargs(model_path=MODEL_ID, load_format="dummy").model_path == MODEL_ID


def test_server_info_reports_the_hub_id_as_given(offline):
    """/get_server_info shows `model_path` / `tokenizer_path` as the user gave them (an id, as
    upstream), not the cache snapshot every process loads from; a local path stays a path."""
    import dataclasses
    from types import SimpleNamespace

    from sglang.srt.entrypoints.engine import server_info
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput

    @dataclasses.dataclass
    class Info:
        max_total_num_tokens: int = 8

    _, snaps = offline
    state = GetInternalStateReqOutput(state={"num_running_reqs": 0})
    for argv, shown in (
        (["--model-path", MODEL_ID, "--load-format", "safetensors"], MODEL_ID),
        (["--model-path", snaps["main"], "--served-model-name", "mine"], snaps["main"]),
    ):
        args = server_args_from_argv(argv)
        tm = SimpleNamespace(server_args=args, scheduler_info=Info(), num_running=0)
        info = server_info(tm, state)
        assert info["model_path"] == info["tokenizer_path"] == shown
        assert info["max_total_num_tokens"] == 8
    assert hub_id_of_snapshot(snaps["v2"]) == MODEL_ID and hub_id_of_snapshot(TINY_LLAMA_DIR) is None


def test_launch_server_prints_offline_error_without_traceback(offline, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", "TinyOrg/not-downloaded"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "TinyOrg/not-downloaded" in proc.stderr
    assert str(tmp_path) in proc.stderr and "Traceback" not in proc.stderr


class FakeHub:
    """huggingface_hub's listing and download, recorded (no network here)."""

    def __init__(self, files, snapshot_dir=None, error=None):
        self.files, self.snapshot_dir, self.error, self.calls = files, snapshot_dir, error, []

    def install(self, monkeypatch):
        import huggingface_hub

        hub = self

        class Api:
            def list_repo_files(self, repo_id, revision=None):
                hub.calls.append(("list", repo_id, revision))
                if hub.error is not None:
                    raise hub.error
                return hub.files

        def snapshot_download(repo_id, **kw):
            hub.calls.append(("download", repo_id, kw))
            return hub.snapshot_dir

        monkeypatch.setattr(huggingface_hub, "HfApi", Api)
        monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
        return self


@pytest.fixture
def online(monkeypatch, hf_cache):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", hf_cache[0])
    return hf_cache


def test_online_cache_hit_makes_no_network_call(online, monkeypatch):
    hub = FakeHub([], error=AssertionError("network used")).install(monkeypatch)
    assert resolve_model_id(MODEL_ID) == online[1]["main"]
    assert hub.calls == []


def test_online_download_only_the_files_the_loader_reads(online, monkeypatch, tmp_path):
    files = [
        "config.json",
        "tokenizer.json",
        "README.md",
        "model.safetensors",
        "pytorch_model.bin",
        "onnx/x.onnx",
    ]
    hub = FakeHub(files, snapshot_dir=str(tmp_path)).install(monkeypatch)
    assert resolve_model_id("TinyOrg/remote", revision="v1", download_dir=str(tmp_path / "dl")) == str(
        tmp_path
    )
    (_, repo, revision), (_, repo2, kw) = hub.calls
    assert (repo, revision, repo2) == ("TinyOrg/remote", "v1", "TinyOrg/remote")
    assert kw["allow_patterns"] == ["config.json", "tokenizer.json", "model.safetensors"]
    assert kw["cache_dir"] == str(tmp_path / "dl") and kw["revision"] == "v1"


def test_online_incomplete_cache_downloads_and_unknown_id_names_it(online, monkeypatch, tmp_path):
    cache, snaps = online
    partial = os.path.join(cache, "models--TinyOrg--partial", "snapshots", MAIN_HASH)
    os.makedirs(partial)
    shutil.copyfile(os.path.join(snaps["main"], "config.json"), os.path.join(partial, "config.json"))
    refs = os.path.join(cache, "models--TinyOrg--partial", "refs")
    os.makedirs(refs)
    with open(os.path.join(refs, "main"), "w", encoding="utf-8") as f:
        f.write(MAIN_HASH)
    hub = FakeHub(["config.json", "model.safetensors"], snapshot_dir=partial).install(monkeypatch)
    assert resolve_model_id("TinyOrg/partial") == partial  # config only: the weights are fetched
    assert [c[0] for c in hub.calls] == ["list", "download"]
    FakeHub([], error=RuntimeError("404 Repository Not Found")).install(monkeypatch)
    with pytest.raises(ValueError, match="TinyOrg/typo.*404 Repository Not Found"):
        resolve_model_id("TinyOrg/typo")


def test_gguf_repo_resolves_to_its_one_file_and_several_are_named(online, monkeypatch, tmp_path):
    """A GGUF-only repo: only its .gguf is downloaded and the path is that file (config and
    tokenizer are in it); a second resolve finds it in the cache; several files: an error naming them."""
    snap = tmp_path / "models--Org--tiny-GGUF" / "snapshots" / MAIN_HASH
    hub = FakeHub(["README.md", "config.json", "tiny-Q8_0.gguf"], snapshot_dir=str(snap)).install(monkeypatch)
    got = resolve_model_id("Org/tiny-GGUF", download_dir=str(tmp_path))
    assert got == str(snap / "tiny-Q8_0.gguf") and hub.calls[1][2]["allow_patterns"] == ["tiny-Q8_0.gguf"]
    assert hub_id_of_snapshot(got) == "Org/tiny-GGUF"
    snap.mkdir(parents=True)
    (snap / "tiny-Q8_0.gguf").write_bytes(b"GGUF")
    (tmp_path / "models--Org--tiny-GGUF" / "refs").mkdir()
    (tmp_path / "models--Org--tiny-GGUF" / "refs" / "main").write_text(MAIN_HASH)
    FakeHub([], error=AssertionError("network used")).install(monkeypatch)
    assert resolve_model_id("Org/tiny-GGUF", download_dir=str(tmp_path)) == got
    args = server_args_from_argv(["--model-path", "Org/tiny-GGUF", "--download-dir", str(tmp_path)])
    assert args.model_path == args.tokenizer_path == got  # the tokenizer is in the same file
    FakeHub(["a-Q4_0.gguf", "a-Q8_0.gguf"], snapshot_dir=str(snap)).install(monkeypatch)
    with pytest.raises(ValueError, match="2 files \\(a-Q4_0.gguf, a-Q8_0.gguf\\).*local path"):
        resolve_model_id("Org/two-GGUF", download_dir=str(tmp_path))
    # a repo with HF weights and a .gguf: auto keeps the HF weights; --load-format gguf takes the file
    hub = FakeHub(["config.json", "model.safetensors", "m.gguf"], snapshot_dir=str(snap)).install(monkeypatch)
    assert resolve_model_id("Org/both", download_dir=str(tmp_path)) == str(snap)
    assert resolve_model_id("Org/both", download_dir=str(tmp_path), load_format="gguf") == str(
        snap / "m.gguf"
    )
