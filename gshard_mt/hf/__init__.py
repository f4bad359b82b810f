"""Interoperation with Hugging Face transformers checkpoints: M2M100 (NLLB-200) and NllbMoe (NLLB-MoE)."""
