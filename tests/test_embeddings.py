"""Embeddings (issue 46 item 4): the engine's final_hidden_states pooled at the last token or averaged,
L2-normalised, against transformers' post-norm hidden states (model.model(...).last_hidden_state, the
final norm's output for Llama-shaped models) pooled the same way in float64; prompts of ragged lengths
in passes of the engine's max batch; a checkpoint's sentence-transformers pooling as the default; the
input file's embedding requests; /v1/embeddings with the official client."""

import base64
import json
import shutil

import httpx
import numpy as np
import pytest

from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.embeddings import Embedder, EmbeddingError
from trt_llm.runtime.requests.loaded_engine import LoadedEngine

COSINE = 0.9999
# Ragged, more prompts than the engine's max batch (4): two passes, rows padded to the longest of each
LENGTHS = (1, 7, 40, 3, 19, 64, 2)


def hf_vectors(model_dir, prompts: list[list[int]], pooling: str) -> np.ndarray:
    """transformers' last hidden state (after the final norm), each prompt alone, pooled and normalised."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0].double().numpy()
            vector = hidden[-1] if pooling == "last" else hidden.mean(axis=0)
            out.append(vector / np.linalg.norm(vector))
    return np.array(out)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def tiny(tiny_model, build_engine_for):
    model = tiny_model("llama")
    return model, LoadedEngine(EngineDir.open(build_engine_for(model)), threads=1)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_tiny_llama_is_transformers_pooled(tiny, pooling):
    model, loaded = tiny
    rng = np.random.default_rng(0)
    vocab = loaded.model.vocab_size
    prompts = [rng.integers(3, vocab, size=n).tolist() for n in LENGTHS]
    got = Embedder.of(loaded).embed(prompts, pooling)
    assert got.dtype == np.float32 and got.shape == (len(prompts), loaded.model.dims["hidden_size"])
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    measured = cosines(got.astype(np.float64), hf_vectors(model, prompts, pooling))
    print(f"tiny llama {pooling}: 1 - min cosine {1 - measured.min():.2e}")
    assert measured.min() > COSINE, measured
    # the other pooling is another vector (the test tells them apart)
    other = Embedder.of(loaded).embed(prompts, "mean" if pooling == "last" else "last")
    assert cosines(got, other)[1:].max() < 0.99


def test_smollm2_is_transformers_pooled(smollm2_dir, smollm2_engine):
    loaded = LoadedEngine(EngineDir.open(smollm2_engine), threads=2)
    texts = ["The capital of France is Paris.", "Embeddings map text to vectors.",
             "A much longer passage about the weather, which was sunny in the morning and rainy in the "
             "afternoon, so that everyone who had left their umbrella at home got wet on the way back.", "Hi",
             "def add(a, b):\n    return a + b\n"]
    prompts = [loaded.tokenizer.encode(t) for t in texts]
    embedder = Embedder.of(loaded)
    for pooling in ("last", "mean"):
        measured = cosines(embedder.embed(prompts, pooling).astype(np.float64), hf_vectors(smollm2_dir, prompts, pooling))
        print(f"SmolLM2 {pooling}: 1 - min cosine {1 - measured.min():.2e}")
        assert measured.min() > COSINE, measured


@pytest.mark.parametrize("family", ["gemma3", "mistral", "qwen3_5", "gemma4_moe"])
def test_families_with_windows_recurrent_layers_and_per_layer_inputs_are_transformers(family, family_model,
                                                                                     build_engine_for):
    """Gemma 3 (sliding windows of 8, the runtime's embedding scale, a soft-cap after the norm), Mistral
    (sliding), Qwen3.5 (Gated DeltaNet states, fresh each pass), Gemma 4 without shared caches (per-layer
    inputs, experts): prompts past the window, ragged, in two passes."""
    model = family_model(family)
    loaded = LoadedEngine(EngineDir.open(build_engine_for(model)), threads=1)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(10, 1000, size=n).tolist() for n in (30, 5, 17, 1, 12)]
    for pooling in ("last", "mean"):
        measured = cosines(Embedder.of(loaded).embed(prompts, pooling).astype(np.float64),
                           hf_vectors(model, prompts, pooling))
        print(f"{family} {pooling}: 1 - min cosine {1 - measured.min():.2e}")
        assert measured.min() > COSINE, measured


def test_an_engine_built_for_lora_embeds_with_the_base_weights(tiny_model, build_engine_for):
    """Its graph takes LoRA inputs (test_server's engine): zero adapters on every row."""
    model = tiny_model("qwen3")
    loaded = LoadedEngine(EngineDir.open(build_engine_for(model, lora={"max_rank": 8})), threads=1)
    assert loaded.lora_layout
    prompts = [[5, 9, 100, 7], [11, 12]]
    assert cosines(Embedder.of(loaded).embed(prompts), hf_vectors(model, prompts, "last")).min() > COSINE


def test_gemma4_with_shared_caches_has_no_output_and_says_so(family_model, build_engine_for):
    loaded = LoadedEngine(EngineDir.open(build_engine_for(family_model("gemma4_e2b"))), threads=1)
    with pytest.raises(EmbeddingError, match="^this engine's graph has no final_hidden_states output .* Gemma 4 "
                                             "with shared key/value layers"):
        Embedder.of(loaded).embed([[5, 6]])


def test_what_cannot_be_embedded_is_refused_in_one_line(tiny, monkeypatch):
    _, loaded = tiny
    embedder = Embedder.of(loaded)
    limit = loaded.limits["max_input_len"]
    cases = [([], "input: no texts to embed"), ([[5], []], "input[1]: empty"),
             ([[5] * (limit + 1)], f"input: {limit + 1} tokens, over the engine's max_input_len {limit}"),
             ([[5], [loaded.model.vocab_size]], "input[1]: token ids must be in"),
             ([[5]] * 2049, "input: 2049 texts, at most 2048")]
    for prompts, message in cases:
        with pytest.raises(EmbeddingError, match="^" + message.replace("[", r"\[").replace("]", r"\]")):
            embedder.embed(prompts)
    with pytest.raises(EmbeddingError, match="^pooling: 'cls' is not one of last, mean"):
        embedder.embed([[5]], "cls")
    # an engine whose graph has no final_hidden_states (built before it)
    monkeypatch.setattr(loaded.model.engine, "provides", lambda name: False)
    with pytest.raises(EmbeddingError, match="^this engine's graph has no final_hidden_states output"):
        Embedder.of(loaded).embed([[5]])


def with_pooling_config(model_dir, folder, modes: dict) -> str:
    """A copy of a checkpoint with a sentence-transformers modules.json and 1_Pooling/config.json."""
    shutil.copytree(model_dir, folder)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (folder / "1_Pooling").mkdir()
    config = {"word_embedding_dimension": 64, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False,
              "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
              "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": False, "include_prompt": True}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({**config, **modes}))
    return str(folder)


def test_a_sentence_transformers_pooling_config_sets_the_default(tiny, build_engine_for, tmp_path):
    from trt_llm.build.pooling import checkpoint_pooling

    model, loaded = tiny
    mean_dir = with_pooling_config(model, tmp_path / "mean", {"pooling_mode_mean_tokens": True})
    assert checkpoint_pooling(mean_dir) == "mean"
    assert checkpoint_pooling(with_pooling_config(model, tmp_path / "last", {"pooling_mode_lasttoken": True})) == "last"
    assert checkpoint_pooling(with_pooling_config(model, tmp_path / "cls", {"pooling_mode_cls_token": True})) is None
    assert checkpoint_pooling(model) is None and Embedder.of(loaded).default_pooling == "last"
    engine = build_engine_for(mean_dir)
    assert json.loads((engine / "tokenizer" / "pooling.json").read_text())["pooling"] == "mean"
    mean_engine = Embedder.of(LoadedEngine(EngineDir.open(engine), threads=1))
    assert mean_engine.default_pooling == "mean"
    prompts = [[5, 6, 7, 8], [9, 10]]
    np.testing.assert_allclose(mean_engine.embed(prompts), Embedder.of(loaded).embed(prompts, "mean"), atol=1e-6)


# --- /v1/embeddings with the official client -----------------------------------------------------------

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def server(tiny):
    from test_server import LiveServer
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.server.app import ServerConfig, create_app

    _, loaded = tiny
    runner = Runner(loaded.engine_dir, threads=1, scheduling="continuous")
    live = LiveServer(create_app(runner, ServerConfig(model_name="tiny", max_rows=4)))
    yield live
    live.close()


TEXTS = ["hello world", "a longer sentence about embeddings and vectors", "x", "the same text twice, twice",
         "and a fifth one, past the max batch of four"]


def test_the_endpoint_answers_transformers_vectors_as_float_and_base64(tiny, server):
    model, loaded = tiny
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    prompts = [loaded.tokenizer.encode(t) for t in TEXTS]
    expected = hf_vectors(model, prompts, "last")
    floats = client.embeddings.create(model="tiny", input=TEXTS, encoding_format="float")
    assert [d.index for d in floats.data] == list(range(len(TEXTS)))
    got = np.array([d.embedding for d in floats.data])
    assert cosines(got, expected).min() > COSINE
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == sum(map(len, prompts))
    # the client asks for base64 unless told otherwise, and decodes it: the same floats
    packed = client.embeddings.create(model="tiny", input=TEXTS)
    np.testing.assert_array_equal(np.array([d.embedding for d in packed.data], np.float32), got.astype(np.float32))
    raw = httpx.post(f"{server.url}/v1/embeddings", json={"model": "tiny", "input": TEXTS[0],
                                                         "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), "<f4")
    np.testing.assert_array_equal(decoded, got[0].astype(np.float32))
    # token ids, mean pooling (our extension, through the client's extra_body)
    mean = client.embeddings.create(model="tiny", input=prompts[:2], encoding_format="float",
                                    extra_body={"pooling": "mean"})
    assert cosines(np.array([d.embedding for d in mean.data]), hf_vectors(model, prompts[:2], "mean")).min() > COSINE
    assert client.embeddings.create(model="tiny", input=prompts[1], dimensions=loaded.model.dims["hidden_size"],
                                    encoding_format="float").data[0].embedding == pytest.approx(got[1], abs=1e-6)


def test_embeddings_beside_generation_leave_its_tokens_alone(server):
    from concurrent.futures import ThreadPoolExecutor

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)

    def generate():
        return client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=24, temperature=0).choices[0].text

    def embed():
        return np.array([d.embedding for d in client.embeddings.create(model="tiny", input=TEXTS * 4).data])

    alone, vectors_alone = generate(), embed()
    with ThreadPoolExecutor(6) as pool:
        texts = [pool.submit(generate) for _ in range(3)]
        vectors = [pool.submit(embed) for _ in range(3)]
        assert [t.result() for t in texts] == [alone] * 3
        for v in vectors:
            np.testing.assert_allclose(v.result(), vectors_alone, atol=1e-6)


@pytest.mark.parametrize("body, status, param, message", [
    ({"input": ""}, 400, "input", "input: an empty string"),
    ({"input": []}, 400, "input", "input: expected a non-empty string"),
    ({"input": ["a", ""]}, 400, "input", "input[1]: an empty string"),
    ({"input": ["a", "b\ud800c"]}, 400, "input", "input[1]: not valid Unicode text (unpaired surrogate at position 1)"),
    ({"input": ["a", 3]}, 400, "input", "input: texts and token id lists mixed"),
    ({"input": ["a"] * 2049}, 400, "input", "input: 2049 texts, at most 2048 a request"),
    ({"input": [[1, 2], [99999]]}, 400, "input", "input[1]: token ids must be in"),
    ({"input": [[5] * 300]}, 400, "input", "input: 300 tokens, over the engine's max_input_len 256"),
    ({"input": "a", "dimensions": 7}, 400, "dimensions", "dimensions: this model's embeddings have"),
    ({"input": "a", "pooling": "cls"}, 400, "pooling", "pooling:"),
    ({"input": "a", "encoding_format": "int8"}, 400, "encoding_format", "encoding_format:"),
    ({"input": "a", "colour": 1}, 400, "colour", "colour:"),
    ({"input": "a", "model": "other"}, 404, "model", "model 'other' is not served here"),
])
def test_bad_bodies_are_4xx_naming_the_field(server, body, status, param, message):
    # (json.dumps writes a lone surrogate as the escape a client would send)
    answer = httpx.post(f"{server.url}/v1/embeddings", content=json.dumps({"model": "tiny", **body}),
                        headers={"Content-Type": "application/json"}, timeout=30)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and error["message"].startswith(message), error


# --- the input file's task embed ------------------------------------------------------------------------

@pytest.mark.parametrize("scheduling", ["static", "continuous"])
def test_input_file_embedding_requests_answer_beside_generation(tiny, tmp_path, scheduling):
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.schemas.input_file import load_input_file

    model, loaded = tiny
    limit = loaded.limits["max_input_len"]

    def embed(text, **extra):
        return {"messages": [{"role": "user", "content": text}], "task": "embed", **extra}

    chat = {"messages": [{"role": "user", "content": "Tell me a story"}]}
    requests = [embed("first text"), chat, embed("second, mean", pooling="mean"), embed("word " * (limit + 10)),
                {**embed("x"), "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
                embed([{"type": "text", "text": "in "}, {"type": "text", "text": "parts"}]), chat]
    path = tmp_path / "input.json"
    path.write_text(json.dumps({"batch_size": 2, "temperature": 0.0, "max_generate_length": 8, "requests": requests}))
    file = load_input_file(path)
    output = Runner(loaded.engine_dir, threads=1, scheduling=scheduling).run(file, file.settings)
    out, written = output.responses, json.loads(output.to_json())["responses"]
    assert written[0]["embedding"] == out[0].embedding and "embedding" not in written[1]
    assert [r.request_idx for r in out] == list(range(len(requests)))
    for i, pooling, text in ((0, "last", "first text"), (2, "mean", "second, mean"), (5, "last", "in parts")):
        ids = loaded.tokenizer.encode(text)
        assert out[i].finish_reason == "end-of-sequence" and out[i].prompt_tokens == len(ids)
        assert out[i].output_text == "" and out[i].batch_idx == i % 2
        assert cosines(np.array([out[i].embedding]), hf_vectors(model, [ids], pooling))[0] > COSINE
    assert out[3].finish_reason == "error" and out[3].error.startswith("requests[3].messages: ")
    assert f"over the engine's max_input_len {limit}" in out[3].error
    assert out[4].error == "requests[4]: messages: task embed takes one message of text (got 2 messages, 0 non-text parts)"
    # the generation requests are answered as they are without the embeddings beside them
    assert out[1].embedding is None and out[1].generated_tokens > 0 and out[1].output_text == out[6].output_text
    alone = Runner(loaded.engine_dir, threads=1).run(load_input_file(_only(tmp_path, chat)), file.settings).responses
    assert out[1].output_token_ids == alone[0].output_token_ids


def _only(folder, request):
    path = folder / "alone.json"
    path.write_text(json.dumps({"temperature": 0.0, "max_generate_length": 8, "requests": [request]}))
    return path


# --- the TensorRT engine's binding of the output, on test_cuda_graphs' simulated device ------------------

def test_the_tensorrt_engine_binds_final_hidden_states_asked_or_not():
    """TensorRT runs only with every output bound: a step that does not fetch final_hidden_states gets a
    scratch buffer, one that does gets the rows back (here the simulated plan writes the new tokens' embeddings
    there, so each vector is its last or mean embedding row, normalised)."""
    import test_cuda_graphs as sim
    from trt_llm.runtime.backends.trt_engine import TrtEngine
    from trt_llm.runtime.engine.model import Model
    from trt_llm.schemas.graph_spec import FINAL_HIDDEN

    dtypes = {**sim.DTYPES, FINAL_HIDDEN: "f4"}

    class Context(sim.FakeContext):
        def execute_async_v3(self, stream):
            assert FINAL_HIDDEN in self.addresses  # (TensorRT: every output needs an address)
            batch, seq, hidden = self.shapes["inputs_embeds"]
            embeds = self.cudart.read(self.addresses["inputs_embeds"], batch * seq * hidden * 4)
            self.cudart.write(self.addresses[FINAL_HIDDEN], embeds)
            return super().execute_async_v3(stream)

    class Plan(sim.FakeEngine):
        num_io_tensors = len(dtypes)

        def create_execution_context(self):
            return Context(self.cudart)

        def get_tensor_name(self, i):
            return list(dtypes)[i]

        def get_tensor_dtype(self, name):
            return dtypes[name]

    engine = TrtEngine.__new__(TrtEngine)
    cudart = sim.FakeCudart()
    engine._setup(sim.FakeTrt, cudart, Plan(cudart), 1, "tensorrt", False)
    assert engine.provides(FINAL_HIDDEN) and not engine.provides("hidden_states")
    table = np.random.default_rng(1).normal(size=(sim.VOCAB, sim.HIDDEN)).astype(np.float32)
    model = Model(engine, table, {"vocab_size": sim.VOCAB, "hidden_size": sim.HIDDEN}, eos_token_ids=[sim.VOCAB + 1])
    generated, _ = sim.decode(engine, sim.PROMPTS, sim.MAX_NEW)  # decoding, the output never asked for
    assert generated == sim.decode(sim.fake_engine(graphs=False), sim.PROMPTS, sim.MAX_NEW)[0]
    prompts = [[3, 1, 4], [1, 5, 7, 9], [2]]
    for pooling in ("last", "mean"):
        rows = [table[p][-1] if pooling == "last" else table[p].mean(axis=0) for p in prompts]
        expected = np.array([r / np.linalg.norm(r) for r in rows])
        got = Embedder(model, 2, 32, None, "last", None).embed(prompts, pooling)
        np.testing.assert_allclose(got, expected, atol=1e-6)


def test_a_tensorrt_rtx_plan_has_the_output(tiny_model, build_engine_for):
    """TensorRT-RTX parses the graph with final_hidden_states as an output [batch, seq, H] in the model's
    dtype and builds its plan ahead of time (test_tensorrt_rtx's engine; running it needs a GPU)."""
    pytest.importorskip("tensorrt_rtx")
    from trt_llm.build.tensorrt_backend import describe_network

    engine = build_engine_for(tiny_model("qwen3"), backend="tensorrt-rtx", max_batch_size=2, max_input_len=64,
                              max_kv_cache_capacity=128)
    tensors = describe_network(engine / "llm" / "model.onnx", rtx=True)
    assert tensors["final_hidden_states"] == ((-1, -1, 64), "FLOAT", False)
    assert (engine / json.loads((engine / "manifest.json").read_text())["components"]["llm"]["engine"]).is_file()
