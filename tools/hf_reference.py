"""What transformers 4.57.1 computes on the reference inputs, for tools/hf_fixtures.py (which says how and why): the
tiny NLLB-style SentencePiece model and its NllbTokenizer, the seeded models, the reference batch, the forward pass
(with the routers' capacity fraction changed for one call), greedy decoding and the tokenizer cases. It imports torch,
transformers, sentencepiece and numpy, never gshard_mt."""

from __future__ import annotations

import io
import pathlib

import numpy as np
import sentencepiece as spm
import torch
import transformers
from transformers import AddedToken, AutoTokenizer, NllbTokenizer
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
MAX_NEW_TOKENS = 12
FIT_STEPS = 200
FIXTURE_SIZES = {"m2m100": dict(d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                                decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32),
                 "nllb_moe": dict(d_model=16, encoder_layers=4, decoder_layers=4, encoder_attention_heads=2,
                                  decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_experts=4,
                                  encoder_sparse_step=2, decoder_sparse_step=2, moe_token_dropout=0.2)}
# Other sizes than the fixtures' (heads, layers, ffn, experts, sparse steps and dropout all differ) for a by-hand
# check of the mapping.
SIZED = {"m2m100": dict(d_model=32, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64),
         "nllb_moe": dict(d_model=32, encoder_layers=6, decoder_layers=6, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_experts=8,
                          encoder_sparse_step=3, decoder_sparse_step=3, moe_token_dropout=0.1)}
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
