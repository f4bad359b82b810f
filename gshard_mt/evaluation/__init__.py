"""Evaluation: `evaluate` (BLEU and chrF++ per language), `report` and `flags` (what eval.py and translate.py share)."""
