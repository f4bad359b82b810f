"""Reference checkpoints from Hugging Face transformers for the NLLB import/export (tests/fixtures/hf), and the check
that an exported directory gives transformers' own answers. Run by hand in a separate environment, never in `make
test` (CI installs no torch):

  python -m venv /work/hfenv && /work/hfenv/bin/pip install torch==2.13.0 transformers==4.57.1 sentencepiece \
    protobuf safetensors numpy           # the CPU torch wheel
  /work/hfenv/bin/python tools/hf_fixtures.py make --out tests/fixtures/hf
  /work/hfenv/bin/python tools/hf_fixtures.py check --model DIR --reference tests/fixtures/hf/nllb_moe/reference.npz
  /work/hfenv/bin/python tools/hf_fixtures.py make-sized --kind nllb_moe --out /tmp/sized [--seed 1]

transformers 4.57.1 exactly: 5.x's NllbMoe is wrong (only experts 0 and 1 run). Models run in eval mode, float32,
eager attention; tools/hf_reference.py builds them and their inputs. `make` writes, each run the same bytes:
- tokenizer/: a tiny SentencePiece BPE model (300 pieces, nmt_nfkc like NLLB's sentencepiece.bpe.model, whose
  normalisation table alone is 240 KB) and the slow NllbTokenizer on it saved (legacy_behaviour False), with NLLB's
  ids: <s> <pad> </s> <unk> = 0-3, piece p at p + 1, the 202 language codes from len(spm) + 1, <mask> last.
- m2m100/, nllb_moe/: what save_pretrained writes (config.json, generation_config.json, model.safetensors; the
  tokenizer's files as links to tokenizer/'s, kept once), from seeded models whose Linear biases and LayerNorm
  parameters are random (HF's init zeroes them) fitted 200 Adam steps to the reference pairs (greedy decoding is then
  the targets, rows end at different steps, no near-ties); reference.npz (the batch, encoder_last_hidden_state,
  logits, greedy, for nllb_moe logits_binding at moe_eval_capacity_token_fraction 0.25 and each router's kept
  assignments, two raw parameters as param/NAME) and reference.json (versions, texts, capacities, router names).
- tokenizer_cases.json: texts in several scripts with the slow and fast tokenizers' source and target ids and
  decodings.
Parameter names: model.shared.weight (the embedding; lm_head tied to it, not in the file), model.{encoder,decoder}.
layers.N.self_attn.{q,k,v,out}_proj.{weight,bias} ([out, in] as nn.Linear), ..layer_norm.{weight,bias}; M2M100:
self_attn_layer_norm, encoder_attn(_layer_norm), final_layer_norm, fc1, fc2; NllbMoe: self_attn_layer_norm,
cross_attention(_layer_norm), ff_layer_norm, dense ffn.fc1/fc2, sparse ffn.router.classifier.weight [E, M] and
ffn.experts.expert_K.fc1/fc2; model.{encoder,decoder}.layer_norm.

What transformers 4.57.1 does (modeling_m2m_100.py, modeling_nllb_moe.py, tokenization_nllb.py):
- Tokens: source `[src_lang] pieces </s>`, target (text_target) `[tgt_lang] pieces </s>` (legacy_behaviour=False).
  Embeddings scaled by sqrt(d_model) (scale_embedding); the pad row of model.shared is zero here, as in NLLB's.
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
  FFN output (the residual carries them). In a full decoder forward that row is the decoder's key padding; with a
  KV cache it would be taken wrongly ([-nb_tokens:] of B*(past+1) entries), but in generate() the decoder's mask
  is None (checked): every new token, a finished row's pad too, is routed.
- Positions in the buffers (batch_prioritized_routing False): loc1 = cumsum(e1 mask) - 1 over the flat tokens;
  loc2 = cumsum(e2 mask) - 1 + (the number of top-1 requests of that expert, dropped ones too): every top-1 before
  any top-2 (the same drops as counting only the kept top-1s: a top-1 count >= capacity drops every top-2 of that
  expert either way). Capacity in eval with moe_eval_capacity_token_fraction > 0: ceil(fraction * B*L), padding
  counted in B*L, the same for every expert (expert_capacity is used only in training, and the router overwrites it
  in eval); an assignment is kept iff loc < capacity. With fraction 1.0 nothing is ever dropped.
- Gates after the drops (normalize_router_prob_before_dropping False): g1 = p1 * kept1 / max(p1 kept1 + p2 kept2,
  eps of the router dtype), g2 likewise, so a token whose second choice was dropped gets g1 = 1; dropped both ways: 0.
- Expert output in eval multiplied by (1 - moe_token_dropout) before the gate (training: dropout instead); MoE
  output = sum over experts of gate * expert(x). Each decoding step of generate() routes only its B new tokens:
  capacity ceil(fraction * B) per step, so binding capacities differ between a cached and a full forward.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile

# the script's own folder, on sys.path when run as `python tools/hf_fixtures.py`
import hf_reference as ref
import numpy as np
import sentencepiece as spm
import torch
import transformers
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, NllbTokenizer
from transformers.models.nllb_moe.modeling_nllb_moe import NllbMoeTop2Router

BINDING_FRACTION = 0.25  # moe_eval_capacity_token_fraction at which capacity binds in the tiny batch
TOKENIZER_FILES = ("sentencepiece.bpe.model", "tokenizer_config.json", "special_tokens_map.json")
TOLERANCE = 1e-5


def write_reference(model, tokenizer, out: pathlib.Path, kind: str):
  """reference.npz (the batch, the outputs, greedy ids, and a few raw parameters for readers of the file) and
  reference.json (versions, texts, settings)."""
  batch = ref.reference_batch(tokenizer)
  result = ref.forward(model, batch)
  arrays = dict(batch, encoder_last_hidden_state=result["encoder_last_hidden_state"], logits=result["logits"],
                greedy=ref.greedy(model, batch, tokenizer.convert_tokens_to_ids(ref.TGT_LANG)))
  state = model.state_dict()
  last_ffn = [n for n in state if n.startswith("model.decoder.") and n.endswith("fc1.weight")]  # an expert's in MoE
  for name in ("model.encoder.layers.0.self_attn.q_proj.bias", last_ffn[-1]):
    arrays[f"param/{name}"] = state[name].numpy()
  meta = dict(kind=kind, transformers=transformers.__version__, torch=torch.__version__,
              sentencepiece=spm.__version__, sources=ref.SOURCES, targets=ref.TARGETS, tgt_lang=ref.TGT_LANG,
              forced_bos_token_id=tokenizer.convert_tokens_to_ids(ref.TGT_LANG), max_new_tokens=ref.MAX_NEW_TOKENS,
              attn_implementation="eager", generate_pads_finished_rows_with=model.generation_config.pad_token_id)
  if kind == "nllb_moe":
    binding = ref.forward(model, batch, BINDING_FRACTION)
    assert (binding["kept"] < 2 * result["kept"]).any(), "capacity does not bind"
    arrays.update(logits_binding=binding["logits"], binding_kept=binding["kept"], kept=result["kept"])
    meta.update(binding_fraction=BINDING_FRACTION, binding_capacity=binding["capacity"].tolist(),
                binding_kept=binding["kept"].tolist(), kept=result["kept"].tolist(),
                routers=[name for name, m in model.named_modules() if isinstance(m, NllbMoeTop2Router)])
  np.savez_compressed(out / "reference.npz", **arrays)
  (out / "reference.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")


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
    tokenizer = ref.nllb_tokenizer(ref.train_spm(pathlib.Path(tmp) / "sentencepiece.bpe.model", 300))
    for offset, kind in enumerate(("m2m100", "nllb_moe")):
      model = ref.build_model(kind, len(tokenizer), ref.FIXTURE_SIZES[kind], seed + offset)
      ref.fit(model, ref.reference_batch(tokenizer))
      save(model, tokenizer, out / kind, out / "tokenizer")
      write_reference(model, tokenizer, out / kind, kind)
  cases = ref.tokenizer_cases(out / "tokenizer")
  (out / "tokenizer_cases.json").write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n")


def make_sized(kind: str, out: pathlib.Path, seed: int):
  out.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory() as tmp:
    tokenizer = ref.nllb_tokenizer(ref.train_spm(pathlib.Path(tmp) / "sentencepiece.bpe.model", 420))
    model = ref.build_model(kind, len(tokenizer), ref.SIZED[kind], seed)
    ref.fit(model, ref.reference_batch(tokenizer))
    save(model, tokenizer, out, None)
  write_reference(model, tokenizer, out, kind)
  cases = ref.tokenizer_cases(out)
  (out / "tokenizer_cases.json").write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n")


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
  got = ref.forward(model, want)
  compare("encoder_last_hidden_state", got["encoder_last_hidden_state"], want["encoder_last_hidden_state"], problems)
  compare("logits", got["logits"], want["logits"], problems)
  if "logits_binding" in want:
    compare("logits_binding", ref.forward(model, want, meta["binding_fraction"])["logits"], want["logits_binding"],
            problems)
  ids = ref.greedy(model, want, meta["forced_bos_token_id"])
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
  sized.add_argument("--kind", choices=sorted(ref.SIZED), required=True)
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
