"""gshard_mt.hf.safetensors: files read back as written for every dtype, one file or shards as transformers names
them, the layout checked byte by byte by hand, the committed transformers fixtures read, and every bad file a
one-line error naming the file and the tensor."""

import json
import struct

import ml_dtypes
import numpy as np
import pytest

from gshard_mt.errors import UserError, WorkdirError
from gshard_mt.hf import safetensors
from tests.helpers import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "hf"


def every_dtype() -> dict[str, np.ndarray]:
  rng = np.random.default_rng(0)
  floats = rng.normal(size=(3, 5))
  return {"f64": floats, "f32": floats.astype(np.float32), "f16": floats.astype(np.float16),
          "bf16": floats.astype(ml_dtypes.bfloat16), "i64": np.arange(-6, 6, dtype=np.int64).reshape(2, 3, 2),
          "i32": np.array([-(2**31), 2**31 - 1], np.int32), "i16": np.array([-7, 300], np.int16),
          "i8": np.array([-128, 127, 0], np.int8), "u8": np.array([0, 255, 7], np.uint8),
          "bool": np.array([[True, False], [False, True]]), "scalar": np.float32(2.5), "empty": np.zeros((0, 4)),
          "big_endian": np.array([1.5, -2.25], ">f4"), "strided": floats.astype(np.float32)[:, ::2]}


def raw_file(path, header: dict, data: bytes = b"", length: int | None = None):
  text = json.dumps(header).encode()
  path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)
  return path


def test_every_dtype_reads_back_as_written(tmp_path):
  arrays = every_dtype()
  size = safetensors.write_file(tmp_path / "x.safetensors", arrays, {"format": "pt"})
  checkpoint = safetensors.open(tmp_path / "x.safetensors")
  assert size == (tmp_path / "x.safetensors").stat().st_size
  assert checkpoint.names() == list(arrays) and checkpoint.metadata == {"format": "pt"}
  for name, array in arrays.items():
    got = checkpoint.tensor(name)
    assert got.shape == np.shape(array) and got.dtype == np.asarray(array).dtype.newbyteorder("<")
    np.testing.assert_array_equal(got, array)
  assert [name for name, _ in checkpoint.tensors()] == list(arrays)
  assert {e.dtype for e in checkpoint.entries.values()} == set(safetensors.DTYPES)
  assert not checkpoint.tensor("f32").flags.writeable


