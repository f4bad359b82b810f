"""Every configuration key with its default. The files in configs/ start from `get_config()` here and change a
few keys; docs/config.md documents every key (tests/unit/test_docs.py checks it against this file). The `moe`
keys, defaults and comments are those of `gshard_mt.config.moe.MoeConfig`."""

import dataclasses

import ml_collections

from gshard_mt.config.moe import MoeConfig


def get_config():
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.batch_size = 64  # global rows per step; each row packs several pairs
  # Gradient accumulation: the step runs batch_size / num_microbatches rows at a time and makes one update (the
  # whole batch's, MoE groups formed within each microbatch): the paper's batch on fewer chips.
  c.num_microbatches = 1
  c.num_train_steps = 1000
  c.log_every = 50
  c.eval_every = 500  # dev loss and perplexity
  c.eval_batches = 20  # dev batches per evaluation (0 = all)
  # Greedy dev BLEU and chrF++ of a fixed sample, scored as eval.py scores a split: each language's corpus BLEU
  # over its sampled pairs, then the mean over the languages (0 = never)
  c.eval_bleu_every = 0
  # Dev pairs of each language in that sample (all of a language's when it has fewer). Corpus BLEU of a few short
  # sentences is inflated by sacrebleu's smoothing of absent n-grams: 32 keeps that under 0.3 BLEU on configs/tiny.py
  c.eval_bleu_per_language = 32
  c.eval_bleu_sentences = 4096  # the most pairs in the sample (its time): languages beyond it are left out, whole
  c.checkpoint_every = 500
  c.keep_checkpoints = 3
  c.nonfinite = "stop"  # 'stop': stop with a message naming the step; 'skip': skip the update

  c.data = ml_collections.ConfigDict()
  # 'tatoeba', 'multi30k' (both shipped), 'folder', 'tsv', 'tfds:NAME' (e.g. 'tfds:wmt19_translate/de-en'), 'tfds'
  # (= tfds:<data.tfds_name>); join with '+'
  c.data.source = "tatoeba"
  c.data.path = ""  # folder or TSV file for 'folder' / 'tsv'
  c.data.prepared_dir = ""  # where prepared corpora live, shared by runs (local or gs://...); '' = <workdir>/tokenizer
  c.data.tfds_name = ""  # e.g. 'wmt19_translate/de-en'
  c.data.tfds_data_dir = ""
  c.data.tfds_source_key = ""  # '' = the non-English language of the Translation feature
  c.data.languages = ""  # comma-separated codes; '' = all
  c.data.dev_fraction = 0.1
  c.data.test_fraction = 0.1
  c.data.min_eval_pairs = 5
  c.data.vocab_size = 8000
  c.data.character_coverage = 0.9995
  c.data.source_tags = True  # prepend a <xx> source-language tag
  c.data.temperature = 5.0  # language sampling p ~ n^(1/T); 1 = proportional, inf = uniform
  c.data.max_length = 64  # source tokens per training row (longer pairs are filtered); both sides in evaluation
  c.data.max_target_length = 0  # target tokens per training row (longer pairs are filtered); 0 = max_length
  c.data.seed = 0
  c.data.prefetch = 2  # batches prepared ahead, on the devices

  c.model = ml_collections.ConfigDict()
  c.model.emb_dim = 512  # M
  c.model.num_heads = 8
  c.model.head_dim = 64
  c.model.mlp_dim = 2048  # hidden size of the dense FFNs
  c.model.num_encoder_layers = 6
  c.model.num_decoder_layers = 6
  c.model.moe_interval = 2  # every 2nd FFN is MoE; 0 = dense baseline
  c.model.share_embeddings = True  # one input embedding for source and target
  c.model.tied_logits = False  # output logits through the target embedding (its input token then starts high)
  c.model.embedding = "vaswani"  # embedding scale scheme (model.EMBEDDING_SCHEMES): 'vaswani' or 't5'
  c.model.positions = "sinusoidal"  # or 'learned'
  c.model.max_position = 512  # for learned positions
  c.model.dropout_rate = 0.1
  # the dropout masks' random bits (model.layers.DROPOUT_KEYS): 'threefry', or 'rbg' (XLA's RngBitGenerator; for GPUs)
  c.model.dropout_rng = "threefry"
  c.model.attention_dropout_rate = 0.0
  # 'xla': einsums with an additive mask (the reference; attention dropout); 'fused': jax.nn.dot_product_attention
  # with a boolean mask, cuDNN's flash attention on GPUs; 'pallas': the whole block in our Pallas kernels for TPUs
  # (model.pallas_attention; interpret mode elsewhere, for tests) (model.layers.ATTENTIONS; no attention dropout)
  c.model.attention = "xla"
  c.model.dtype = "bfloat16"  # computation; parameters are float32
  c.model.residual_dtype = "float32"  # the residual stream: 'float32' or 'bfloat16' (layer norms stay float32)
  c.model.remat = "none"  # what a layer unit keeps for the backward pass (model.REMAT_POLICIES): 'none', 'full', ...
  c.model.scan_layers = True  # compile one layer unit, not one per layer

  c.moe = ml_collections.ConfigDict(dataclasses.asdict(MoeConfig()))  # its fields, defaults and comments

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.name = "adafactor"  # or 'adam'
  c.optimizer.learning_rate = 1.0  # the rate at the end of warmup; 'rsqrt' then decays it as sqrt(warmup / step)
  c.optimizer.schedule = "rsqrt"  # reciprocal square root after warmup; or 'constant'
  c.optimizer.warmup = "linear"  # during warmup: 'linear' ramp to learning_rate, or 'constant' (held; GShard's)
  c.optimizer.warmup_steps = 1000
  c.optimizer.grad_clip_norm = 1.0  # the gradient's global norm is clipped to this; 0 = no clipping
  c.optimizer.weight_decay = 0.0
  # 'xla': the optax chain as XLA compiles it; 'pallas': Adafactor's update as Pallas kernels for TPUs, three
  # passes over each weight (training.fused_adafactor; interpret mode elsewhere, for tests); same state
  c.optimizer.kernel = "xla"
  c.optimizer.label_smoothing = 0.1
  # the loss's reductions of the logits: 'xla' (plain jnp, every platform) or 'pallas' (one Pallas kernel pass for
  # TPUs, gshard_mt.tpu.kernels.logit_stats: compiled by libtpu, tested in interpret mode, never run on a TPU)
  c.optimizer.loss_kernel = "xla"

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1  # -1 = all devices not used by the other axes
  c.mesh.expert = 1
  c.mesh.model = 1
  # Multi-slice (TPU slices joined by the data-centre network, or GPU hosts): how many slices each axis spans.
  # Each axis is then mesh.<axis> x dcn_mesh.<axis> devices long, and `mesh` describes one slice.
  c.dcn_mesh = ml_collections.ConfigDict()
  c.dcn_mesh.data = 1
  c.dcn_mesh.expert = 1
  c.dcn_mesh.model = 1
  c.partitioning = "expert"  # logical axis rules: 'data', 'expert' or 'expert_model'

  # Multi-process runs: every process runs the same command with its own process_id (or, with auto=True, JAX
  # reads them from the cluster: TPU pods, SLURM, ...). One process on one host needs none of this.
  c.distributed = ml_collections.ConfigDict()
  c.distributed.auto = False  # jax.distributed.initialize() with the cluster's own settings
  c.distributed.coordinator_address = ""  # host:port of process 0
  c.distributed.num_processes = 1
  c.distributed.process_id = 0
  return c
