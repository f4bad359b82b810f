"""The NLLB tokenizer against transformers' NllbTokenizer (tests/fixtures/hf, written by tools/hf_fixtures.py), the
language codes, loading either kind from disk and its errors."""

import json
import pathlib
import shutil

import pytest

from gshard_mt.data import nllb, nllb_languages, tokenizer, tokenizer_files
from gshard_mt.errors import DataError

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "hf"
CASES = json.loads((FIXTURES / "tokenizer_cases.json").read_text())


@pytest.fixture(scope="module")
def tok():
  return tokenizer_files.load(FIXTURES / "tokenizer")


@pytest.mark.parametrize("case", CASES, ids=[c["src_lang"] for c in CASES])
def test_ids_and_text_are_transformers(tok, case):
  assert tok.encode([case["text"]], case["src_lang"]) == [case["ids"]]
  assert tok.encode([case["text"]], case["tgt_lang"], target=True) == [case["target_ids"]]
  assert tok.decode(case["ids"]) == tok.decode(case["target_ids"]) == case["decoded"]
  tokens, lengths = tok.encode_flat([case["text"], "x"], case["src_lang"], "int32")
  assert tokens.tolist()[: lengths[0]] == case["ids"]


def test_fairseq_layout_and_decoding_ids(tok):
  config = json.loads((FIXTURES / "tokenizer" / nllb.CONFIG).read_text())
  added = {t["content"]: int(i) for i, t in config["added_tokens_decoder"].items()}
  pieces = tok.sp.get_piece_size()
  assert [added[t] for t in ("<s>", "<pad>", "</s>", "<unk>")] == [0, 1, 2, 3]
  assert [added[c] for c in nllb_languages.FAIRSEQ_LANGUAGE_CODES] == list(range(pieces + 1, pieces + 203))
  assert added["<mask>"] == pieces + 203 == tok.vocab_size - 1
  assert tok.ids == tokenizer.SpecialIds(pad=1, eos=2, unk=3, start=2, never=())
  assert tok.forced("eng") == (added["eng_Latn"],) and tok.decoding() == {"ids": tok.ids, "forced": tok.forced("eng")}
  assert tok.source_prefix("fra.multi30k") == [added["fra_Latn"]] and tok.tags_every_source
  # without added_tokens_decoder: the same layout (NLLB-200's checkpoints')
  assert nllb.added_tokens({}, pieces) == {t: (i, t == "<mask>", False) for t, i in added.items()}
  # added tokens written in a text are those tokens (`<mask>` strips the spaces before it), as transformers 4.57.1
  # gives them; decoding drops them and UNK, and cuts at EOS (transformers' decode would go on: 'a b h')
  assert tok.encode(["a <unk>eng_Latn b", "x <mask>  y <s>z"], "eng") == [
      [347, 14, 3, 347, 28, 2], [347, 127, 231, 503, 127, 180, 0, 127, 181, 2]]
  assert tok.decode([347, 14, 3, 347, 28, 2, 50]) == "a b"


def test_language_codes():
  assert len(nllb_languages.FAIRSEQ_LANGUAGE_CODES) == len(set(nllb_languages.FAIRSEQ_LANGUAGE_CODES)) == 202
  assert set(nllb_languages.USUAL_CODES.values()) <= set(nllb_languages.FAIRSEQ_LANGUAGE_CODES)
  expected = {"fra": "fra_Latn", "deu.multi30k": "deu_Latn", "ces": "ces_Latn", "cmn": "zho_Hans", "zho": "zho_Hans",
              "ara": "arb_Arab", "sqi": "als_Latn", "de": "deu_Latn", "eng": "eng_Latn", "zho_Hant": "zho_Hant",
              "yue": "yue_Hant", "kas": "kas_Arab"}
  assert {lang: nllb.nllb_code(lang) for lang in expected} == expected
  with pytest.raises(DataError, match=r"^language 'fraa' has no NLLB-200 code .*near: fra_Latn") as e:
    nllb.nllb_code("fraa")
  assert "\n" not in str(e.value)
  with pytest.raises(DataError, match="'lat' has no NLLB-200 code"):
    nllb.nllb_code("lat")  # Latin: not one of NLLB's


def test_either_kind_loads_and_copies(tmp_path, tok, data):
  spm_model = data.tokenizer.path
  for path in (spm_model, spm_model.parent):  # a model file, a prepared directory
    loaded = tokenizer_files.load(path)
    assert isinstance(loaded, tokenizer.SentencePieceTokenizer) and loaded.path == spm_model
  assert tokenizer_files.digest(spm_model) == tokenizer_files.digest(spm_model.parent)
  named = tmp_path / "named"  # detected by tokenizer_config.json's class, without its model's usual name
  named.mkdir()
  (named / nllb.CONFIG).write_text(json.dumps({"tokenizer_class": "NllbTokenizer"}))
  assert tokenizer_files.is_nllb(named) and not tokenizer_files.is_nllb(spm_model.parent)
  copy = tmp_path / "prepared"
  copy.mkdir()
  tokenizer_files.copy_into(FIXTURES / "tokenizer", copy)
  assert sorted(p.name for p in copy.iterdir()) == sorted(nllb.FILES)
  again = tokenizer_files.load(copy)
  assert isinstance(again, nllb.NllbTokenizer) and again.encode([CASES[0]["text"]], "fra") == [CASES[0]["ids"]]
  assert tokenizer_files.digest(copy) == tokenizer_files.digest(FIXTURES / "tokenizer") != tokenizer_files.digest(
      spm_model)


def test_a_missing_or_unreadable_tokenizer_is_one_line_naming_the_key(tmp_path):
  (tmp_path / "junk.model").write_bytes(b"not a model")
  (tmp_path / "empty").mkdir()
  broken = tmp_path / "broken"
  shutil.copytree(FIXTURES / "tokenizer", broken)
  (broken / nllb.CONFIG).write_text("{")
  for path, says in ((tmp_path / "gone", "not found"), (tmp_path / "junk.model", "not a readable tokenizer"),
                     (tmp_path / "empty", "neither a SentencePiece model file nor"), (broken, "cannot read it")):
    with pytest.raises(DataError, match=f"^data.tokenizer={path}: {says}") as e:
      tokenizer_files.load(path)
    assert "\n" not in str(e.value)
