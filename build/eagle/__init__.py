"""EAGLE3 drafts in the build: the model (model.py), its exported graph (graph.py), the published
checkpoint formats (formats.py), and the bundle stage's part (stage.py)."""
