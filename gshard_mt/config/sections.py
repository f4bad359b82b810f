"""The config: one frozen dataclass per section with its defaults and checks (each error one line naming the key), and
`Config`, the run's keys holding the sections. Config files edit `defaults.get_config()`; `config.parse` turns the
result into a `Config` once, where the command line meets the code; `training.validate` then checks the names that
choose code (routers, sources, ...) and what only a combination of options can break. docs/config.md documents every
key (tests/unit/test_docs.py checks its defaults). Also how a step's batch splits into microbatches, rows and the
MoE groups of S tokens (GShard section 2.2: group-local dispatch). Plain Python, no JAX.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar

from gshard_mt.config.checks import Plus, Section, fraction
from gshard_mt.config.errors import ConfigError
from gshard_mt.config.layout import DcnMeshConfig, DistributedConfig, MeshConfig
from gshard_mt.config.moe import MoeConfig
from gshard_mt.config.platforms import AUTO

DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class DataConfig(Section):
  """Where the pairs come from, how they are split and tokenized, and the rows they are packed into."""

  KEY: ClassVar[str] = "data"
  POSITIVE: ClassVar[tuple[str, ...]] = ("max_length", "vocab_size")
  NONNEGATIVE: ClassVar[dict[str, str]] = {"max_target_length": "0 = data.max_length",
                                           "min_eval_pairs": "0 = no minimum"}
  RANGES: ClassVar[dict[str, tuple]] = {"dev_fraction": fraction(), "test_fraction": fraction(),
                                        "character_coverage": fraction(low_open=True)}

  source: str = "tatoeba"  # 'tatoeba', 'multi30k', 'folder', 'tsv', 'tfds:NAME', 'tfds'; several joined with '+'
  path: str = ""  # folder or TSV file for 'folder' / 'tsv'
  prepared_dir: str = ""  # where prepared corpora live, shared by runs (local or gs://...); '' = <workdir>/tokenizer
  tfds_name: str = ""  # e.g. 'wmt19_translate/de-en'
  tfds_data_dir: str = ""
  tfds_source_key: str = ""  # '' = the non-English language of the Translation feature
  languages: str = ""  # comma-separated codes; '' = all
  dev_fraction: float = 0.1
  test_fraction: float = 0.1
  min_eval_pairs: int = 5
  tokenizer: str = ""  # '' = train a SentencePiece model on the corpus; else an spm model file or NLLB tokenizer dir
  vocab_size: int = 8000
  character_coverage: float = 0.9995
  source_tags: bool = True  # prepend a <xx> source-language tag
  temperature: float = 5.0  # language sampling p ~ n^(1/T); 1 = proportional, inf = uniform
  max_length: int = 64  # source tokens per training row (longer pairs are filtered); both sides in evaluation
  max_target_length: int = 0  # target tokens per training row (longer pairs are filtered); 0 = max_length
  seed: int = 0
  prefetch: int = 2  # batches prepared ahead, on the devices

  def check_values(self):
    super().check_values()
    if not self.temperature > 0:
      raise ConfigError(f"data.temperature={self.temperature}: expected > 0 (inf for uniform)")


@dataclasses.dataclass(frozen=True)
class ModelConfig(Section):
  """The Transformer's shape and numerics (letters: M model dim; the MoE layer's are in `moe`)."""

  KEY: ClassVar[str] = "model"
  CHOICES: ClassVar[dict[str, Any]] = {"positions": ("sinusoidal", "learned"), "dtype": DTYPES,
                                       "residual_dtype": Plus(AUTO, DTYPES)}
  POSITIVE: ClassVar[tuple[str, ...]] = ("emb_dim", "num_heads", "head_dim", "mlp_dim", "max_position",
                                          "scan_unroll")
  NONNEGATIVE: ClassVar[dict[str, str]] = {"moe_interval": "0 = dense", "num_encoder_layers": "0 = none",
                                           "num_decoder_layers": "0 = none", "position_offset": "0 = from 0",
                                           "vocab_size": "0 = the tokenizer's"}
  RANGES: ClassVar[dict[str, tuple]] = {"dropout_rate": fraction(), "attention_dropout_rate": fraction(),
                                        "layer_norm_epsilon": (lambda x: x > 0, "> 0")}

  emb_dim: int = 512  # M
  vocab_size: int = 0  # V, the embedding's rows; 0 = the tokenizer's (an imported model may have more)
  num_heads: int = 8
  head_dim: int = 64
  mlp_dim: int = 2048  # hidden size of the dense FFNs
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  moe_interval: int = 2  # every 2nd FFN is MoE; 0 = dense baseline
  share_embeddings: bool = True  # one input embedding for source and target
  tied_logits: bool = False  # output logits through the target embedding (its input token then starts high)
  embedding: str = "vaswani"  # embedding scale scheme: 'vaswani' or 't5' (model.transformer.EMBEDDING_SCHEMES)
  positions: str = "sinusoidal"  # or 'learned'
  max_position: int = 512  # for learned positions
  position_offset: int = 0  # a pair's first token's position (fairseq's and NLLB's: 2, padding_idx + 1)
  bias: bool = False  # a bias on every attention projection (q, k, v, out) and dense FFN matmul (NLLB, M2M100)
  layer_norm_epsilon: float = 1e-6  # flax's default; NLLB's and M2M100's: 1e-5
  dropout_rate: float = 0.1
  dropout_rng: str = "auto"  # the dropout masks' bits: 'threefry', 'rbg' (XLA's RngBitGenerator); auto: threefry
  attention_dropout_rate: float = 0.0
  attention: str = "auto"  # 'xla' (the reference; the only one with attention dropout), 'fused' (cuDNN), a kernel's
  dtype: str = "bfloat16"  # computation; parameters are float32
  residual_dtype: str = "auto"  # 'float32' or 'bfloat16' (layer norms stay float32); auto: a bf16 model's on GPUs
  remat: str = "none"  # what a layer unit keeps for the backward pass: 'none', 'full', ...
  scan_layers: bool = True  # compile one layer unit, not one per layer
  scan_unroll: int = 1  # with scan_layers: layer units per loop iteration (lax.scan's unroll)

  def check_values(self):
    super().check_values()
    if self.attention not in ("xla", "auto") and self.attention_dropout_rate:
      raise ConfigError(f"model.attention={self.attention!r} has no attention dropout: it needs "
                        f"model.attention_dropout_rate=0, not {self.attention_dropout_rate}")
    if self.positions == "sinusoidal" and self.emb_dim % 2:
      raise ConfigError(f"model.emb_dim={self.emb_dim}: sinusoidal positions (model.positions) pair a sine with a "
                        "cosine, so they need an even width")
    for key in ("num_encoder_layers", "num_decoder_layers"):
      if self.moe_interval and getattr(self, key) % self.moe_interval:
        raise ConfigError(f"model.{key}={getattr(self, key)} is not a multiple of "
                          f"model.moe_interval={self.moe_interval}")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(Section):
  """The optimizer, its learning-rate schedule (training.schedules.SCHEDULES) and the loss's smoothing."""

  KEY: ClassVar[str] = "optimizer"
  CHOICES: ClassVar[dict[str, Any]] = {"name": ("adafactor", "adam"), "warmup": ("linear", "constant")}
  NONNEGATIVE: ClassVar[dict[str, str]] = {"warmup_steps": "0 = none"}
  RANGES: ClassVar[dict[str, tuple]] = {
      "learning_rate": (lambda x: x > 0, "> 0"), "grad_clip_norm": (lambda x: x >= 0, ">= 0 (0 = no clipping)"),
      "weight_decay": (lambda x: x >= 0, ">= 0"), "label_smoothing": fraction()}

  name: str = "adafactor"  # or 'adam'
  learning_rate: float = 0.01  # the rate at the end of warmup (GShard's, Adafactor's cap); 'rsqrt' then decays it
  schedule: str = "rsqrt"  # reciprocal square root after warmup; or 'constant'
  warmup: str = "linear"  # during warmup: 'linear' ramp to learning_rate, or 'constant' (held; GShard's)
  warmup_steps: int = 1000
  grad_clip_norm: float = 1.0  # the gradient's global norm is clipped to this; 0 = no clipping
  weight_decay: float = 0.0
  kernel: str = "xla"  # 'xla' (optax), or a kernel's: Adafactor's update in three kernel passes for TPUs
  label_smoothing: float = 0.1
  loss_kernel: str = "xla"  # the loss's logit reductions: 'xla', or a kernel's (for TPUs; never run on one yet)


