"""Qwen3.5's multi-token-prediction head built as the engine's draft (`mtp: true`, build/mtp/): the
exported step against a reference made of transformers' own modules (its decoder layer as a full
attention layer, its RMSNorms, the base's rotary tables and LM head), on a first chunk and on a
second chunk over the first one's cache, and chained after the base engine's final_hidden_states as
the runtime will run it; the manifest's entries; each refusal one line naming mtp."""

import copy
import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file as load_numpy
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

import family_assets
from trt_llm.build.cli import build_engine
from trt_llm.build.compile import BuildError
from trt_llm.schemas.build_config import BuildConfig, DraftBuildConfig

TOKENS = 12  # per row: 11 MTP inputs (token t + 1 with the base's hidden state at t)
CHUNKS = ((6, 5), (4, 3))  # each row's first and second chunk (row 1 shorter: right-padded)
CAPACITY = 32


@pytest.fixture(scope="module")
def mtp_model(family_model):
    return family_assets.add_mtp_head(family_model("qwen3_5"), seed=0)


@pytest.fixture(scope="module")
def engine(mtp_model, build_engine_for):
    return build_engine_for(mtp_model, mtp=True)


class Reference:
    """The base and its MTP head written with transformers' own modules (vLLM's Qwen3_5MTP): the head is
    Qwen3_5DecoderLayer (full attention) holding the mtp.layers.0 weights, three Qwen3_5RMSNorms and fc,
    the base's rotary embedding and LM head, run over a whole sequence of head inputs at once."""

    def __init__(self, model_dir):
        self.base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        config = copy.deepcopy(self.base.config)
        config.layer_types, config.num_hidden_layers, config._attn_implementation = ["full_attention"], 1, "eager"
        tensors = {k: v for k, v in load_file(str(model_dir / "model.safetensors")).items() if k.startswith("mtp.")}
        self.layer = Qwen3_5DecoderLayer(config, 0).eval()
        self.layer.load_state_dict({k[len("mtp.layers.0."):]: v for k, v in tensors.items()
                                    if k.startswith("mtp.layers.0.")})
        self.norms = {}
        for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            self.norms[name] = Qwen3_5RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.norms[name].weight.data.copy_(tensors[f"mtp.{name}.weight"])
        self.fc = torch.nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.fc.weight.data.copy_(tensors["mtp.fc.weight"])

    @torch.no_grad()
    def final_hidden(self, ids):
        """The base's hidden states after its final norm (what the head takes) [B, S, H]."""
        return self.base.model(input_ids=ids).last_hidden_state

    @torch.no_grad()
    def embed(self, ids):
        return self.base.model.embed_tokens(ids)

    @torch.no_grad()
    def head(self, embeds, hidden):
        """(logits, out after mtp.norm) of head inputs i = (embedding of token i + 1, hidden at i), causal."""
        x = self.fc(torch.cat([self.norms["pre_fc_norm_embedding"](embeds), self.norms["pre_fc_norm_hidden"](hidden)],
                              dim=-1))
        batch, seq, _ = x.shape
        positions = torch.arange(seq)[None].expand(batch, seq)
        mask = torch.full((seq, seq), float("-inf")).triu(1)[None, None]
        x = self.layer(x, position_embeddings=self.base.model.rotary_emb(x, positions), attention_mask=mask,
                       position_ids=positions)
        out = self.norms["norm"](x)
        return self.base.lm_head(out), out


@pytest.fixture(scope="module")
def reference(mtp_model):
    return Reference(mtp_model)