def test_the_layout_byte_by_byte(tmp_path):
  """The header length, its JSON and padding, the offsets relative to the data, the little-endian bytes."""
  file = tmp_path / "x.safetensors"
  safetensors.write_file(file, [("b", np.array([1, 2], np.int16)), ("a", np.array([0.5], ">f4"))], {"k": "v"})
  data = file.read_bytes()
  (length,) = struct.unpack("<Q", data[:8])
  assert (8 + length) % 8 == 0 and data[8 + length - 1:8 + length] in (b"}", b" ")
  header = json.loads(data[8:8 + length])
  assert header == {"__metadata__": {"k": "v"}, "b": {"dtype": "I16", "shape": [2], "data_offsets": [0, 4]},
                    "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}
  assert data[8 + length:] == struct.pack("<hhf", 1, 2, 0.5)


def test_sharded_like_transformers(tmp_path):
  """max_shard_bytes 100: 48 + 48 bytes share a shard, the next 48 start another; a 400-byte tensor is alone in a
  shard listed when it is reached, before the shard still filling (huggingface_hub's order); the index as
  save_pretrained writes it."""
  arrays = {"a": np.ones(12, np.float32), "b": np.full(12, 2.0, np.float32), "huge": np.arange(100, dtype=np.float32),
            "c": np.full(12, 3.0, np.float32), "d": np.full((3, 2), 4, np.int64)}
  files = safetensors.write(tmp_path, arrays, {"format": "pt"}, max_shard_bytes=100)
  names = [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
  assert [f.name for f in files] == names + ["model.safetensors.index.json"]
  index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
  assert index == {"metadata": {"total_parameters": 142, "total_size": 4 * 136 + 48},
                   "weight_map": {"huge": names[0], "a": names[1], "b": names[1], "c": names[2], "d": names[2]}}
  assert (tmp_path / "model.safetensors.index.json").read_text().startswith('{\n  "metadata"')
  checkpoint = safetensors.open(tmp_path)
  assert sorted(checkpoint.names()) == sorted(arrays) and checkpoint.metadata == {"format": "pt"}
  for name, array in checkpoint.tensors():
    np.testing.assert_array_equal(array, arrays[name])
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names + ["model.safetensors.index.json"])


def test_one_shard_is_model_safetensors_and_a_rewrite_removes_the_old_files(tmp_path):
  safetensors.write(tmp_path, ((n, np.full(30, i, np.float32)) for i, n in enumerate("abc")), max_shard_bytes=240)
  assert len(list(tmp_path.glob("model-*.safetensors"))) == 2
  assert [f.name for f in safetensors.write(tmp_path, {"x": np.zeros(3)})] == ["model.safetensors"]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
  assert safetensors.open(tmp_path).names() == ["x"]
  safetensors.write(tmp_path, {"x": np.zeros(30), "y": np.zeros(30)}, max_shard_bytes=240)
  assert "model.safetensors" not in {p.name for p in tmp_path.iterdir()}
  assert safetensors.open(tmp_path).names() == ["x", "y"]


@pytest.mark.parametrize("kind", ["m2m100", "nllb_moe"])
def test_the_transformers_fixtures(kind):
  """The files transformers 4.57.1 wrote (tools/hf_fixtures.py): every shape follows config.json, and the
  parameters the reference also saved are the same numbers."""
  config = json.loads((FIXTURES / kind / "config.json").read_text())
  checkpoint = safetensors.open(FIXTURES / kind)
  assert checkpoint.metadata == {"format": "pt"}
  shapes = {name: checkpoint.entries[name].shape for name in checkpoint.names()}
  assert shapes["model.shared.weight"] == (config["vocab_size"], config["d_model"])
  assert shapes["model.encoder.layers.0.self_attn.q_proj.weight"] == (config["d_model"], config["d_model"])
  assert {e.dtype for e in checkpoint.entries.values()} == {"F32"}
  fc1 = [shape for name, shape in shapes.items() if name.startswith("model.encoder.") and name.endswith("fc1.weight")]
  assert set(fc1) == {(config["encoder_ffn_dim"], config["d_model"])}
  if kind == "nllb_moe":
    routers = [name for name in shapes if name.endswith("router.classifier.weight")]
    assert len(routers) == config["encoder_layers"] // config["encoder_sparse_step"] + (
      config["decoder_layers"] // config["decoder_sparse_step"])
    assert shapes[routers[0]] == (config["num_experts"], config["d_model"])
  reference = np.load(FIXTURES / kind / "reference.npz")
  saved = [key for key in reference if key.startswith("param/")]
  assert len(saved) == 2
  for key in saved:
    np.testing.assert_array_equal(checkpoint.tensor(key.removeprefix("param/")), reference[key])


def test_missing_files(tmp_path):
  with pytest.raises(WorkdirError, match="no such safetensors file or directory"):
    safetensors.open(tmp_path / "nothing")
  with pytest.raises(WorkdirError, match=f"{tmp_path}: neither model.safetensors nor model.safetensors.index.json"):
    safetensors.open(tmp_path)
  safetensors.write(tmp_path, {"a": np.zeros(4), "b": np.zeros(4)}, max_shard_bytes=32)
  (tmp_path / "model-00002-of-00002.safetensors").unlink()
  with pytest.raises(WorkdirError, match="index.json: its shard model-00002-of-00002.safetensors is missing"):
    safetensors.open(tmp_path)
  with pytest.raises(WorkdirError, match="x.safetensors: no tensor b \\(1 tensors\\)"):
    safetensors.open(raw_file(tmp_path / "x.safetensors", {"a": {"dtype": "U8", "shape": [1],
                                                                  "data_offsets": [0, 1]}}, b"\0")).tensor("b")


def test_bad_indexes(tmp_path):
  index = tmp_path / "model.safetensors.index.json"
  for text in ("{", '{"metadata": {}}', '{"weight_map": ["a"]}', '{"weight_map": {"a": 3}}'):
    index.write_text(text)
    with pytest.raises(WorkdirError, match="index.json: not a safetensors index"):
      safetensors.open(tmp_path)
  safetensors.write_file(tmp_path / "s.safetensors", {"a": np.zeros(2)})
  index.write_text(json.dumps({"weight_map": {"a": "s.safetensors", "b": "s.safetensors"}}))
  with pytest.raises(WorkdirError, match="index.json: lists b in s.safetensors, which does not hold it"):
    safetensors.open(tmp_path)


F32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize("header, data, length, message", [
  (None, b"\1\0\0", None, "truncated safetensors header \\(3 bytes"),
  ({"a": F32}, bytes(8), 10**6, "corrupt or truncated safetensors header \\(length 1000000"),
  ({"a": F32}, bytes(8), 2 * 10**8, "corrupt or truncated safetensors header \\(length 200000000"),
  ("[1, 2]", b"", None, "corrupt safetensors header \\(not a JSON object\\)"),
  ("{not json", b"", None, "corrupt safetensors header \\(Expecting"),
  ({"a": {**F32, "dtype": "F8_E4M3"}}, bytes(8), None, "tensor a has unknown dtype 'F8_E4M3' \\(known: F64, F32"),
  ({"a": "F32"}, bytes(8), None, "tensor a has unknown dtype 'F32'"),
  ({"a": {**F32, "shape": [-2]}}, bytes(8), None, "tensor a has a bad shape \\[-2\\]"),
  ({"a": {**F32, "data_offsets": [8, 0]}}, bytes(8), None, "tensor a has a bad shape \\[2\\] or data_offsets"),
  ({"a": {**F32, "shape": [3]}}, bytes(8), None, "tensor a of shape \\[3\\] F32 needs 12 bytes, its data_offsets"),
  ({"a": F32, "b": {**F32, "data_offsets": [8, 16]}}, bytes(12), None, "tensor b's bytes overrun the file"),
  ({"a": F32}, bytes(12), None, "4 bytes after the last tensor's end"),
  ({"a": {**F32, "data_offsets": [4, 12]}}, bytes(12), None, "tensor a's bytes start at 4, not at the previous"),
  ({"a": F32, "b": {**F32, "data_offsets": [4, 12]}}, bytes(12), None, "tensor b's bytes start at 4, not at the "
                                                                        "previous tensor's end 8"),
])
def test_bad_files_name_the_file_and_the_tensor(tmp_path, header, data, length, message):
  file = tmp_path / "bad.safetensors"
  if header is None:
    file.write_bytes(data)
  elif isinstance(header, str):
    file.write_bytes(struct.pack("<Q", len(header)) + header.encode() + data)
  else:
    raw_file(file, header, data, length)
  with pytest.raises(WorkdirError, match=f"^{file}: {message}"):
    safetensors.open(file)


def test_what_cannot_be_written_is_a_user_error_and_leaves_no_file(tmp_path):
  file = tmp_path / "x.safetensors"
  with pytest.raises(UserError, match="tensor c: dtype complex64 has no safetensors code"):
    safetensors.write_file(file, {"a": np.zeros(2), "c": np.zeros(2, np.complex64)})
  with pytest.raises(UserError, match="x.safetensors: tensor a given twice"):
    safetensors.write_file(file, [("a", np.zeros(2)), ("a", np.ones(2))])
  with pytest.raises(UserError, match="metadata must map strings to strings"):
    safetensors.write_file(file, {"a": np.zeros(2)}, {"step": 3})
  with pytest.raises(UserError, match="tensor s: dtype <U1 has no safetensors code"):
    safetensors.write(tmp_path, [("a", np.zeros(8)), ("b", np.zeros(8)), ("s", np.array(["x"]))], max_shard_bytes=64)
  assert list(tmp_path.iterdir()) == []
