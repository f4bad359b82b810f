"""Evaluation: `evaluate` (BLEU and chrF++ per language), `translate` (arbitrary lines), `report` and `flags`."""
