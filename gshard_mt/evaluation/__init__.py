"""Evaluation: `decode` (beam search), `evaluate` (BLEU and chrF++ per language), `report`."""
