"""The prepared corpus: the same tokens, text and batches as the corpus read and tokenized in memory, found again by
its files and settings, serial or parallel alike; TFDS datasets joined; the prepare_data command."""

import json
import logging
import os
import shutil
import socket
import subprocess

import numpy as np
import pytest

from gshard_mt import config as config_lib
from gshard_mt import config_files
from gshard_mt.data import corpus, nllb, packing, pipeline, shards, sources, tokenizer, tokenizer_files
from gshard_mt.data import prepare as prepare_lib
from gshard_mt.errors import DataError, WorkdirError
from gshard_mt.tools import prepare_data
from gshard_mt.training import init_from
from tests import tiny_tfds
from tests.helpers import ROOT, small_args, small_config


def in_memory(text: corpus.Corpus, tok) -> packing.TokenizedSplit:
  """A split tokenized as the pipeline did before corpora were prepared: in memory, streams sorted."""
  streams = sorted(text)
  lang = [i for i, s in enumerate(streams) for _ in range(len(text[s]))]
  src = [ids for s in streams for ids in tok.encode(list(text[s].src), s)]
  tgt = [ids for s in streams for ids in tok.encode(list(text[s].tgt))]
  return packing.TokenizedSplit.from_lists(streams, lang, src, tgt)


def test_prepared_corpus_and_its_batches_equal_those_made_in_memory(data):
  config = small_config()
  text, _ = sources.load_corpus(config.data)
  memory = {}
  for split in corpus.SPLITS:
    memory[split], mapped = in_memory(text[split], data.tokenizer), data.tokens[split]
    assert isinstance(mapped.src_tokens, np.memmap) and mapped.languages == memory[split].languages
    for field in ("lang", "src_tokens", "src_offsets", "tgt_tokens", "tgt_offsets"):
      np.testing.assert_array_equal(getattr(mapped, field), getattr(memory[split], field))
    for stream, pairs in text[split].items():
      assert list(data.text[split][stream].src) == pairs.src and list(data.text[split][stream].tgt) == pairs.tgt
  # the tokenizer is trained on the sentences it was trained on before: every training line, streams sorted
  lines = "".join(s + "\n" + t + "\n" for lang in sorted(text["train"])
                  for s, t in zip(text["train"][lang].src, text["train"][lang].tgt)).splitlines()
  assert list(tokenizer.training_sentences(list(data.text["train"].values()))) == lines
  # batches: an in-memory split whose sampler index is computed in memory, as before, against the memory-mapped
  # split whose index is kept beside it; for one process and for each of two
  for count in (1, 2):
    for p in range(count):
      before = pipeline.TrainBatches(memory["train"], data.rates, config.batch_size, config_lib.row_lengths(config),
                                     config.data.seed, p, count)
      now = data.train_batches(config, p, count)
      assert isinstance(now.eligible, np.memmap)
      for i in (0, 7):
        for key, value in before.batch(i).items():
          np.testing.assert_array_equal(now.batch(i)[key], value)


def test_the_sampler_index_read_in_chunks_is_the_whole_one(data):
  split, lengths = data.tokens["train"], (24, 16)
  whole, chunked = pipeline.eligible(split, lengths), pipeline.eligible(split, lengths, chunk=97)
  fits = (split.src_len <= 24) & (split.tgt_len <= 16)
  plain = np.concatenate([np.flatnonzero(fits & (split.lang == i)) for i in range(len(split.languages))])
  np.testing.assert_array_equal(whole.ids, plain)
  np.testing.assert_array_equal(chunked.ids, plain)
  np.testing.assert_array_equal(chunked.counts, whole.counts)
  np.testing.assert_allclose(chunked.mean_lengths, whole.mean_lengths, rtol=1e-12)
  assert (chunked.shortest, chunked.filtered) == (whole.shortest, whole.filtered) == (
      min(split.src_len[plain].min(), split.tgt_len[plain].min()), int((~fits).sum()))


