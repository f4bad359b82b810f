"""Interoperation with Hugging Face transformers checkpoints."""
