"""Reference checkpoints from Hugging Face transformers for the NLLB import/export (tests/fixtures/hf), and the check
that an exported directory gives transformers' own answers. Run by hand in a separate environment, never in `make
test` (CI installs no torch):

  python -m venv /work/hfenv && /work/hfenv/bin/pip install torch==2.13.0 transformers==4.57.1 sentencepiece \
    protobuf safetensors numpy           # the CPU torch wheel
  /work/hfenv/bin/python tools/hf_fixtures.py make --out tests/fixtures/hf
  /work/hfenv/bin/python tools/hf_fixtures.py check --model DIR --reference tests/fixtures/hf/nllb_moe/reference.npz
  /work/hfenv/bin/python tools/hf_fixtures.py make-sized --kind nllb_moe --out /tmp/sized [--seed 1]

transformers 4.57.1 exactly: 5.x's NllbMoe is wrong (only experts 0 and 1 run). Models run in eval mode, float32,
with eager attention. `make` writes a tiny SentencePiece BPE model (nmt_nfkc, like NLLB's sentencepiece.bpe.model,
kept once in the fixtures folder and linked from each model folder, as its normalisation table alone is 240 KB), a
slow NllbTokenizer on it with NLLB's id layout (<s> <pad> </s> <unk> = 0-3, piece p at p + 1, the 202 language codes
from len(spm) + 1, <mask> last), m2m100/ and nllb_moe/ as save_pretrained writes them (every Linear bias and
LayerNorm weight/bias random, as HF's init zeroes them), a reference.npz + reference.json in each, and
tokenizer_cases.json.

What transformers 4.57.1 does (modeling_m2m_100.py, modeling_nllb_moe.py, tokenization_nllb.py):
- Tokens: source `[src_lang] pieces </s>`, target (text_target) `[tgt_lang] pieces </s>` (legacy_behaviour=False).
  Embeddings scaled by sqrt(d_model); lm_head tied to model.shared (the file holds model.shared.weight only).
- Positions: sinusoidal, [sin | cos] halves (not interleaved), frequency exp(-i log(10000) / (d/2 - 1)); position of
  a token = pad_id + (number of non-pad tokens up to and including it), so 2, 3, ... for right-padded rows and row
  pad_id (1) of the table, all zeros, for a pad. While generating, a step's position = pad + 1 + past length.
- Layers pre-norm (LayerNorm before attention, cross-attention, FFN), a final LayerNorm on encoder and decoder.
- Decoder: decoder_start_token_id = </s> (2); generate() forces forced_bos_token_id (the target language code) as
  the first generated token, so output rows are `2, eng_Latn, tokens, 2`, and rows that finished early are padded
  with pad_token_id (1). Teacher forcing: decoder_input_ids = [2, tgt_lang, tokens] (labels shifted right).
- NllbMoe layer i (from 0) is sparse when (i + 1) % sparse_step == 0. Router: logits = x @ W (router_bias False) in
  router_dtype; probs = softmax; e1 = argmax(probs), e2 = argmax(logits with e1 masked) (second_expert_policy
  'all'). Tokens are the flat B*L of the whole batch, row-major. Padding: the layer's additive attention mask is
  passed as padding_mask; its last query row, flattened, marks the keys that are padding, and their e1/e2 masks
  are zeroed (router_ignore_padding_tokens False) before the positions: padded tokens take no slot and get a zero
  FFN output (the residual carries them). In the decoder with a KV cache that row is reshaped wrongly
  ([-nb_tokens:] of B*(past+1) entries), harmless only as generate passes no decoder mask (nothing is padding).
- Positions in the buffers (batch_prioritized_routing False): loc1 = cumsum(e1 mask) - 1 over the flat tokens;
  loc2 = cumsum(e2 mask) - 1 + (the number of top-1 requests of that expert, dropped ones too): every top-1 before
  any top-2. Capacity in eval with moe_eval_capacity_token_fraction > 0: ceil(fraction * B*L), padding counted in
  B*L (expert_capacity is used only in training, and the router overwrites it in eval); an assignment is kept iff
  loc < capacity. With fraction 1.0 nothing is ever dropped.
- Gates after the drops (normalize_router_prob_before_dropping False): g1 = p1 * kept1 / max(p1 kept1 + p2 kept2,
  eps), g2 likewise, so a token whose second choice was dropped gets g1 = 1; dropped both ways: 0.
- Expert output in eval multiplied by (1 - moe_token_dropout) before the gate (training: dropout instead); MoE
  output = sum over experts of gate * expert(x). Each decoding step of generate() routes only its B new tokens:
  capacity ceil(fraction * B) per step, so binding capacities differ between a cached and a full forward.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pathlib
import sys
import tempfile

import numpy as np
import sentencepiece as spm
import torch
import transformers
from transformers import AddedToken, AutoModelForSeq2SeqLM, AutoTokenizer, NllbTokenizer
from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES
from transformers.models.nllb_moe.modeling_nllb_moe import NllbMoeTop2Router

TEXT = """Le petit chat noir dort sur la fenêtre près de l'école. Où est la bibliothèque ? Elle ouvre à 9 h.
Les élèves étudient les mathématiques, l'histoire et la géographie. Ça coûte 12,50 € à Noël. Le chat et le chien.
Der schnelle braune Fuchs springt über den faulen Hund. Die Straße ist heute sehr ruhig, die Bäume sind grün.
Wir fahren am Montag um 7 Uhr mit dem Zug nach München. Grüße aus Köln! Der Hund und die Katze.
The quick brown fox jumps over the lazy dog. The cat sleeps on the window. The dog and the cat are friends.
We have 12 apples and 345 oranges. We go by train on Monday morning. Hello from the river, hello again.
El niño come una manzana roja en el jardín. A menina lê um livro na praça às três horas.
Маленькая кошка спит на окне. Мы едем в Москву в понедельник утром на поезде. Сегодня хорошая погода.
Η γάτα κοιμάται στο παράθυρο. Σήμερα ο καιρός είναι καλός.
القطة الصغيرة تنام على النافذة. छोटी बिल्ली खिड़की पर सोती है। 小猫在窗户上睡觉。今日は天気が良い。
0 1 2 3 4 5 6 7 8 9 10 100 2024 3.14 1,000 ５ ｱ ﬁ ①
"""
SOURCES = [("fra_Latn", "Le petit chat dort sur la fenêtre."),
           ("rus_Cyrl", "Мы едем в Москву в понедельник утром на поезде, 7 дней."),
           ("deu_Latn", "Grüße aus Köln!")]
TARGETS = ["The cat sleeps.", "We go by train.", "Hello!"]
TGT_LANG = "eng_Latn"
CASES = [("fra_Latn", "Où est la bibliothèque ? Elle ouvre à 9 h."), ("deu_Latn", "  Die Straße  ist   ruhig.  "),
         ("eng_Latn", "We have 12 apples, 345 oranges and 6789 grapes."), ("rus_Cyrl", "Ёжик съел яблоко 😀"),
         ("ell_Grek", "Η γάτα κοιμάται."), ("arb_Arab", "القطة الصغيرة تنام."), ("hin_Deva", "छोटी बिल्ली सोती है।"),
         ("zho_Hans", "小猫在学校旁边睡觉。"), ("jpn_Jpan", "今日は天気が良い ｱｲｳ ５５"),
         ("heb_Hebr", "שלום עולם and ไทย"), ("spa_Latn", "ﬁn ① niño\tseñora\n"), ("eng_Latn", "")]
BINDING_FRACTION = 0.25  # moe_eval_capacity_token_fraction at which capacity binds in the tiny batch
MAX_NEW_TOKENS = 12
FIT_STEPS = 200
TOKENIZER_FILES = ("sentencepiece.bpe.model", "tokenizer_config.json", "special_tokens_map.json")
TOLERANCE = 1e-5
FIXTURE_SIZES = {"m2m100": dict(d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                                decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32),
                 "nllb_moe": dict(d_model=16, encoder_layers=4, decoder_layers=4, encoder_attention_heads=2,
                                  decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_experts=4,
                                  encoder_sparse_step=2, decoder_sparse_step=2, moe_token_dropout=0.2)}
# Other sizes than the fixtures' (heads, layers, ffn, experts, sparse steps and dropout all differ) for a by-hand
# check of the mapping.
SIZED = {"m2m100": dict(d_model=32, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
                        decoder_attention_heads=8, encoder_ffn_dim=64, decoder_ffn_dim=48),
         "nllb_moe": dict(d_model=32, encoder_layers=6, decoder_layers=4, encoder_attention_heads=4,
                          decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=48, num_experts=8,
                          encoder_sparse_step=3, decoder_sparse_step=4, moe_token_dropout=0.1)}
MOE_FIXED = dict(expert_capacity=8, moe_eval_capacity_token_fraction=1.0, normalize_router_prob_before_dropping=False,
                 batch_prioritized_routing=False, second_expert_policy="all", router_bias=False,
                 router_dtype="float32")


def train_spm(out: pathlib.Path, vocab_size: int) -> pathlib.Path:
  """A BPE SentencePiece model on TEXT with NLLB's settings (nmt_nfkc, unk/bos/eos = 0/1/2, no pad piece); trained
  from memory, so that no temporary path is recorded in it and each run writes the same bytes."""
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXT.splitlines() * 3), model_writer=model,
                                 vocab_size=vocab_size, model_type="bpe", normalization_rule_name="nmt_nfkc",
                                 character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1,
                                 minloglevel=2)
  out.write_bytes(model.getvalue())
  return out


def nllb_tokenizer(spm_path: pathlib.Path) -> NllbTokenizer:
  """The slow tokenizer with the real checkpoints' ids: built from a vocab file alone, 4.57.1 would put <mask> before
  the language codes."""
  n = len(spm.SentencePieceProcessor(model_file=str(spm_path)))
  added = {n + 1 + i: AddedToken(code, special=True, normalized=False) for i, code in enumerate(FAIRSEQ_LANGUAGE_CODES)}
  added[n + 1 + len(FAIRSEQ_LANGUAGE_CODES)] = AddedToken("<mask>", special=True, normalized=True, lstrip=True)
  return NllbTokenizer(vocab_file=str(spm_path), legacy_behaviour=False, added_tokens_decoder=added)


def build_model(kind: str, vocab: int, sizes: dict, seed: int) -> torch.nn.Module:
  """A seeded model with random non-zero biases and LayerNorm parameters (pad row of the embedding zero, as in
  NLLB's checkpoints)."""
  torch.manual_seed(seed)
  common = dict(vocab_size=vocab, scale_embedding=True, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                decoder_start_token_id=2, max_position_embeddings=64 if sizes["d_model"] <= 16 else 128,
                init_std=0.1, dropout=0.1, attention_dropout=0.1, activation_function="relu",
                attn_implementation="eager")
  if kind == "m2m100":
    config = transformers.M2M100Config(**common, **sizes)
    model = transformers.M2M100ForConditionalGeneration(config)
  else:
    config = transformers.NllbMoeConfig(**common, **MOE_FIXED, **sizes)
    model = transformers.NllbMoeForConditionalGeneration(config)
  with torch.no_grad():
    for module in model.modules():
      if isinstance(module, torch.nn.Linear) and module.bias is not None:
        module.bias.uniform_(-0.3, 0.3)
      elif isinstance(module, torch.nn.LayerNorm):
        module.weight.uniform_(0.5, 1.5)
        module.bias.uniform_(-0.3, 0.3)
  return model.eval()


def padded(rows: list[list[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded [B, L] int64 ids and their [B, L] mask."""
  length = max(map(len, rows))
  ids = np.array([r + [pad] * (length - len(r)) for r in rows], np.int64)
  return ids, np.array([[1] * len(r) + [0] * (length - len(r)) for r in rows], np.int64)


def reference_batch(tokenizer) -> dict[str, np.ndarray]:
  """input_ids/attention_mask (each row with its own src_lang), labels = [eng_Latn, tokens, </s>] and
  decoder_input_ids = [</s>, eng_Latn, tokens] with decoder_attention_mask, all right-padded with <pad>."""
  sources = []
  for lang, text in SOURCES:
    tokenizer.src_lang = lang
    sources.append(tokenizer(text)["input_ids"])
  tokenizer.tgt_lang = TGT_LANG
  labels = [tokenizer(text_target=text)["input_ids"] for text in TARGETS]
  input_ids, attention_mask = padded(sources, tokenizer.pad_token_id)
  decoder_input_ids, decoder_attention_mask = padded([[2] + row[:-1] for row in labels], tokenizer.pad_token_id)
  return dict(input_ids=input_ids, attention_mask=attention_mask, labels=padded(labels, tokenizer.pad_token_id)[0],
              decoder_input_ids=decoder_input_ids, decoder_attention_mask=decoder_attention_mask)


def fit(model, batch: dict[str, np.ndarray], steps: int = FIT_STEPS):
  """A few Adam steps on the reference pairs, so that greedy decoding is the targets rather than one token repeated
  (a random model's), rows end at different steps, and the best logits are far ahead of the next (no near-ties that
  float rounding could flip)."""
  torch.manual_seed(0)
  labels = torch.from_numpy(np.where(batch["decoder_attention_mask"] == 1, batch["labels"], -100))
  inputs = {k: torch.from_numpy(batch[k]) for k in ("input_ids", "attention_mask", "decoder_input_ids",
                                                    "decoder_attention_mask")}
  optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
  for _ in range(steps):  # in eval mode: no dropout, and the MoE's eval capacity (training's 8 would drop most)
    optimizer.zero_grad()
    model(**inputs, labels=labels).loss.backward()
    optimizer.step()


def routers(model) -> list[NllbMoeTop2Router]:
  return [m for m in model.modules() if isinstance(m, NllbMoeTop2Router)]


def record(router: NllbMoeTop2Router, out: tuple, kept: list[int], capacity: list[int]):
  """A router's kept assignments (its combine weights > 0) and the capacity it used (None: keep its output)."""
  kept.append(int((out[1] > 0).sum()))
  capacity.append(router.expert_capacity)


def forward(model, batch: dict[str, np.ndarray], fraction: float | None = None) -> dict[str, np.ndarray]:
  """encoder_last_hidden_state [B, Ls, M] and logits [B, Lt, V]; with `fraction`, every router's
  moe_eval_capacity_token_fraction set to it for this call, and each router's kept assignments and capacity."""
  names = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask")
  kept, capacity, hooks = [], [], []
  for router in routers(model):
    router.moe_eval_capacity_token_fraction = fraction or model.config.moe_eval_capacity_token_fraction
    hooks.append(router.register_forward_hook(lambda mod, args, out: record(mod, out, kept, capacity)))
  with torch.no_grad():
    out = model(**{k: torch.from_numpy(batch[k]) for k in names})
  for hook, router in zip(hooks, routers(model)):
    hook.remove()
    router.moe_eval_capacity_token_fraction = model.config.moe_eval_capacity_token_fraction
  return dict(encoder_last_hidden_state=out.encoder_last_hidden_state.numpy(), logits=out.logits.numpy(),
              kept=np.array(kept, np.int64), capacity=np.array(capacity, np.int64))


def greedy(model, batch: dict[str, np.ndarray], forced_bos: int) -> np.ndarray:
  """[B, <= 1 + MAX_NEW_TOKENS] ids: </s>, the forced language code, tokens, </s>, then <pad> (1)."""
  with torch.no_grad():
    out = model.generate(input_ids=torch.from_numpy(batch["input_ids"]),
                         attention_mask=torch.from_numpy(batch["attention_mask"]), num_beams=1, do_sample=False,
                         forced_bos_token_id=forced_bos, max_new_tokens=MAX_NEW_TOKENS)
  return out.numpy()


def write_reference(model, tokenizer, out: pathlib.Path, kind: str):
  """reference.npz (the batch, the outputs, greedy ids, and a few raw parameters for readers of the file) and
  reference.json (versions, texts, settings)."""
  batch = reference_batch(tokenizer)
  result = forward(model, batch)
  arrays = dict(batch, encoder_last_hidden_state=result["encoder_last_hidden_state"], logits=result["logits"],
                greedy=greedy(model, batch, tokenizer.convert_tokens_to_ids(TGT_LANG)))
  state = model.state_dict()
  for name in ("model.encoder.layers.0.self_attn.q_proj.bias",
               "model.decoder.layers.1.ffn.experts.expert_1.fc1.weight" if kind == "nllb_moe"
               else "model.decoder.layers.1.fc1.weight"):
    arrays[f"param/{name}"] = state[name].numpy()
  meta = dict(kind=kind, transformers=transformers.__version__, torch=torch.__version__,
              sentencepiece=spm.__version__, sources=SOURCES, targets=TARGETS, tgt_lang=TGT_LANG,
              forced_bos_token_id=tokenizer.convert_tokens_to_ids(TGT_LANG), max_new_tokens=MAX_NEW_TOKENS,
              attn_implementation="eager", generate_pads_finished_rows_with=model.generation_config.pad_token_id)
  if kind == "nllb_moe":
    binding = forward(model, batch, BINDING_FRACTION)
    assert (binding["kept"] < 2 * result["kept"]).any(), "capacity does not bind"
    arrays.update(logits_binding=binding["logits"], binding_kept=binding["kept"], kept=result["kept"])
    meta.update(binding_fraction=BINDING_FRACTION, binding_capacity=binding["capacity"].tolist(),
                binding_kept=binding["kept"].tolist(), kept=result["kept"].tolist(),
                routers=[name for name, m in model.named_modules() if isinstance(m, NllbMoeTop2Router)])
  np.savez_compressed(out / "reference.npz", **arrays)
  (out / "reference.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")


def tokenizer_cases(directory: pathlib.Path) -> list[dict]:
  """Each case's ids from the slow tokenizer (source side with src_lang, target side with tgt_lang), its decoding
  without special tokens, and the same from the fast tokenizer (converted from the same files): the ids agree, but
  where skip_special_tokens drops an <unk> the fast one's decoding keeps the space around it (the slow one strips
  the ends)."""
  slow = NllbTokenizer.from_pretrained(directory)
  fast = AutoTokenizer.from_pretrained(directory)
  cases = []
  for lang, text in CASES:
    case = dict(src_lang=lang, tgt_lang=lang, text=text)
    for name, tok in (("", slow), ("fast_", fast)):
      tok.src_lang, tok.tgt_lang = lang, lang
      case[f"{name}ids"] = tok(text)["input_ids"]
      case[f"{name}target_ids"] = tok(text_target=text)["input_ids"]
      case[f"{name}decoded"] = tok.decode(case[f"{name}ids"], skip_special_tokens=True)
    case["fast_same_ids"] = case["fast_ids"] == case["ids"] and case["fast_target_ids"] == case["target_ids"]
    case["fast_same_decoded"] = case["fast_decoded"] == case["decoded"]
    cases.append(case)
  return cases


def save(model, tokenizer, directory: pathlib.Path, linked: pathlib.Path | None):
  """save_pretrained of the model (safetensors, float32) and the tokenizer; with `linked`, the tokenizer's files are
  links to those of the tokenizer saved there (the fixtures keep one copy)."""
  model.save_pretrained(directory, safe_serialization=True)
  for folder in (directory, linked) if linked else (directory,):
    tokenizer.save_pretrained(folder)
    (folder / "added_tokens.json").unlink(missing_ok=True)  # tokenizer_config's added_tokens_decoder again
  for name in TOKENIZER_FILES if linked else ():
    (directory / name).unlink()
    (directory / name).symlink_to(os.path.relpath(linked / name, directory))


def make(out: pathlib.Path, seed: int):
  out.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory() as tmp:
    tokenizer = nllb_tokenizer(train_spm(pathlib.Path(tmp) / "sentencepiece.bpe.model", 300))
    for offset, kind in enumerate(("m2m100", "nllb_moe")):
      model = build_model(kind, len(tokenizer), FIXTURE_SIZES[kind], seed + offset)
      fit(model, reference_batch(tokenizer))
      save(model, tokenizer, out / kind, out / "tokenizer")
      write_reference(model, tokenizer, out / kind, kind)
  cases = tokenizer_cases(out / "tokenizer")
  (out / "tokenizer_cases.json").write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n")


def make_sized(kind: str, out: pathlib.Path, seed: int):
  out.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory() as tmp:
    tokenizer = nllb_tokenizer(train_spm(pathlib.Path(tmp) / "sentencepiece.bpe.model", 420))
    model = build_model(kind, len(tokenizer), SIZED[kind], seed)
    fit(model, reference_batch(tokenizer))
    save(model, tokenizer, out, None)
  write_reference(model, tokenizer, out, kind)
  (out / "tokenizer_cases.json").write_text(json.dumps(tokenizer_cases(out), indent=1, ensure_ascii=False) + "\n")


def compare(name: str, got: np.ndarray, want: np.ndarray, problems: list[str]):
  if got.shape != want.shape:
    problems.append(f"{name}: shape {got.shape}, reference {want.shape}")
    return
  diff = float(np.abs(got - want).max()) if got.size else 0.0
  print(f"{name}: max abs diff {diff:.3g}")
  if not diff <= TOLERANCE:
    problems.append(f"{name} differ by {diff:.3g} (> {TOLERANCE})")


def check_tokenizer(directory: pathlib.Path, cases_file: pathlib.Path, problems: list[str]):
  cases = json.loads(cases_file.read_text())
  tokenizers = ("", NllbTokenizer.from_pretrained(directory)), ("fast_", AutoTokenizer.from_pretrained(directory))
  for prefix, tok in tokenizers:
    wrong = 0
    for case in cases:
      tok.src_lang, tok.tgt_lang = case["src_lang"], case["tgt_lang"]
      got = (tok(case["text"])["input_ids"], tok(text_target=case["text"])["input_ids"])
      wrong += got != (case[f"{prefix}ids"], case[f"{prefix}target_ids"])
    print(f"{type(tok).__name__}: {len(cases) - wrong} of {len(cases)} cases as {cases_file}")
    if wrong:
      problems.append(f"{type(tok).__name__} of {directory} encodes {wrong} of {len(cases)} cases otherwise")


def check(directory: pathlib.Path, reference: pathlib.Path, cases_file: pathlib.Path | None) -> list[str]:
  """Problems of the export in `directory` against the reference: logits (and at binding capacity), encoder
  output, greedy ids, tokenizer cases."""
  want = dict(np.load(reference))
  meta = json.loads(reference.with_suffix(".json").read_text())
  model = AutoModelForSeq2SeqLM.from_pretrained(directory, attn_implementation="eager", dtype=torch.float32)
  model.eval()
  problems: list[str] = []
  got = forward(model, want)
  compare("encoder_last_hidden_state", got["encoder_last_hidden_state"], want["encoder_last_hidden_state"], problems)
  compare("logits", got["logits"], want["logits"], problems)
  if "logits_binding" in want:
    compare("logits_binding", forward(model, want, meta["binding_fraction"])["logits"], want["logits_binding"],
            problems)
  ids = greedy(model, want, meta["forced_bos_token_id"])
  print(f"greedy: {ids.tolist()}")
  if ids.shape != want["greedy"].shape or (ids != want["greedy"]).any():
    problems.append(f"greedy ids {ids.tolist()}, reference {want['greedy'].tolist()}")
  if cases_file is None:
    found = [p / "tokenizer_cases.json" for p in (reference.parent, reference.parent.parent)]
    cases_file = next((p for p in found if p.exists()), None)
  if cases_file is not None:
    check_tokenizer(directory, cases_file, problems)
  return problems


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest="command", required=True)
  made = commands.add_parser("make", help="the committed fixtures")
  made.add_argument("--out", type=pathlib.Path, default=pathlib.Path("tests/fixtures/hf"))
  made.add_argument("--seed", type=int, default=0)
  checked = commands.add_parser("check", help="an exported directory against a reference.npz")
  checked.add_argument("--model", type=pathlib.Path, required=True)
  checked.add_argument("--reference", type=pathlib.Path, required=True)
  checked.add_argument("--cases", type=pathlib.Path, help="tokenizer_cases.json (default: beside the reference or "
                                                          "in its parent folder)")
  sized = commands.add_parser("make-sized", help="a model of other sizes than the fixtures', with its reference")
  sized.add_argument("--kind", choices=sorted(SIZED), required=True)
  sized.add_argument("--out", type=pathlib.Path, required=True)
  sized.add_argument("--seed", type=int, default=1)
  args = parser.parse_args(argv)
  if args.command == "make":
    make(args.out, args.seed)
  elif args.command == "make-sized":
    make_sized(args.kind, args.out, args.seed)
  else:
    problems = check(args.model, args.reference, args.cases)
    if problems:
      print(f"error: {args.model} is not the reference: " + "; ".join(problems), file=sys.stderr)
      return 1
    print(f"{args.model}: as the reference")
  return 0


if __name__ == "__main__":
  sys.exit(main())