def test_head_matches_transformers_over_two_chunks(reference, engine):
    from trt_llm.runtime.backends.ort_engine import OrtEngine
    from trt_llm.runtime.engine_dir import EngineDir

    torch.manual_seed(3)
    ids = torch.randint(0, 5000, (2, TOKENS))
    embeds, hidden = reference.embed(ids[:, 1:]), reference.final_hidden(ids)[:, :-1]
    ref_logits, ref_hidden = reference.head(embeds, hidden)
    engine_dir = EngineDir.open(engine)
    # the project's cpu session over the compiled draft (its custom ops lowered, the offline graph)
    session = OrtEngine(engine_dir.component_path("draft", "engine"), engine_dir.layers("draft")).session
    spec = engine_dir.layers("draft")[0]
    past_key = np.zeros((2, spec.kv_heads, CAPACITY, spec.head_dim), np.float32)
    past_value = past_key.copy()
    starts = [0, 0]
    worst = {"logits": 0.0, "hidden_out": 0.0}
    for chunk in range(2):
        lengths = [CHUNKS[row][chunk] for row in range(2)]
        seq = max(lengths)
        feeds = {name: np.zeros(shape, dtype) for name, shape, dtype in (
            ("inputs_embeds", (2, seq, embeds.shape[-1]), np.float32), ("hidden", (2, seq, hidden.shape[-1]), np.float32),
            ("position_ids", (2, seq), np.int32))}
        for row in range(2):
            span = slice(starts[row], starts[row] + lengths[row])
            feeds["inputs_embeds"][row, :lengths[row]] = embeds[row, span].numpy()
            feeds["hidden"][row, :lengths[row]] = hidden[row, span].numpy()
            feeds["position_ids"][row, :lengths[row]] = np.arange(span.start, span.stop)
        feeds.update(past_lengths=np.array(starts, np.int32), query_lengths=np.array(lengths, np.int32),
                     tree_mask=np.tril(np.ones((seq, seq), bool))[None].repeat(2, 0),
                     logits_indices=np.arange(seq, dtype=np.int32)[None].repeat(2, 0),
                     past_key_0=past_key, past_value_0=past_value)
        logits, hidden_out, past_key, past_value = session.run(
            ["logits", "hidden_out", "present_key_0", "present_value_0"], feeds)
        assert logits.dtype == np.float32 and logits.shape == (2, seq, ref_logits.shape[-1])
        for row in range(2):
            span = slice(starts[row], starts[row] + lengths[row])
            for name, got, want in (("logits", logits, ref_logits), ("hidden_out", hidden_out, ref_hidden)):
                diff = float(np.abs(got[row, :lengths[row]] - want[row, span].numpy()).max())
                worst[name] = max(worst[name], diff)
            starts[row] += lengths[row]
    print(f"max |engine - transformers|: logits {worst['logits']:.2e}, hidden_out {worst['hidden_out']:.2e} "
          f"(logits up to {float(ref_logits.abs().max()):.1f})")
    assert worst["logits"] < 1e-4 and worst["hidden_out"] < 1e-4, worst


