"""A checkpoint's multi-token-prediction head (Qwen3.5's `mtp.*` tensors) as the engine's draft.

One MTP step (vLLM's Qwen3_5MultiTokenPredictor) predicts the token after next from the base's
final-normed hidden state at position t and the embedding of token t + 1:

    x = fc(cat([pre_fc_norm_embedding(embed(token t+1)), pre_fc_norm_hidden(hidden t)]))
    out = norm(layers.0(x))          (a full-attention decoder layer of the family, its own cache)
    logits = lm_head(out)            (the base's LM head) -> token t + 2

and a second step feeds `out` as the next hidden. `graph.py` is the exported step, with the EAGLE
draft graph's interface (schemas/graph_spec.draft_spec), so the engine's `draft` component holds it
as it holds an EAGLE draft (`kind: mtp`); `stage.py` is the bundle's part: the refusals, the
tensors, the export and the manifest entry. Torch-free here: the compile stage reads TREE_SIZE.
"""

# The most tokens a round may draft and verify with the head (the manifest's max_draft_tree_size and
# max_verify_tree_size; the TensorRT profiles hold them): a chain of MTP steps is short, as its
# acceptance falls with each step past the one the head was trained for.
TREE_SIZE = 8