def _default(cls):
  return dataclasses.field(default_factory=cls)


@dataclasses.dataclass(frozen=True)
class Config(Section):
  """The run: its own keys and the sections."""

  CHOICES: ClassVar[dict[str, Any]] = {"nonfinite": ("stop", "skip")}
  POSITIVE: ClassVar[tuple[str, ...]] = ("batch_size", "num_microbatches", "num_train_steps", "log_every",
                                         "checkpoint_every", "keep_checkpoints", "eval_bleu_sentences",
                                         "eval_bleu_per_language")
  NONNEGATIVE: ClassVar[dict[str, str]] = {"eval_bleu_every": "0 = never", "eval_every": "0 = never",
                                           "eval_batches": "0 = all", "init_from_noise": "0 = exact copies"}

  seed: int = 0
  batch_size: int = 64  # global rows per step; each row packs several pairs
  num_microbatches: int = 1  # gradient accumulation (MoE groups per microbatch): the paper's batch on fewer chips
  num_train_steps: int = 1000
  log_every: int = 50
  eval_every: int = 500  # dev loss and perplexity
  eval_batches: int = 20  # dev batches per evaluation (0 = all)
  eval_bleu_every: int = 0  # greedy dev BLEU and chrF++ of a fixed sample, scored as eval.py scores a split
  # dev pairs of each language in that sample; sacrebleu's smoothing inflates the BLEU of a few short sentences:
  # 32 keeps that under 0.3 BLEU on configs/tiny.py
  eval_bleu_per_language: int = 32
  eval_bleu_sentences: int = 4096  # the most pairs in the sample (its time): languages beyond it are left out, whole
  checkpoint_every: int = 500
  keep_checkpoints: int = 3
  nonfinite: str = "stop"  # 'stop': stop with a message naming the step; 'skip': skip the update
  init_from: str = ""  # a run to start from: a dense one is upcycled (its FFN copied into every expert), or fine-tuned
  init_from_noise: float = 0.0  # upcycled experts: plus Gaussian noise of this share of the dense weight's std
  init_from_upcycle: bool = True  # a MoE config from a dense run upcycles it; False: takes its architecture
  data: DataConfig = _default(DataConfig)
  model: ModelConfig = _default(ModelConfig)
  moe: MoeConfig = _default(MoeConfig)
  optimizer: OptimizerConfig = _default(OptimizerConfig)
  mesh: MeshConfig = _default(MeshConfig)
  dcn_mesh: DcnMeshConfig = _default(DcnMeshConfig)
  partitioning: str = "expert"  # logical axis rules: 'data', 'expert' or 'expert_model' (parallel.rules.RULES)
  distributed: DistributedConfig = _default(DistributedConfig)

  def check_values(self):
    super().check_values()
    if self.batch_size % self.num_microbatches:
      raise ConfigError(f"num_microbatches={self.num_microbatches} does not divide batch_size={self.batch_size}")
    model = self.model
    if model.positions == "learned" and max(row_lengths(self)) + model.position_offset > model.max_position:
      raise ConfigError(f"data.max_length={self.data.max_length} (data.max_target_length="  # NaN beyond the table
                        f"{self.data.max_target_length}) + model.position_offset={model.position_offset} exceeds "
                        f"model.max_position={model.max_position}, the learned positions")