def test_engines_chain_as_the_runtime_will(reference, engine):
    """The path speculation takes, through the project's engines: the base's prefill gives
    final_hidden_states (as transformers' last_hidden_state), the head's first step pairs the tokens 1..n
    (the last one the base's next token) with them, its second step takes the first's draft token and
    its own hidden_out; each step's logits as transformers' head over the same inputs."""
    from trt_llm.runtime.backends.embedding import engine_embedding
    from trt_llm.runtime.backends.engines import open_engine
    from trt_llm.runtime.engine.step import Step
    from trt_llm.runtime.engine_dir import EngineDir

    torch.manual_seed(4)
    ids = torch.randint(0, 5000, (1, 10))
    n, engine_dir = ids.shape[1], EngineDir.open(engine)
    table, hidden_size = engine_embedding(engine_dir), engine_dir.dims["hidden_size"]
    base, head = open_engine(engine_dir, component="llm"), open_engine(engine_dir, component="draft")
    vocab = engine_dir.dims["vocab_size"]

    final = np.zeros((1, n, hidden_size), np.float32)
    step = Step(table[ids.numpy()], np.arange(n, dtype=np.int32)[None], np.zeros(1, np.int32),
                np.array([n], np.int32), np.array([[n - 1]], np.int32), np.zeros((1, 1, vocab), np.float32),
                outputs={"final_hidden_states": final})
    base_logits = base.run(step, base.new_cache(1, CAPACITY))
    want_final = reference.final_hidden(ids)
    base_diff = float(np.abs(final - want_final.numpy()).max())
    assert base_diff < 1e-4, base_diff
    following = torch.tensor([[int(base_logits[0, 0].argmax())]])  # the token the base emits after the prompt

    def head_step(tokens, hidden, past, cache):
        seq = tokens.shape[1]
        logits, hidden_out = np.zeros((1, 1, vocab), np.float32), np.zeros((1, seq, hidden_size), np.float32)
        step = Step(table[tokens.numpy()], np.arange(past, past + seq, dtype=np.int32)[None],
                    np.array([past], np.int32), np.array([seq], np.int32), np.array([[seq - 1]], np.int32), logits,
                    inputs={"hidden": hidden, "tree_mask": np.tril(np.ones((1, seq, seq), bool))},
                    outputs={"hidden_out": hidden_out})
        head.run(step, cache)
        return logits[0, 0], hidden_out

    cache = head.new_cache(1, CAPACITY)
    tokens = torch.cat([ids[:, 1:], following], dim=1)  # token i + 1 beside the base's hidden state at i
    first, hidden_out = head_step(tokens, final, 0, cache)
    drafted = torch.tensor([[int(first.argmax())]])
    second, _ = head_step(drafted, hidden_out[:, -1:], n, cache)  # chained: its own hidden_out

    embeds = reference.embed(torch.cat([tokens, drafted], dim=1))
    ref_logits, ref_out = reference.head(embeds[:, :n], want_final)
    ref_second, _ = reference.head(embeds, torch.cat([want_final, ref_out[:, -1:]], dim=1))
    diffs = (float(np.abs(first - ref_logits[0, -1].numpy()).max()),
             float(np.abs(second - ref_second[0, -1].numpy()).max()))
    print(f"engines chained: max |final_hidden_states - transformers| {base_diff:.2e}; |logits - transformers| "
          f"first step {diffs[0]:.2e}, second {diffs[1]:.2e}")
    assert max(diffs) < 1e-4, diffs


def test_build_writes_the_draft_component(mtp_model, engine):
    manifest = json.loads((engine / "manifest.json").read_text())
    draft, model = manifest["components"]["draft"], manifest["model"]
    vocab = model["dims"]["vocab_size"]
    assert model["eagle"] is None  # the base graph keeps no EAGLE taps
    assert manifest["build_config"]["mtp"] is True
    assert {k: draft[k] for k in ("kind", "graph", "tensors", "max_draft_tree_size", "max_verify_tree_size",
                                  "draft_vocab_size", "source_format")} == {
        "kind": "mtp", "graph": "draft/model.onnx", "tensors": "draft/tensors.safetensors",
        "max_draft_tree_size": 8, "max_verify_tree_size": 8, "draft_vocab_size": vocab, "source_format": "mtp"}
    # the base's full-attention layer geometry: Qwen3.5's partial rotary (a quarter of head_dim 64)
    full = next(layer for layer in model["layers"] if layer["kind"] == "full")
    assert draft["layers"] == [full] and draft["layers"][0]["rotary"]["dims"] == 16
    assert (engine / draft["engine"]).is_file()
    tensors = load_numpy(str(engine / draft["tensors"]))
    assert set(tensors) == {"d2t"}  # no fc: the head's fc is in its graph
    assert tensors["d2t"].dtype == np.int64 and tensors["d2t"].shape == (vocab,) and not tensors["d2t"].any()


def _refusal(tmp_path, model, **settings) -> str:
    with pytest.raises(BuildError) as caught:
        build_engine(BuildConfig(model=str(model), output_dir=str(tmp_path / "out"), max_batch_size=1,
                                 max_input_len=16, max_kv_cache_capacity=32, mtp=True, **settings), progress=False)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("mtp: "), message
    return message


def test_refusals_name_mtp(tmp_path, mtp_model, family_model, tiny_model):
    assert "draft:" in _refusal(tmp_path, mtp_model, draft=DraftBuildConfig(model=str(tmp_path / "draft")))
    assert "LlamaForCausalLM" in _refusal(tmp_path, tiny_model("llama"))
    assert "mtp_num_hidden_layers is None, 0 mtp.* tensors" in _refusal(tmp_path, family_model("qwen3_5"))
    two = shutil.copytree(mtp_model, tmp_path / "two")
    settings = json.loads((two / "config.json").read_text())
    (two / "config.json").write_text(json.dumps({**settings, "mtp_num_hidden_layers": 2}))
    assert "2 MTP layers" in _refusal(tmp_path, two)
    vlm = family_assets.make_qwen3_5_vlm(family_model("qwen3_5"), tmp_path / "vlm")
    assert "multimodal" in _refusal(tmp_path, vlm)