def test_lines_read_like_a_list():
  text = ["a", "", "ça va", "z"]
  encoded = [t.encode() for t in text]
  lines = shards.Lines(np.frombuffer(b"".join(encoded), np.uint8), np.cumsum([0] + [len(e) for e in encoded]))
  assert len(lines) == 4 and list(lines) == text and lines[-2] == "ça va" and lines.index("z") == 3
  assert lines[1:3] == text[1:3] and lines[::2] == text[::2] and lines[3:1] == []
  with pytest.raises(IndexError):
    lines[4]


def write_folder(folder, languages=("fra", "deu"), n=300):
  """The first n Tatoeba pairs of each language, as a data.source=folder corpus."""
  folder.mkdir(parents=True, exist_ok=True)
  for lang in languages:
    for side in (lang, "eng"):
      lines = corpus.read_lines(corpus.SHIPPED / "tatoeba" / f"tatoeba.{lang}-eng.{side}.gz")
      (folder / f"c.{lang}-eng.{side}").write_text("".join(line + "\n" for line in lines[:n]))
  return small_config(**{"data.source": "folder", "data.path": folder, "data.languages": "", "data.vocab_size": 400})


def test_a_preparation_is_shared_by_runs_and_keyed_by_files_and_settings(tmp_path, monkeypatch):
  config = config_lib.replace(write_folder(tmp_path / "corpus"), {"data.prepared_dir": str(tmp_path / "prepared")})
  gone = subprocess.Popen(["true"])
  gone.wait()  # a preparation killed midway left its staging folder: the next one removes it
  (tmp_path / "prepared" / f".{prepare_lib.key(config.data)[0]}.tmp{gone.pid}" / "part0.fra.train.src_text").mkdir(
      parents=True)
  first = prepare_lib.ensure(config.data, tmp_path / "run1")
  assert first.parent == tmp_path / "prepared" and first.name == prepare_lib.key(config.data)[0]
  monkeypatch.setattr(prepare_lib, "build", lambda *a: pytest.fail("prepared again"))
  assert prepare_lib.ensure(config.data, tmp_path / "run2") == first  # another run of the same data and settings
  assert prepare_lib.key(config_lib.replace(config, {"data.dev_fraction": 0.2}).data)[0] != first.name
  fra = tmp_path / "corpus" / "c.fra-eng.fra"
  stat = fra.stat()
  fra.write_bytes(fra.read_bytes().replace(b"a", b"o", 1))  # the same size, and the modification time put back
  os.utime(fra, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # (an edit within a second; cp -p of another file)
  assert fra.stat().st_size == stat.st_size and prepare_lib.key(config.data)[0] != first.name
  assert [p.name for p in (tmp_path / "prepared").iterdir()] == [first.name]  # no staging folder left


def test_stages_of_other_hosts_are_left_and_a_finished_preparation_is_never_replaced(tmp_path):
  """A folder shared by hosts (NFS) holds their stages: only this host's dead ones go. Two runs publishing the same
  key: the later keeps the one that is there, which no check-then-remove can delete under the first's reader."""
  target = tmp_path / "prepared" / "spm-400-k"
  gone = subprocess.Popen(["true"])
  gone.wait()
  here = socket.gethostname()
  names = [f".spm-400-k.tmp{gone.pid}", f".spm-400-k.tmp.{here}.{gone.pid}", f".spm-400-k.tmp.other.host.{gone.pid}"]
  for name in names:
    (target.parent / name).mkdir(parents=True)
  stage = prepare_lib._stage(target)
  assert stage.name == f".spm-400-k.tmp.{here}.{os.getpid()}"
  assert sorted(p.name for p in target.parent.iterdir()) == sorted([names[2], stage.name])
  (stage / shards.MANIFEST).write_text("{}")
  (stage / "first").write_text("")
  prepare_lib._publish(stage, target)
  second = tmp_path / "second"
  second.mkdir()
  (second / shards.MANIFEST).write_text("{}")
  prepare_lib._publish(second, target)  # finished first elsewhere: kept, the second stage left to its caller
  assert sorted(p.name for p in target.iterdir()) == ["first", shards.MANIFEST] and second.exists()
  (target / shards.MANIFEST).unlink()  # an incomplete directory is replaced
  prepare_lib._publish(second, target)
  assert [p.name for p in target.iterdir()] == [shards.MANIFEST]


def test_a_preparation_that_finishes_just_before_ours_is_kept(tmp_path, monkeypatch):
  """Another run's rename lands between our look at the target and ours: we keep theirs (the check-then-rename
  before failed on the non-empty directory)."""
  target, ours, theirs = tmp_path / "spm-400-k", tmp_path / "ours", tmp_path / "theirs"
  for stage in (ours, theirs):
    stage.mkdir()
    (stage / shards.MANIFEST).write_text("{}")
    (stage / stage.name).write_text("")
  rename = os.rename

  def others_first(src, dst):
    if src == ours and not os.path.exists(dst):
      rename(theirs, dst)
    rename(src, dst)

  monkeypatch.setattr(prepare_lib.os, "rename", others_first)
  prepare_lib._publish(ours, target)
  assert sorted(p.name for p in target.iterdir()) == [shards.MANIFEST, "theirs"]


def test_a_run_keeps_its_preparation_when_its_files_change_not_when_its_settings_do(tmp_path, caplog):
  """A run resumed or evaluated after its corpus files changed (edited; copied or cloned anew, which changes their
  times) keeps the tokenizer and batches it trained with; a new run prepares the files as they are now."""
  config = config_lib.replace(write_folder(tmp_path / "corpus"), {"data.prepared_dir": str(tmp_path / "prepared")})
  run = tmp_path / "run"
  first = prepare_lib.for_run(config.data, run, record=True)
  assert json.loads((run / prepare_lib.RUN_RECORD).read_text())["name"] == first.name
  (tmp_path / "corpus" / "c.fra-eng.fra").write_text((tmp_path / "corpus" / "c.fra-eng.fra").read_text() + "")
  os.utime(tmp_path / "corpus" / "c.fra-eng.fra", (1, 1))  # the same text, another time: as after a clone
  with caplog.at_level(logging.WARNING, logger=prepare_lib.__name__):
    assert prepare_lib.for_run(config.data, run) == first
  assert "the run keeps it (its tokenizer and batches)" in caplog.text
  assert prepare_lib.ensure(config.data, tmp_path / "new") != first  # a new run: the files as they are now
  other = config_lib.replace(config, {"data.dev_fraction": 0.2})  # other settings: a run before its checkpoint
  assert prepare_lib.for_run(other.data, run, record=True).name == prepare_lib.key(other.data)[0] != first.name


@pytest.mark.slow  # starts processes
def test_a_parallel_preparation_writes_what_a_serial_one_does(tmp_path):
  config = write_folder(tmp_path / "corpus", ("fra", "deu", "spa"), 400)
  directories = []
  for processes in (1, 2):
    config = config_lib.replace(config, {"data.prepared_dir": str(tmp_path / f"prepared{processes}")})
    directories.append(prepare_lib.ensure(config.data, tmp_path / "run", processes))
  serial, parallel = ({p.name: p.read_bytes() for p in d.iterdir() if p.name != shards.MANIFEST} for d in directories)
  assert serial == parallel and len(serial) == 1 + 3 * len(shards.ARRAYS)
  manifests = [json.loads((d / shards.MANIFEST).read_text()) for d in directories]
  assert [m["info"].pop("processes") for m in manifests] == [1, 2]
  assert manifests[0]["splits"] == manifests[1]["splits"] and manifests[0]["origins"] == manifests[1]["origins"]


def test_tfds_datasets_are_prepared_as_one_stream_each(tmp_path):
  config = small_config(**{"data.source": tiny_tfds.build(tmp_path / "tfds"), "data.tfds_data_dir": tmp_path / "tfds",
                           "data.languages": "", "data.vocab_size": 283})  # the most pieces their text gives
  data = pipeline.load(config, tmp_path / "run")
  assert {split: [(s, len(p)) for s, p in text.items()] for split, text in data.text.items()} == {
      "train": [("de", 30), ("fr", 30)], "dev": [("de", 4), ("fr", 4)], "test": [("de", 5), ("fr", 5)]}
  assert data.rates == {"de": 0.5, "fr": 0.5}
  i = data.text["train"]["fr"].src.index("bonjour 3")
  assert data.text["train"]["fr"].tgt[i] == "hello 3"
  tags = {data.tokenizer.tag_id(s): s for s in ("de", "fr")}
  batch = data.train_batches(config).batch(0)
  starts = (batch["inputs_position"] == 0) & (batch["inputs_segmentation"] > 0)
  assert set(tags) == set(batch["inputs"][starts].tolist())  # both streams are sampled, each with its tag


def test_prepare_data_command(workdir, capsys):
  prepare_data.main(["--config", str(ROOT / "configs" / "tiny.py"), "--workdir", str(workdir), *small_args()])
  out = capsys.readouterr().out
  assert "5 streams, 4000 train / 500 dev / 500 test pairs, vocabulary 600" in out
  assert list((workdir / "tokenizer").glob("spm-600-*/train.eligible-24x24.json"))


def test_a_corpus_prepared_with_a_given_tokenizer_and_a_run_started_from_it(tmp_path):
  """data.tokenizer (NLLB's): copied into the prepared directory, which its bytes key, its vocabulary the run's;
  sources start with their language's code (whatever data.source_tags), targets with English's. A run with
  init_from and no data.tokenizer takes its source run's, whatever corpus it trains on."""
  given = ROOT / "tests" / "fixtures" / "hf" / "tokenizer"
  config = config_lib.replace(write_folder(tmp_path / "corpus", n=40), {"data.tokenizer": str(given),
                                                                         "data.source_tags": False})
  config = init_from.resolved(config)
  nllb_tok = tokenizer_files.load(given)
  assert config.data.vocab_size == nllb_tok.vocab_size == 504
  source = tmp_path / "source"
  directory = prepare_lib.for_run(config.data, source, record=True)
  config_files.save(config, source)
  manifest = shards.read_manifest(directory)
  assert directory.name.startswith("spm-504-") and manifest["token_dtype"] == "uint16"
  assert sorted(p.name for p in directory.glob("*.json")) == ["manifest.json", *sorted(nllb.FILES[1:])]
  data = pipeline.load(config, source, directory.name)
  assert isinstance(data.tokenizer, nllb.NllbTokenizer)
  tokens, text = data.tokens["train"], data.text["train"]
  for stream in tokens.languages:
    i = pipeline.language_ids(tokens, stream)[0]  # the stream's first pair
    src, tgt = text[stream].src[0], text[stream].tgt[0]
    assert tokens.src_tokens[tokens.src_offsets[i]:tokens.src_offsets[i + 1]].tolist() == nllb_tok.encode(
        [src], stream)[0]
    assert tokens.tgt_tokens[tokens.tgt_offsets[i]:tokens.tgt_offsets[i + 1]].tolist() == nllb_tok.encode(
        [tgt], "eng_Latn", target=True)[0]
  # the key follows the tokenizer's bytes
  changed = tmp_path / "changed"
  shutil.copytree(given, changed)
  (changed / "special_tokens_map.json").write_text("{}")
  assert prepare_lib.key(config_lib.replace(config, {"data.tokenizer": str(changed)}).data)[0] != directory.name
  # a run started from it, on another corpus
  other = config_lib.replace(write_folder(tmp_path / "other", ("spa",), 40), {"init_from": str(source)})
  resolved = init_from.resolved(other)
  assert resolved.data.tokenizer == str(given) and resolved.data.vocab_size == 504  # the one the source was given
  prepared = prepare_lib.ensure(resolved.data, tmp_path / "fine-tuned")
  assert tokenizer_files.digest(prepared) == tokenizer_files.digest(given)
  with pytest.raises(DataError, match=f"^data.tokenizer={tmp_path / 'gone'}: not found$"):
    init_from.resolved(config_lib.replace(other, {"data.tokenizer": str(tmp_path / "gone")}))
  untrained = tmp_path / "untrained"  # a run's config with a tokenizer of its own to train, no corpus prepared yet
  config_files.save(config_lib.replace(config, {"data.tokenizer": ""}), untrained)
  with pytest.raises(WorkdirError, match=f"^init_from={untrained}: no prepared.json, so no tokenizer"):
    init_from.resolved(config_lib.replace(other, {"init_from": str(untrained)}))