SECTIONS = {name: kind for name, kind in typing.get_type_hints(Config).items() if dataclasses.is_dataclass(kind)}


def microbatch_rows(config) -> int:
  """Rows of one microbatch: what each forward and backward pass of a training step sees."""
  return config.batch_size // config.num_microbatches


def row_lengths(config) -> tuple[int, int]:
  """(source, target) tokens per training row (max_target_length 0 = max_length). Sources take ~1.6x the tokens of
  their English targets, so equal lengths leave target slots empty."""
  return config.data.max_length, config.data.max_target_length or config.data.max_length


def moe_group_error(config, group_devices: int = 1, group_size: int | None = None) -> str | None:
  """Why the MoE groups of S tokens (`group_size`, default moe.group_size) fail, in one line, or None. Each side's
  tokens must be whole groups (without microbatches, fewer tokens make one group) that split over `group_devices`,
  the devices of the mesh axes the rules give 'group'."""
  if not config.model.moe_interval:
    return None
  size, micro = group_size or config.moe.group_size, config.num_microbatches > 1
  batch, rows = ("microbatch", "batch_size / num_microbatches") if micro else ("batch", "batch_size")
  for key, length in zip(("data.max_length", "data.max_target_length"), row_lengths(config)):
    tokens = microbatch_rows(config) * length
    if tokens % size and (tokens > size or micro):
      return (f"moe.group_size={size} does not divide the {tokens} tokens of a {batch} "
              f"(batch_size={config.batch_size}{f' / num_microbatches={config.num_microbatches}' * micro} x "
              f"{key}={length})")
    if (groups := max(tokens // size, 1)) % group_devices:
      return (f"the {groups} MoE groups of a {batch} ({rows} x {key}={length} / moe.group_size) do not split "
              f"over the {group_devices} devices of the mesh axes the groups are split over; lower moe.group_size "
              "or raise batch_size")
  return None
