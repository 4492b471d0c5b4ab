"""Property-based fuzz (hypothesis) of the two documents a user hands trt-llm-run: the input file and
the engine directory's manifest. Whatever they hold, the run ends with a documented exit status
(0, 1, 2), never a traceback, and writes the output file whenever the file as a whole was usable.

The examples are derandomized (the same each run, so CI cannot turn red by chance) and mutate real
documents: a valid input file or a real engine's manifest, with values replaced by random JSON,
keys deleted or added, and lone surrogates, huge numbers and wrong types among the values.
"""

import copy
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from helpers import PROMPTS, chat_request
from trt_llm.runtime.app.run_cli import main as run_main
from trt_llm.schemas.input_file import InputFileError, RequestError, load_input_file, parse_input_dict

FUZZ = settings(derandomize=True, deadline=None, suppress_health_check=list(HealthCheck), database=None)

# Strings a user might not expect to matter: lone surrogates ("\ud800" escapes), control and
# astral characters, template syntax, very long text.
tricky_text = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["\ud800", "a\udfffb", "\x00", "\U0001F600", "{{ raise_exception('x') }}", "{%", "x" * 140_000,
                     "-1", "1e3", "0.5", "user", "system", "text", "image", "../../etc/passwd", ""]),
)
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.sampled_from([0, 1, -1, 2**31, 2**63, 2**64, 10**30]),
                    st.floats(allow_nan=False, allow_infinity=False), tricky_text)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(tricky_text, inner, max_size=4)), max_leaves=10)


def paths(value, prefix=()):
    """Every (container path, key) in a JSON document."""
    found = []
    if isinstance(value, dict):
        for key, item in value.items():
            found.append((prefix, key))
            found += paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.append((prefix, index))
            found += paths(item, prefix + (index,))
    return found


def at(document, path):
    for key in path:
        document = document[key]
    return document


@st.composite
def mutated(draw, base, keep=()):
    """`base` with 1 to 4 random edits; paths starting with a prefix in `keep` are left alone."""
    document = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 4))):
        # Neither a kept path, nor inside one, nor one of its ancestors.
        candidates = [(p, k) for p, k in paths(document)
                      if not any((p + (k,))[:len(c)] == c or c[:len(p) + 1] == p + (k,) for c in keep)]
        if not candidates:
            break
        parent_path, key = draw(st.sampled_from(candidates))
        parent = at(document, parent_path)
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[key] = draw(json_values)
        elif action == "delete":
            del parent[key]
        elif isinstance(parent, dict):
            parent[draw(tricky_text)] = draw(json_values)
        elif any(c[:len(parent_path)] == parent_path for c in keep):
            parent.append(draw(json_values))  # an insert would shift the kept element
        else:
            parent.insert(key, draw(json_values))
    return document


BASE_INPUT = {"batch_size": 2, "temperature": 0.0, "max_generate_length": 3, "num_logprobs": 2,
              "logit_bias": {"5": 1.0}, "stop": None,
              "requests": [chat_request(PROMPTS[0]), chat_request(PROMPTS[1], stop=["x"], num_logprobs=1),
                           {"messages": [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}]}


@given(document=st.one_of(mutated(BASE_INPUT), json_values))
@FUZZ
def test_input_documents_never_raise_but_input_file_error(document):
    try:
        loaded = parse_input_dict(document)
    except InputFileError as error:
        assert str(error).startswith("<input>: ") and "\n" not in str(error)
        return
    for index, slot in enumerate(loaded.requests):
        if isinstance(slot, RequestError):
            assert slot.message.startswith(f"requests[{index}]") and "\n" not in slot.message


@given(text=st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
                      st.just(json.dumps(BASE_INPUT)).flatmap(
                          lambda t: st.integers(0, len(t)).map(lambda n: t[:n]))))
@FUZZ
def test_input_file_text_never_raises_but_input_file_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "in.json"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    try:
        load_input_file(path)
    except InputFileError as error:
        assert "\n" not in str(error)


@pytest.fixture(scope="module")
def engine(tiny_model, build_engine_for):
    return build_engine_for(tiny_model("llama"), max_input_len=128, max_kv_cache_capacity=160)


def _run(tmp_path: Path, input_text: str, engine_dir: Path) -> tuple[int, Path]:
    source = tmp_path / "in.json"
    source.write_bytes(input_text.encode("utf-8", "surrogatepass"))
    out = tmp_path / "out.json"
    out.unlink(missing_ok=True)
    code = run_main([str(source), "--engine-dir", str(engine_dir), "-o", str(out), "--threads", "1"])
    return code, out


@given(document=mutated(BASE_INPUT, keep=(("requests", 0),)))
@settings(FUZZ, max_examples=30)
def test_run_on_fuzzed_input_files(engine, tmp_path_factory, document):
    tmp_path = tmp_path_factory.mktemp("run")
    code, out = _run(tmp_path, json.dumps(document), engine)
    try:
        loaded = parse_input_dict(json.loads(json.dumps(document)))
        usable = loaded.settings.batch_size <= 4  # the engine's max_batch_size
    except InputFileError:
        usable = False
    event(f"exit {code}")  # --hypothesis-show-statistics: how the examples ended
    assert code in (0, 1, 2)
    assert (code == 2) == (not usable)
    if usable:
        responses = json.loads(out.read_text(encoding="utf-8"))["responses"]
        assert [r["request_idx"] for r in responses] == list(range(len(loaded.requests)))
        for slot, response in zip(loaded.requests, responses):
            if isinstance(slot, RequestError):
                assert response["finish_reason"] == "error" and response["error"] == slot.message
        assert (code == 1) == any(r["finish_reason"] == "error" for r in responses)
    else:
        assert not out.exists()


@pytest.fixture(scope="module")
def manifest(engine):
    return json.loads((engine / "manifest.json").read_text())


@given(data=st.data())
@settings(FUZZ, max_examples=40)
def test_run_on_fuzzed_manifests(engine, manifest, tmp_path_factory, data):
    damaged = tmp_path_factory.mktemp("engine") / "engine"
    shutil.copytree(engine, damaged, copy_function=os.link)  # weights hard-linked, only the manifest is new
    (damaged / "manifest.json").unlink()
    document = data.draw(st.one_of(mutated(manifest), json_values.map(lambda v: v)))
    text = json.dumps(document)
    if data.draw(st.booleans()):  # sometimes a truncated manifest
        text = text[: data.draw(st.integers(0, len(text)))]
    (damaged / "manifest.json").write_bytes(text.encode("utf-8", "surrogatepass"))
    tmp_path = damaged.parent
    code, out = _run(tmp_path, json.dumps({"temperature": 0.0, "max_generate_length": 2,
                                           "requests": [chat_request("Hi")]}), damaged)
    event(f"exit {code}")
    assert code in (0, 1, 2)
    assert out.exists() == (code in (0, 1))
