"""Tools that fit an EAGLE3 draft for a base that has none (not part of the build pipeline):
train_draft.py (the fitter), prompts.py (its built-in chat prompts), self_prompts.py (prompts the base
writes itself)."""