# --- speculation with the head (runtime/decoding/eagle.py: a chain, verified by the hybrid base) ---

BIAS = {"100": 40.0, "200": 40.0, "300": 40.0}  # answers kept to three tokens: a random head guesses some
REQUESTS = ["one two three four one two three four one two", "Say something long.", "Count with me: 1 2 3"]


def speculate(engine, speculation, scheduling="static", **settings):
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.schemas.input_file import parse_input_dict

    data = {"batch_size": 3, "max_generate_length": 40, "logit_bias": BIAS, "temperature": 0.0, **settings,
            "requests": [{"messages": [{"role": "user", "content": text}]} for text in REQUESTS]}
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    runner = Runner(EngineDir.open(engine), threads=1, speculation=speculation, scheduling=scheduling)
    responses = runner.run(loaded, loaded.settings).responses
    assert all(r.finish_reason != "error" for r in responses), [r.error for r in responses]
    return [r.output_token_ids for r in responses], runner


@pytest.mark.parametrize("mode,scheduling", [("greedy", "static"), ("seeded", "continuous")])
def test_speculating_with_the_head_gives_vanillas_tokens(engine, mode, scheduling):
    """The head proposes, the base verifies each chain (taking part of it: its recurrent states come back
    and the taken tokens are passed again): vanilla's tokens; the engine's default is its head."""
    settings = {"temperature": 0.8, "top_p": 0.95, "seed": 3} if mode == "seeded" else {}
    vanilla, _ = speculate(engine, "none", scheduling, **settings)
    drafted, runner = speculate(engine, None, scheduling, **settings)
    assert runner.speculation == "mtp" and drafted == vanilla
    stats = runner.spec_stats
    assert stats.rounds > 0 and 0 < stats.accepted < stats.proposed, stats
    assert stats.emitted == sum(len(t) for t in drafted) - len(drafted)  # (the first tokens: the prefill's)


def test_the_profile_and_metrics_count_the_heads_acceptance(engine, tmp_path):
    from trt_llm.runtime.app.run_cli import main
    from trt_llm.runtime.decoding.choice import SpeculationError
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.server.metrics import _SpeculationCollector as SpeculationCollector

    data = {"temperature": 0.0, "max_generate_length": 30, "logit_bias": BIAS,
            "requests": [{"messages": [{"role": "user", "content": REQUESTS[0]}]}]}
    (tmp_path / "in.json").write_text(json.dumps(data))
    assert main([str(tmp_path / "in.json"), "--engine-dir", str(engine), "--output", str(tmp_path / "out.json"),
                 "--speculation", "mtp", "--profile-output", str(tmp_path / "profile.json")]) == 0
    speculative = json.loads((tmp_path / "profile.json").read_text())["speculative"]
    assert 0 < speculative["accepted_tokens"] < speculative["proposed_tokens"], speculative
    one = speculative["per_request"]["0"]  # (the file's one request: the run's counts)
    assert speculative["strategy"] == "mtp" and one["passes"] == speculative["iterations"]
    assert (one["proposed_tokens"], one["accepted_tokens"]) == (speculative["proposed_tokens"],
                                                                speculative["accepted_tokens"])
    assert one["mean_accepted_length"] == pytest.approx(speculative["mean_accepted_length"])
    _, runner = speculate(engine, "mtp")
    samples = {(s.name, s.labels.get("strategy")): s.value
               for family in SpeculationCollector(runner).collect() for s in family.samples}
    assert samples[("trt_llm_spec_decode_num_accepted_tokens_total", "mtp")] == runner.spec_stats.accepted > 0
    with pytest.raises(SpeculationError, match="speculation: 'eagle' needs an engine built with an EAGLE draft"):
        Runner(EngineDir.open(engine), threads=1, speculation="eagle")
