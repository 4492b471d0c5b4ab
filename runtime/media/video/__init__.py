"""Video input for the Qwen-VL towers: a `video` content part (a file, a list of frame images, a data
URL) decoded with PyAV (decode.py), its frames sampled and sized as transformers' video processors do
(sampling.py), cut into the tower's patches (frames.py), and placed in the prompt with its mRoPE
positions (prompt.py)."""
