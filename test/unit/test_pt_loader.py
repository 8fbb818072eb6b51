"""`--load-format pt`: torch `.bin` checkpoints (single file, and shards named by the index json) give
the same tensors as the safetensors copy; `auto` picks safetensors first, then `.bin`."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from sglang.srt.model_loader.loader import iter_weights, resolve_load_format
from sglang.srt.model_loader.pt_loader import list_pt_files
from sglang.test.bin_checkpoints import safetensors_to_bin
from sglang.test.tiny_models import TINY_LLAMA_DIR, write_random_checkpoint


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("pt")
    st = write_random_checkpoint(TINY_LLAMA_DIR, str(root / "st"), seed=3)
    return (
        st,
        safetensors_to_bin(st, str(root / "bin1")),
        safetensors_to_bin(st, str(root / "bin3"), shards=3),
    )


@pytest.mark.parametrize("which", [1, 2])
def test_bin_equals_safetensors(checkpoints, which):
    st, bin_dir = checkpoints[0], checkpoints[which]
    ref = dict(iter_weights(st, "safetensors"))
    got = dict(iter_weights(bin_dir, "pt"))
    assert sorted(got) == sorted(ref) and len(ref) > 5
    for name, tensor in ref.items():
        assert torch.equal(got[name], tensor), name
    bf16 = dict(iter_weights(bin_dir, "pt", "bfloat16"))
    assert all(t.dtype == torch.bfloat16 for t in bf16.values())


def test_sharded_files_come_from_the_index(checkpoints, tmp_path):
    bin3 = checkpoints[2]
    files = [os.path.basename(p) for p in list_pt_files(bin3)]
    assert files == [f"pytorch_model-0000{i}-of-00003.bin" for i in (1, 2, 3)]
    broken = shutil.copytree(bin3, tmp_path / "broken")
    os.remove(broken / "pytorch_model-00002-of-00003.bin")
    with pytest.raises(FileNotFoundError, match="00002-of-00003"):
        list_pt_files(str(broken))


def test_auto_picks_safetensors_then_bin(checkpoints, tmp_path):
    st, bin1, _ = checkpoints
    assert resolve_load_format(bin1) == "pt"
    assert resolve_load_format(st) == "safetensors"
    both = shutil.copytree(st, tmp_path / "both")
    shutil.copyfile(os.path.join(bin1, "pytorch_model.bin"), both / "pytorch_model.bin")
    assert resolve_load_format(str(both)) == "safetensors"
    assert resolve_load_format(str(both), "pt") == "pt"
    with pytest.raises(ValueError, match="torch \\*.bin"):
        resolve_load_format(st, "pt")
    (tmp_path / "empty").mkdir()
    shutil.copyfile(os.path.join(st, "config.json"), tmp_path / "empty" / "config.json")
    (tmp_path / "empty" / "training_args.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="safetensors or torch"):
        resolve_load_format(str(tmp_path / "empty"))


def test_progress_bar_quiet_off_a_terminal_and_off_rank0(monkeypatch, capsys):
    from sglang.srt.model_loader import progress as progress_mod

    items = [1, 2, 3]
    assert progress_mod.progress(items, "Loading") is items  # stderr is not a terminal here: no bar
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress_mod, "is_rank0", lambda: False)
    assert progress_mod.progress(items, "Loading") is items  # other ranks: no bar at all
