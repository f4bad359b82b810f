"""Evaluation: `decode` (beam search), `evaluate` (BLEU and chrF++ per language), `translate` (arbitrary lines),
`report`, and `flags` (what eval.py and translate.py share on their command lines)."""
