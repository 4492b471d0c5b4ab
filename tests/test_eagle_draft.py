"""The EAGLE3 draft: its math against transformers' building blocks, the exportable graph against the
eager forward (prefill, token by token, tree, training-time test), the published file formats, and the
CPU trainer end to end on a tiny model."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.models.llama import modeling_llama as hf_llama

from trt_llm.build.eagle import model as ed
from trt_llm.build.eagle.formats import load_draft, save_draft_eagle_format
from trt_llm.build.eagle.graph import DraftGraph
from trt_llm.build.eagle.model import Eagle3Draft

DRAFT_VOCAB = 96
LAYERS = 6  # default aux ids [2, 3, 3]


@pytest.fixture(scope="module")
def base(tiny_model):
    path = tiny_model("llama", num_hidden_layers=LAYERS)
    return path, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def random_draft(base_model, draft_vocab=DRAFT_VOCAB, seed=0) -> Eagle3Draft:
    torch.manual_seed(seed)
    draft = Eagle3Draft(Eagle3Draft.config_for_base(base_model.config, draft_vocab_size=draft_vocab))
    vocab = base_model.config.vocab_size
    with torch.no_grad():
        for name, param in draft.named_parameters():
            if name == "embed_tokens.weight":
                param.copy_(base_model.get_input_embeddings().weight)
            elif param.dim() == 2:
                param.normal_(0.0, 0.1)
            else:  # norms: not all ones, so a dropped or swapped norm shows
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
        draft.set_vocab_map(torch.randperm(vocab)[:draft_vocab].sort().values)
    draft.aux_layer_ids = ed.default_aux_layer_ids(LAYERS)
    return draft.eval()


def embedding(base_model):
    return base_model.get_input_embeddings().weight.detach()


def assert_same_draft(a: Eagle3Draft, b: Eagle3Draft):
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb)
    for name in sa:
        assert sa[name].dtype == sb[name].dtype, name
        assert torch.equal(sa[name], sb[name]), name
    assert a.aux_layer_ids == b.aux_layer_ids
    assert a.dims == b.dims


# ---------------------------------------------------------------------------------------------------
# The math


def test_state_dict_names_are_the_published_ones(base):
    draft = random_draft(base[1])
    assert set(draft.state_dict()) == {
        "embed_tokens.weight", "fc.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
        "midlayer.post_attention_layernorm.weight", "midlayer.self_attn.q_proj.weight",
        "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight",
        "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight",
        "norm.weight", "lm_head.weight", "d2t", "t2d",
    }
    h = base[1].config.hidden_size
    assert draft.fc.weight.shape == (h, 3 * h)
    assert draft.midlayer.self_attn.q_proj.weight.shape == (4 * 16, 2 * h)
    assert draft.midlayer.self_attn.k_proj.weight.shape == (2 * 16, 2 * h)
    assert draft.midlayer.self_attn.o_proj.weight.shape == (h, 4 * 16)
    assert draft.lm_head.weight.shape == (DRAFT_VOCAB, h)
    target = draft.draft_to_target(torch.arange(DRAFT_VOCAB))
    assert torch.equal(draft.t2d.nonzero().squeeze(-1), target)


def hf_reference(draft: Eagle3Draft, features, embeds, position_ids):
    """The EAGLE3 layer written with transformers' Llama pieces (RMSNorm, rotary, repeat_kv, MLP)."""
    cfg = LlamaConfig(**{k: v for k, v in draft.config.items() if k != ed.AUX_KEY})
    layer, d = draft.midlayer, draft.dims

    def norm(module):
        hf = hf_llama.LlamaRMSNorm(d.hidden_size, eps=d.rms_norm_eps)
        hf.weight.data.copy_(module.weight)
        return hf

    hidden = features @ draft.fc.weight.T
    x = torch.cat([norm(layer.input_layernorm)(embeds), norm(layer.hidden_norm)(hidden)], dim=-1)
    b, s, _ = x.shape
    q = (x @ layer.self_attn.q_proj.weight.T).view(b, s, d.num_heads, d.head_dim).transpose(1, 2)
    k = (x @ layer.self_attn.k_proj.weight.T).view(b, s, d.kv_heads, d.head_dim).transpose(1, 2)
    v = (x @ layer.self_attn.v_proj.weight.T).view(b, s, d.kv_heads, d.head_dim).transpose(1, 2)
    cos, sin = hf_llama.LlamaRotaryEmbedding(cfg)(x, position_ids)
    q, k = hf_llama.apply_rotary_pos_emb(q, k, cos, sin)
    groups = d.num_heads // d.kv_heads
    k, v = hf_llama.repeat_kv(k, groups), hf_llama.repeat_kv(v, groups)
    scores = (q @ k.transpose(-1, -2)) / d.head_dim ** 0.5
    scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
    attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, -1)
    h = hidden + attn @ layer.self_attn.o_proj.weight.T
    mlp = hf_llama.LlamaMLP(cfg)
    for name in ("gate_proj", "up_proj", "down_proj"):
        getattr(mlp, name).weight.data.copy_(getattr(layer.mlp, name).weight)
    h = h + mlp(norm(layer.post_attention_layernorm)(h))
    return norm(draft.norm)(h) @ draft.lm_head.weight.T, h


