"""What GShard's six MoE translation models share (arXiv 2006.16668, Appendix A.2 and Table 3); the files
configs/moe_{128e,512e,2048e}_{12l,36l}.py each call `moe_config` with what differs: experts, layers and batch.

- Geometry: M=1024, dense FFN and expert hidden 8192, 16 heads of dimension 128 (attention width 2048), dropout 0.1,
  ReLU experts, a top-2 MoE layer in place of every other FFN in the encoder and in the decoder; the layers are
  split evenly between encoder and decoder (36L = 18 + 18).
- Experts: capacity factor 1.0 while training, the paper's 2N/E slots per expert and group (`moe.min_capacity=1`:
  the default floor of 4 would give the 2048E models 4 slots where 2N/E is 1, doubling their FLOPs); one expert
  per core, the groups split over the same cores (the paper's layout).
- Optimizer: Adafactor (gshard_mt/training/optimizer.py gives its settings and sources): factored second moment,
  beta1 = 0, second-moment decay 1 - t^-0.8, update clipping 1.0, updates relative to each weight's RMS. The paper's
  "learning rate 1.0 with reciprocal-square-root decay after 10k steps" is Lingvo's SqrtDecay, 1.0 x
  rsqrt(max(step, 10k)): 0.01 held for the first 10k steps, then 1/sqrt(step). Here `learning_rate` is the rate at
  the end of warmup, so 0.01 with `warmup='constant'`. No global-norm gradient clipping (the paper names none;
  Lingvo's default is none).
- Precision: float32 weights and activations, as the paper trained (it reports bf16 activations only for a 1T
  model it left out for instability). bf16 activations are one override away: `--config.model.dtype=bfloat16`.
- Vocabulary: one 64k SentencePiece model. The paper had a 64k source vocabulary and a separate 32k English target
  vocabulary; this code has one tokenizer for both sides and, with `model.share_embeddings`, one input embedding.
  Separate vocabularies would need a second SentencePiece model trained on the English side, the pipeline
  encoding each side with its own, the model's target embedding and logits sized by the target vocabulary, and
  decoding (eval.py, translate.py, the in-training BLEU) detokenizing with the target model. The parameter count
  would not change ([64k + 64k] x M rows here against [64k + 32k + 32k] x M with an untied 32k output), but the
  float32 [tokens, V] logits would halve: 32k x 4 bytes less per token, 250 MiB per core at the 2048E models'
  2,048 tokens per core, 1 GiB at the 128E models' 8,192.
- Rows of 512 tokens per side; `batch_size` = batch tokens / 512. Layers are rematerialised in the backward pass
  (the paper reports 28% of cycles spent recomputing at 36 layers).
"""

from gshard_mt.config import defaults
from gshard_mt.errors import ConfigError

MAX_LENGTH = 512  # tokens per row and side


def moe_config(num_experts: int, num_layers: int, batch_tokens: int):
  """MoE(`num_experts`E, `num_layers`L) on `num_experts` cores with `batch_tokens` tokens per side and step."""
  if batch_tokens % MAX_LENGTH or num_layers % 4:
    raise ConfigError(f"batch_tokens={batch_tokens} must be a multiple of {MAX_LENGTH} and num_layers={num_layers} "
                      "a multiple of 4 (two equal stacks of MoE/dense pairs)")
  c = defaults.get_config()
  c.batch_size = batch_tokens // MAX_LENGTH
  c.data.max_length = MAX_LENGTH
  c.data.vocab_size = 64_000
  c.model.emb_dim = 1024
  c.model.num_heads = 16
  c.model.head_dim = 128
  c.model.mlp_dim = 8192
  c.model.num_encoder_layers = num_layers // 2
  c.model.num_decoder_layers = num_layers // 2
  c.model.moe_interval = 2
  c.model.dropout_rate = 0.1
  c.model.dtype = "float32"
  c.model.remat = "full"
  c.moe.num_experts = num_experts
  c.moe.hidden_dim = 8192
  c.moe.activation = "relu"
  c.moe.train_capacity_factor = 1.0
  c.moe.min_capacity = 1
  c.moe.group_size = 1024
  c.moe.second_expert_policy = "random"
  c.mesh.data = 1
  c.mesh.expert = num_experts
  c.mesh.model = 1
  c.partitioning = "expert"
  c.optimizer.name = "adafactor"
  c.optimizer.learning_rate = 0.01
  c.optimizer.schedule = "rsqrt"
  c.optimizer.warmup = "constant"
  c.optimizer.warmup_steps = 10_000
  c.optimizer.grad_clip_norm = 0.0
  c.optimizer.weight_decay = 0.0
  return c
