"""Our GGUF header reader (`model_loader/gguf_file.py`) against `gguf.GGUFReader`, the format's
reference implementation: every metadata value and every tensor (name, type, shape, bytes) equal,
for the real SmolLM2 Q4_1 file and for written files with other tensor types and metadata kinds."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from sglang.srt.model_loader.gguf_file import read_gguf
from sglang.test.tiny_gguf import write_tiny_gguf
from sglang.test.tiny_models import TINY_QWEN3_DIR, write_random_checkpoint


def _assert_same(path: str) -> None:
    ours, ref = read_gguf(path), gguf.GGUFReader(path, "r")
    ref_fields = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert ours.fields == ref_fields
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(ours.tensors, ref.tensors):
        assert a.tensor_type == b.tensor_type, a.name
        assert a.shape == tuple(int(d) for d in b.shape), a.name
        assert a.data.shape == b.data.shape and a.data.dtype == b.data.dtype, a.name
        assert np.array_equal(a.data, b.data), a.name


def test_smollm2_file_reads_as_the_reference_reader_does():
    try:
        from sglang.srt.model_loader.default_model import find_default_model

        path = find_default_model()
    except RuntimeError as e:
        pytest.skip(f"default model not installed: {e}")
    _assert_same(path)


@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q4_1", "F16", "BF16"])
def test_written_files_read_as_the_reference_reader_does(tmp_path, qtype):
    hf_dir = write_random_checkpoint(TINY_QWEN3_DIR, str(tmp_path / "qwen3"), seed=4)
    path = write_tiny_gguf(hf_dir, str(tmp_path / f"m-{qtype}.gguf"), qtype=qtype)
    _assert_same(path)


def test_every_metadata_kind_and_a_long_header(tmp_path):
    """Scalars of each width, bools, nested and numeric arrays, and more header than the first read."""
    path = str(tmp_path / "kinds.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint8("k.u8", 7)
    w.add_int16("k.i16", -300)
    w.add_uint64("k.u64", 2**40 + 3)
    w.add_float64("k.f64", 0.1)
    w.add_float32("k.f32", 1e-5)
    w.add_bool("k.bool", True)
    w.add_array("k.ints", [1, -2, 3])
    w.add_array("k.floats", [0.5, 1.5])
    w.add_array("k.strs", ["a", "ü", ""])
    w.add_string("k.long", "x" * (3 << 20))  # past the reader's first 1 MiB
    w.add_tensor("t", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _assert_same(path)
    f = read_gguf(path)
    assert f.value("k.u64") == 2**40 + 3 and f.value("k.bool") is True and f.value("missing", 5) == 5
    assert f.tensors[0].data.tolist() == np.arange(12, dtype=np.float32).reshape(3, 4).tolist()


def test_not_a_gguf_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf(str(bad))
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(
        b"GGUF" + (3).to_bytes(4, "little") + (1).to_bytes(8, "little") + (5).to_bytes(8, "little")
    )
    with pytest.raises(ValueError, match="truncated"):
        read_gguf(str(truncated))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "F16", "BF16"])
def test_dequantization_is_bit_identical_to_ggufs(qtype):
    """Our torch block dequantization (Q8_0 / Q4_0 / Q4_1; others go through gguf) against
    `gguf.quants.dequantize` on random rows, compared bit for bit."""
    from gguf.quants import dequantize, quantize

    from sglang.srt.model_loader.gguf_dequant import dequantize_gguf

    kind = gguf.GGMLQuantizationType[qtype]
    values = np.random.default_rng(0).standard_normal((7, 96)).astype(np.float32) * 3
    data = quantize(values, kind)
    ours = dequantize_gguf(data, kind)
    ref = np.asarray(dequantize(data, kind), dtype=np.float32)
    assert ours.shape == ref.shape == values.shape
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))