def test_forward_train_matches_transformers_pieces(base):
    draft = random_draft(base[1])
    torch.manual_seed(1)
    features = torch.randn(2, 9, 3 * 64)
    embeds = draft.embed_tokens(torch.randint(0, 512, (2, 9)))
    positions = torch.arange(9)[None].expand(2, 9) + torch.tensor([[0], [300]])  # llama3 rope scaling range too
    with torch.no_grad():
        logits, hidden = draft.forward_train(features, embeds, positions)
        ref_logits, ref_hidden = hf_reference(draft, features, embeds, positions)
    torch.testing.assert_close(hidden, ref_hidden, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    # features (3H) go through fc; an H-wide hidden does not
    with torch.no_grad():
        again, _ = draft.forward_train(draft.project_features(features), embeds, positions)
    torch.testing.assert_close(again, logits)


# ---------------------------------------------------------------------------------------------------
# The graph (the eager stand-in op until ours takes a tree mask)


def run_graph(graph, embeds, hidden, positions, past_lengths, query_lengths, tree_mask, cache, logits_indices=None):
    b, s, _ = embeds.shape
    if logits_indices is None:
        logits_indices = torch.arange(s, dtype=torch.int32)[None].expand(b, s)
    with torch.no_grad():
        logits, hidden_out, key, value = graph(
            embeds, hidden, positions.int(), torch.as_tensor(past_lengths, dtype=torch.int32),
            torch.as_tensor(query_lengths, dtype=torch.int32), tree_mask, logits_indices.int(), *cache)
    return logits, hidden_out, (key, value)


def empty_cache(draft, batch, capacity=48):
    d = draft.dims
    return (torch.zeros(batch, d.kv_heads, capacity, d.head_dim), torch.zeros(batch, d.kv_heads, capacity, d.head_dim))


def causal(batch, seq):
    return torch.ones(seq, seq, dtype=torch.bool).tril()[None].repeat(batch, 1, 1)


@pytest.fixture(scope="module")
def setup(base):
    draft = random_draft(base[1])
    torch.manual_seed(2)
    s = 10
    hidden = draft.project_features(torch.randn(2, s, 3 * 64)).detach()
    embeds = draft.embed_tokens(torch.randint(0, 512, (2, s))).detach()
    positions = torch.arange(s)[None].expand(2, s)
    with torch.no_grad():
        logits, hidden_out = draft.forward_train(hidden, embeds, positions)
    return draft, DraftGraph(draft, max_positions=128), hidden, embeds, positions, logits, hidden_out


def test_graph_prefill_matches_forward_train(setup):
    draft, graph, hidden, embeds, positions, logits, hidden_out = setup
    lengths = [10, 6]  # ragged: row 1 is right-padded
    got_logits, got_hidden, _ = run_graph(graph, embeds, hidden, positions, [0, 0], lengths, causal(2, 10),
                                          empty_cache(draft, 2))
    assert got_logits.dtype == torch.float32 and got_logits.shape == (2, 10, DRAFT_VOCAB)
    torch.testing.assert_close(got_logits[0], logits[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_hidden[0], hidden_out[0], rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        short_logits, short_hidden = draft.forward_train(hidden[1:, :6], embeds[1:, :6], positions[1:, :6])
    torch.testing.assert_close(got_logits[1, :6], short_logits[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_hidden[1, :6], short_hidden[0], rtol=1e-4, atol=1e-4)
    # tree_mask None means causal; logits_indices picks rows
    picked, _, _ = run_graph(graph, embeds, hidden, positions, [0, 0], lengths, None, empty_cache(draft, 2),
                             torch.tensor([[9, 0], [5, 2]]))
    torch.testing.assert_close(picked[0], logits[0, [9, 0]], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(picked[1], short_logits[0, [5, 2]], rtol=1e-4, atol=1e-4)


def test_graph_token_by_token_matches_forward_train(setup):
    draft, graph, hidden, embeds, positions, logits, hidden_out = setup
    cache = empty_cache(draft, 2)
    first = 3  # a short prefill, then one token at a time
    _, _, cache = run_graph(graph, embeds[:, :first], hidden[:, :first], positions[:, :first], [0, 0], [first, first],
                            causal(2, first), cache)
    for t in range(first, 10):
        step_logits, step_hidden, cache = run_graph(
            graph, embeds[:, t:t + 1], hidden[:, t:t + 1], positions[:, t:t + 1], [t, t], [1, 1],
            torch.ones(2, 1, 1, dtype=torch.bool), cache)
        torch.testing.assert_close(step_logits[:, 0], logits[:, t], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(step_hidden[:, 0], hidden_out[:, t], rtol=1e-4, atol=1e-4)


def test_graph_tree_matches_each_path(setup):
    """A token tree over a cached prefix: every node sees the prefix and its ancestors only."""
    draft, graph, hidden, embeds, positions, _, _ = setup
    prefix = 4
    parents = [-1, 0, 0, 1, 2, 1]  # node 0 is the root (depth 0)
    nodes = len(parents)
    depth = [0] * nodes
    mask = torch.zeros(1, nodes, nodes, dtype=torch.bool)
    for i, p in enumerate(parents):
        mask[0, i, i] = True
        if p >= 0:
            depth[i] = depth[p] + 1
            mask[0, i] |= mask[0, p]
    torch.manual_seed(3)
    tree_embeds = draft.embed_tokens(torch.randint(0, 512, (1, nodes))).detach()
    tree_hidden = torch.randn(1, nodes, 64)
    tree_positions = torch.tensor([[prefix + x for x in depth]])
    _, _, cache = run_graph(graph, embeds[:1, :prefix], hidden[:1, :prefix], positions[:1, :prefix], [0], [prefix],
                            causal(1, prefix), empty_cache(draft, 1))
    got_logits, got_hidden, _ = run_graph(graph, tree_embeds, tree_hidden, tree_positions, [prefix], [nodes], mask,
                                          cache)
    for i in range(nodes):
        path = [j for j in range(nodes) if mask[0, i, j]]  # ancestors in depth order (parents come first)
        seq_embeds = torch.cat([embeds[:1, :prefix], tree_embeds[:, path]], 1)
        seq_hidden = torch.cat([hidden[:1, :prefix], tree_hidden[:, path]], 1)
        with torch.no_grad():
            ref_logits, ref_hidden = draft.forward_train(seq_hidden, seq_embeds, torch.arange(prefix + len(path))[None])
        torch.testing.assert_close(got_logits[0, i], ref_logits[0, -1], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got_hidden[0, i], ref_hidden[0, -1], rtol=1e-4, atol=1e-4)
    # forward_train with the equivalent explicit mask gives the same as the graph
    full = torch.zeros(1, prefix + nodes, prefix + nodes, dtype=torch.bool)
    full[0, :prefix, :prefix] = torch.ones(prefix, prefix, dtype=torch.bool).tril()
    full[0, prefix:, :prefix] = True
    full[0, prefix:, prefix:] = mask[0]
    with torch.no_grad():
        explicit, _ = draft.forward_train(torch.cat([hidden[:1, :prefix], tree_hidden], 1),
                                          torch.cat([embeds[:1, :prefix], tree_embeds], 1),
                                          torch.cat([positions[:1, :prefix], tree_positions], 1), full)
    torch.testing.assert_close(got_logits[0], explicit[0, prefix:], rtol=1e-4, atol=1e-4)


def test_training_time_test_is_what_the_runtime_computes(setup):
    """Step k of forward_ttt at row t == the graph's k-th draft token after a cache of rows 0..t."""
    draft, graph, hidden, _, positions, _, _ = setup
    torch.manual_seed(4)
    steps = 3
    tokens = [draft.embed_tokens(torch.randint(0, 512, (2, 10))).detach() for _ in range(steps)]
    with torch.no_grad():
        results = draft.forward_ttt(hidden, tokens, positions)
        step0, _ = draft.forward_train(hidden, tokens[0], positions)
    torch.testing.assert_close(results[0][0], step0)
    for t in (0, 4, 9):
        _, out, cache = run_graph(graph, tokens[0][:, :t + 1], hidden[:, :t + 1], positions[:, :t + 1], [0, 0],
                                  [t + 1, t + 1], causal(2, t + 1), empty_cache(draft, 2))
        h = out[:, t:t + 1]
        for k in range(1, steps):
            logits, h, cache = run_graph(graph, tokens[k][:, t:t + 1], h, torch.full((2, 1), t + k), [t + k, t + k],
                                         [1, 1], torch.ones(2, 1, 1, dtype=torch.bool), cache)
            torch.testing.assert_close(logits[:, 0], results[k][0][:, t], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(h[:, 0], results[k][1][:, t], rtol=1e-4, atol=1e-4)


def test_draft_graph_on_onnxruntime_matches_eager(setup, tmp_path):
    """The exported graph, lowered for the cpu backend: a ragged prefill, then a tree over the cache."""
    import onnxruntime as ort

    from trt_llm.build.cpu_backend import compile_cpu
    from trt_llm.build.export import export_draft
    from trt_llm.schemas.graph_spec import draft_spec

    draft, graph, hidden, embeds, positions, _, _ = setup
    d = draft.dims
    engine = compile_cpu(export_draft(graph, d.hidden_size, d.kv_heads, d.head_dim, tmp_path / "model.onnx",
                                      torch.float32))
    session = ort.InferenceSession(str(engine), providers=["CPUExecutionProvider"])

    def both(embeds, hidden, positions, past, lengths, mask, cache, picks):
        eager = run_graph(graph, embeds, hidden, positions, past, lengths, mask, cache, picks)
        feeds = [embeds, hidden, positions.int(), torch.tensor(past, dtype=torch.int32),
                 torch.tensor(lengths, dtype=torch.int32), mask, picks.int(), *cache]
        logits, hidden_out, key, value = session.run(None, {n: t.numpy() for n, t in zip(draft_spec(graph.layer_spec).input_names, feeds)})
        for row, n in enumerate(lengths):
            torch.testing.assert_close(torch.from_numpy(hidden_out[row, :n]), eager[1][row, :n], rtol=1e-4, atol=1e-4)
            end = past[row] + n
            torch.testing.assert_close(torch.from_numpy(key[row, :, :end]), eager[2][0][row, :, :end], rtol=1e-4,
                                       atol=1e-4)
            torch.testing.assert_close(torch.from_numpy(value[row, :, :end]), eager[2][1][row, :, :end], rtol=1e-4,
                                       atol=1e-4)
        torch.testing.assert_close(torch.from_numpy(logits), eager[0], rtol=1e-4, atol=1e-4)
        return eager[2]

    cache = both(embeds, hidden, positions, [0, 0], [10, 6], causal(2, 10), empty_cache(draft, 2),
                 torch.tensor([[9, 3], [5, 0]]))
    mask = causal(2, 4)
    mask[0, 2, 1] = mask[0, 3, 1] = False  # row 0: nodes 1 and 2 are siblings under node 0
    mask[0, 3, 2] = True
    tree_positions = torch.tensor([[10, 11, 11, 12], [6, 7, 8, 9]])
    both(embeds[:, :4].flip(1), hidden[:, :4].flip(1).contiguous(), tree_positions, [10, 6], [4, 3], mask, cache,
         torch.tensor([[3, 1], [2, 2]]))


# ---------------------------------------------------------------------------------------------------
# Files


def test_eagle_format_round_trip(base, tmp_path):
    draft = random_draft(base[1])
    draft.aux_layer_ids = [1, 3, 4]  # not the default: travels in the config
    out = save_draft_eagle_format(draft, tmp_path / "eagle")
    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == DRAFT_VOCAB and config["num_hidden_layers"] == 1
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "embed_tokens.weight" not in load_file(str(out / "model.safetensors"))
    loaded = load_draft(out, base[1].config, embedding(base[1]))
    assert loaded.source_format == "eagle" and loaded.aux_layer_ids == [1, 3, 4]
    assert_same_draft(loaded, draft)
    # ... and again from pytorch_model.bin (the EAGLE authors' own checkpoints)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text((out / "config.json").read_text())
    torch.save(load_file(str(out / "model.safetensors")), tmp_path / "bin" / "pytorch_model.bin")
    assert_same_draft(load_draft(tmp_path / "bin", base[1].config, embedding(base[1])), draft)


def _write(folder, config, tensors):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def test_specforge_modelopt_and_speculators_files_load_the_same(base, tmp_path):
    draft = random_draft(base[1])
    state = {k: v.clone() for k, v in draft.state_dict().items()}
    config = {k: v for k, v in draft.config.items() if k != ed.AUX_KEY}

    # SpecForge: its own architecture name and the embedding inside
    specforge = _write(tmp_path / "specforge", {**config, "architectures": ["LlamaForCausalLMEagle3"]}, state)
    # ModelOpt: eagle_module./layers.0. names, no t2d, output-of-layer aux ids in eagle_config
    modelopt_state = {}
    for name, tensor in state.items():
        if name in ("t2d", "embed_tokens.weight"):
            continue
        if name.startswith("midlayer."):
            name = "layers.0." + name[len("midlayer."):]
        modelopt_state[name if name in ("lm_head.weight", "d2t") else "eagle_module." + name] = tensor
    modelopt = _write(tmp_path / "modelopt", {**config, "architectures": ["LlamaForCausalLMEagle3"], "eagle_config": {
        "eagle_aux_hidden_state_layer_ids": [1, 2, 2], "use_aux_hidden_state": True}}, modelopt_state)
    # vLLM speculators: nested config, input-of-layer aux ids, layers.0. names
    speculators_state = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v
                         for k, v in state.items()}
    speculators = _write(tmp_path / "speculators", {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
        "transformer_layer_config": {**config, "draft_vocab_size": None}, "draft_vocab_size": DRAFT_VOCAB,
        "norm_before_residual": False, "eagle_aux_hidden_state_layer_ids": [2, 3, 3],
        "speculators_config": {"algorithm": "eagle3"}}, speculators_state)

    for folder, fmt in ((specforge, "specforge"), (modelopt, "modelopt"), (speculators, "speculators")):
        loaded = load_draft(folder, base[1].config, embedding(base[1]))
        assert loaded.source_format == fmt
        assert_same_draft(loaded, draft)


def test_missing_lm_head_and_d2t_come_from_the_base(base, tmp_path):
    draft = random_draft(base[1], draft_vocab=512)  # full vocabulary
    state = {k: v for k, v in draft.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d",
                                                                         "embed_tokens.weight")}
    config = {k: v for k, v in draft.config.items() if k != ed.AUX_KEY}
    folder = _write(tmp_path / "full", config, state)
    with pytest.raises(ValueError, match="base_lm_head"):  # the tiny llama's head is untied
        load_draft(folder, base[1].config, embedding(base[1]))
    head = base[1].get_output_embeddings().weight.detach()
    loaded = load_draft(folder, base[1].config, embedding(base[1]), base_lm_head=head)
    assert torch.equal(loaded.lm_head.weight, head)
    assert torch.equal(loaded.d2t, torch.zeros(512, dtype=torch.long)) and bool(loaded.t2d.all())
    # a reduced vocabulary without its own head cannot borrow the base's
    small = random_draft(base[1])
    state = {k: v for k, v in small.state_dict().items() if k != "lm_head.weight"}
    folder = _write(tmp_path / "small", {k: v for k, v in small.config.items() if k != ed.AUX_KEY}, state)
    with pytest.raises(ValueError, match="lm_head"):
        load_draft(folder, base[1].config, embedding(base[1]), base_lm_head=head)


def test_shape_errors_name_the_file_and_tensor(base, tmp_path):
    draft = random_draft(base[1])
    config = {k: v for k, v in draft.config.items() if k != ed.AUX_KEY}
    state = dict(draft.state_dict())
    bad = _write(tmp_path / "bad_q", config, {**state, "midlayer.self_attn.q_proj.weight": torch.zeros(64, 64)})
    with pytest.raises(ValueError, match=r"bad_q/model\.safetensors: tensor 'midlayer\.self_attn\.q_proj\.weight'"):
        load_draft(bad, base[1].config, embedding(base[1]))
    bad = _write(tmp_path / "bad_fc", config, {**state, "fc.weight": torch.zeros(64, 2 * 64)})
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor 'fc\.weight' has shape \[64, 128\]"):
        load_draft(bad, base[1].config, embedding(base[1]))
    bad = _write(tmp_path / "bad_hidden", {**config, "hidden_size": 32}, state)
    with pytest.raises(ValueError, match="hidden size is 64"):
        load_draft(bad, base[1].config, embedding(base[1]))
    bad = _write(tmp_path / "bad_extra", config, {**state, "midlayer.self_attn.qkv_proj.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="unexpected tensor 'midlayer.self_attn.qkv_proj.weight'"):
        load_draft(bad, base[1].config, embedding(base[1]))
    bad = _write(tmp_path / "bad_aux", {**config, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 9]}},
                 state)
    with pytest.raises(ValueError, match="aux layer ids"):
        load_draft(bad, base[1].config, embedding(base[1]))


# ---------------------------------------------------------------------------------------------------
# The trainer


def test_train_draft_end_to_end(base, tmp_path, capsys):
    from trt_llm.draft_training import train_draft

    out = tmp_path / "trained"
    assert train_draft.main(["--base", str(base[0]), "--out", str(out), "--prompts", "12", "--gen-tokens", "10",
                             "--epochs", "2", "--draft-vocab", "64", "--threads", "1", "--batch-size", "4",
                             "--precision", "bf16"]) == 0
    err = capsys.readouterr().err
    assert "epoch   2" in err and "step0 top1" in err and "step1 top1" in err
    report = json.loads((out / "train_report.json").read_text())
    assert len(report["history"]) == 2 and report["aux_layer_ids"] == [2, 3, 3]
    assert report["history"][-1]["precision"] == "bf16" and "bf16 training passes" in err
    draft = load_draft(out, base[1].config, embedding(base[1]))
    assert draft.dims.draft_vocab_size == 64 and draft.aux_layer_ids == [2, 3, 3]
    assert int(draft.t2d.sum()) == 64
    # the draft vocabulary holds the LM head rows it was initialised from, in target-id order
    target = draft.draft_to_target(torch.arange(64))
    assert bool((target[1:] > target[:-1]).all())


def test_train_draft_extends_its_data_cache_and_goes_on_from_a_draft(base, tmp_path, capsys):
    """More prompts with the same --data-cache generate only the new ones; --init-from continues a draft
    with its own vocabulary."""
    from trt_llm.draft_training import train_draft

    common = ["--base", str(base[0]), "--gen-tokens", "6", "--epochs", "1", "--threads", "1",
              "--data-cache", str(tmp_path / "data.pt")]
    assert train_draft.main(common + ["--out", str(tmp_path / "first"), "--prompts", "6", "--draft-vocab", "64"]) == 0
    first = torch.load(tmp_path / "data.pt", weights_only=True)["sequences"]
    capsys.readouterr()
    assert train_draft.main(common + ["--out", str(tmp_path / "second"), "--prompts", "9",
                                      "--init-from", str(tmp_path / "first")]) == 0
    err = capsys.readouterr().err
    assert "read 6 sequences" in err and "for 3 prompts" in err
    extended = torch.load(tmp_path / "data.pt", weights_only=True)["sequences"]
    assert len(extended) == 9
    assert all(torch.equal(a["ids"], b["ids"]) and torch.equal(a["features"], b["features"])
               for a, b in zip(first, extended))
    before, after = (load_draft(tmp_path / name, base[1].config, embedding(base[1])) for name in ("first", "second"))
    assert torch.equal(before.d2t, after.d2t)  # its vocabulary, not --draft-vocab's default
    assert not torch.equal(before.fc.weight, after.fc.weight)  # and it was trained further


def test_prompt_set_appends_its_second_crossing():
    """The first 1,810 prompts are the hand-written ones and the first crossing (data cached for them stays
    valid); the second crossing follows without repeating any of them."""
    import itertools

    from trt_llm.draft_training.prompts import HANDWRITTEN, MAX_PROMPTS, TEMPLATES, TOPICS, prompt_set

    first = set(HANDWRITTEN) | {t.format(t=topic) for t, topic in itertools.product(TEMPLATES, TOPICS)}
    everything = prompt_set(MAX_PROMPTS)
    assert set(everything[:1810]) == first and len(everything[1810:]) == len(set(everything[1810:]))
    assert not first & set(everything[1810:])
    assert prompt_set(2000) == everything[:2000]
    with pytest.raises(ValueError, match="--prompts must be"):
        prompt_set(MAX_PROMPTS + 1)


def test_trainer_generates_the_base_models_greedy_tokens(base, tmp_path):
    """The trainer's data comes from our own engine: each sequence is what transformers' greedy
    generate gives for that prompt alone (cut after an end-of-sequence token), over a ragged batch."""
    from transformers import AutoTokenizer

    from trt_llm.draft_training import train_draft

    path, model = base
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompt_ids = train_draft.chat_prompt_ids(tokenizer, ["Hi", "Tell me a long story about the sea", "Why?"])
    sequences = train_draft.generate(str(path), prompt_ids, 12, 2, 1, tmp_path)
    eos = train_draft._eos_ids(model, tokenizer)
    for ids, s in zip(prompt_ids, sequences):
        with torch.no_grad():
            expected = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                                      eos_token_id=sorted(eos), pad_token_id=min(eos))[0].tolist()
        new = expected[len(ids):]
        ended = next((j for j, token in enumerate(new) if token in eos), None)
        if ended is not None:
            new = new[:ended + 1]
        assert s["prompt_len"] == len(ids) and s["ids"].tolist() == ids + new
        assert s["eos_end"] == (ended is not None)


def test_bf16_training_passes_match_fp32(base, monkeypatch):
    """--precision bf16: the draft's matmuls run in bf16 under autocast, the TTT loss stays within 2% of
    the fp32 one on the same batch, and the gradients land on the fp32 weights."""
    from trt_llm.draft_training import train_draft
    from trt_llm.draft_training.train_draft import Batch, autocast, batch_loss, run_batch, training_precision

    draft = random_draft(base[1]).train()
    vocab, n = base[1].config.vocab_size, 12
    in_vocab = draft.draft_to_target(torch.arange(DRAFT_VOCAB))
    target_to_draft = torch.full((vocab,), -100, dtype=torch.long)
    target_to_draft[in_vocab] = torch.arange(DRAFT_VOCAB)
    torch.manual_seed(1)
    seqs = [{"ids": in_vocab[torch.randint(0, DRAFT_VOCAB, (n,))], "prompt_len": 3, "eos_end": False,
             "features": torch.randn(n, 3 * draft.dims.hidden_size), "choice": in_vocab[torch.randint(0, DRAFT_VOCAB, (n,))],
             "top_ids": in_vocab[torch.randint(0, DRAFT_VOCAB, (n, 4))], "top_probs": torch.softmax(torch.randn(n, 4), -1),
             "final": torch.randn(n, draft.dims.hidden_size)} for _ in range(2)]
    batch = Batch(seqs, 3, target_to_draft, pad_id=0, soft=True)
    losses = {}
    for precision in ("fp32", "bf16"):
        with autocast(precision):
            outputs = run_batch(draft, batch, 3)
            losses[precision] = batch_loss(outputs, batch, draft, 1.0)
        assert outputs[0][0].dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)
    assert abs(losses["bf16"].item() / losses["fp32"].item() - 1) < 0.02
    losses["bf16"].backward()
    assert draft.fc.weight.grad is not None and draft.fc.weight.grad.dtype == torch.float32
    for native, chosen in ((True, "bf16"), (False, "fp32")):  # auto: bf16 only where the CPU has it natively
        monkeypatch.setattr(train_draft, "native_bf16", lambda: native)
        assert training_precision("auto") == chosen and training_precision("fp32") == "fp32"


def test_collected_features_are_each_sequences_own_hidden_states(base):
    """collect_features on a ragged batch gives, per sequence, what transformers gives for it alone: the
    aux hidden states (fp16, within fp16 rounding), the argmax choice and the last normed hidden state."""
    from trt_llm.draft_training.train_draft import collect_features, half_if_in_range

    torch.manual_seed(3)
    vocab = base[1].config.vocab_size
    seqs = [{"ids": torch.randint(3, vocab, (n,))} for n in (7, 12, 4)]
    aux = ed.default_aux_layer_ids(LAYERS)
    collect_features(base[1], seqs, aux, batch_size=3, top_k=4)
    for s in seqs:
        with torch.no_grad():
            alone = base[1](input_ids=s["ids"][None], output_hidden_states=True)
        expected = torch.cat([alone.hidden_states[i][0] for i in aux], -1)
        assert s["features"].dtype == torch.float16 and s["final"].dtype == torch.float16
        torch.testing.assert_close(s["features"].float(), expected, rtol=2e-3, atol=1e-4)
        torch.testing.assert_close(s["final"].float(), alone.hidden_states[-1][0], rtol=2e-3, atol=1e-4)
        assert torch.equal(s["choice"], alone.logits[0].argmax(-1))
    big = torch.tensor([[1.0, 7.0e4]])  # beyond fp16: kept in fp32
    assert half_if_in_range(big).dtype == torch.float32 and torch.equal(half_if_in_range(big), big)


def test_training_rows_line_up():
    """Row t, step k: fed token x[t+1+k], label the base's choice after it, 'generated' when that
    label follows a generated token; nothing after an end-of-sequence token is a label."""
    from trt_llm.draft_training.train_draft import Batch

    n, prompt_len, steps = 9, 4, 3
    ids = torch.arange(100, 100 + n)
    choice = torch.arange(200, 200 + n)
    seq = {"ids": ids, "prompt_len": prompt_len, "eos_end": True, "features": torch.randn(n, 6), "choice": choice,
           "top_ids": torch.stack([choice, choice + 1], -1), "top_probs": torch.tensor([[0.75, 0.25]] * n),
           "final": torch.randn(n, 2)}
    target_to_draft = torch.full((300,), -100, dtype=torch.long)
    target_to_draft[200:207] = torch.arange(7)  # choices 207, 208 are outside the draft vocabulary
    batch = Batch([seq], steps, target_to_draft, pad_id=0, soft=True)
    last = n - 2  # the sequence ended with eos: its own successor is no label
    for k in range(steps):
        for t in range(n - 1):
            j = t + 1 + k
            if j > last:
                assert batch.labels[k, 0, t] == -100 and batch.target[k, 0, t] == -1
                continue
            assert batch.tokens[k, 0, t] == ids[j] and batch.target[k, 0, t] == choice[j]
            assert batch.labels[k, 0, t] == (j if j <= 6 else -100)
            assert bool(batch.generated[k, 0, t]) == (j >= prompt_len - 1)
            assert torch.equal(batch.final[k, 0, t], seq["final"][j])
            expected = [0.75, 0.25] if j <= 5 else [1.0, 0.0] if j == 6 else [0.0, 0.0]  # renormalised in-vocab
            torch.testing.assert_close(batch.soft_probs[k, 0, t], torch.tensor(expected))
    assert torch.equal(batch.features[0], seq["features"][:n - 1])
