"""The context cache never costs a batch (issue 47 item 4): a record on disk whose metadata, shapes or
values do not fit the engine is skipped with one warning and removed; a folder that cannot be the
cache is one line before any request runs; a folder in place of a record, or temporary files an
interrupted run left, are one warning each. Every request is answered with the tokens it gets
without any cache (the oracle: the same engine, reuse bypassed)."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from trt_llm.runtime.cache.context_cache import ContextCache
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import parse_input_dict

SYSTEM = "You are the help desk of a small railway museum. You answer questions briefly and kindly, always."
QUESTIONS = ["Which engines can I see on Sunday?", "How much is a ticket for a child?",
             "Is the workshop open in winter?"]
DATA = {"temperature": 0.0, "max_generate_length": 6,
        "requests": [{"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]}
                     for q in QUESTIONS]}


@pytest.fixture(scope="module")
def engine(tiny_model, build_engine_for):
    return build_engine_for(tiny_model("qwen3"))  # the session's shared tiny engine


@pytest.fixture(scope="module")
def oracle(engine):
    """Each request's tokens without the context cache."""
    return [r.output_token_ids for r in run(engine, {**DATA, "context_cache_lookup_policy": "bypass"}, None)]


def run(engine, data, directory):
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    engine_dir = EngineDir.open(engine)
    cache = ContextCache(engine_dir.identity, directory=directory) if directory is not None else None
    runner = Runner(engine_dir, threads=1, context_reuse=True, prefix_cache=cache)
    return runner.run(loaded, loaded.settings).responses


def rewrite(path, change):
    """Write the record at `path` again with change(tensors, metadata) applied (a hand edit)."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    with safe_open(str(path), framework="numpy") as f:
        metadata, tensors = dict(f.metadata()), {name: f.get_tensor(name) for name in f.keys()}
    change(tensors, metadata)
    save_file(tensors, str(path), metadata=metadata)


def one_head(tensors, metadata):  # keys and values of another geometry: [Hkv, n, D] with Hkv 1
    tensors["key_0"], tensors["value_0"] = tensors["key_0"][:1], tensors["value_0"][:1]


def nan(tensors, metadata):
    tensors["value_1"] = np.full_like(tensors["value_1"], np.nan)


def inf(tensors, metadata):
    tensors["key_1"] = np.full_like(tensors["key_1"], np.inf)


def fewer_layers(tensors, metadata):  # the metadata of a one-layer engine
    metadata["layers"] = "1"


def float16(tensors, metadata):
    tensors["key_0"], tensors["value_0"] = tensors["key_0"].astype(np.float16), tensors["value_0"].astype(np.float16)


EDITS = {one_head: "shape [1, ", nan: "NaN or infinite", inf: "NaN or infinite", fewer_layers: "holds 1 layers",
         float16: "dtype float16"}


@pytest.fixture(scope="module")
def warm(engine, oracle, tmp_path_factory):
    """A cache folder the first run filled (its answers are the oracle's)."""
    folder = tmp_path_factory.mktemp("warm") / "kv"
    assert [r.output_token_ids for r in run(engine, DATA, folder)] == oracle
    return folder


@pytest.mark.parametrize("edit", EDITS, ids=lambda edit: edit.__name__)
def test_records_that_do_not_fit_are_skipped_once_and_removed(edit, engine, oracle, warm, tmp_path, caplog):
    import shutil

    folder = tmp_path / "kv"
    shutil.copytree(warm, folder)
    blocks = sorted((folder / "blocks").glob("*.safetensors"))
    assert len(blocks) >= 3
    for path in blocks:
        rewrite(path, edit)
    caplog.clear()
    second = run(engine, DATA, folder)
    assert [r.output_token_ids for r in second] == oracle  # every request answered, as without a cache
    warned = [path for path in blocks if path.name in caplog.text]
    assert warned and EDITS[edit] in caplog.text
    assert all(caplog.text.count(path.name) == 1 for path in warned)  # one warning a record
    # A warned record was removed (the run then wrote its block again, whole): every record left fits.
    caplog.clear()
    check = ContextCache(EngineDir.open(engine).identity, directory=folder)
    check.expect(EngineDir.open(engine))
    for path in sorted((folder / "blocks").glob("*.safetensors")):
        if path in warned or path not in blocks:
            assert check.block(path.stem) is not None, path.name
    assert "context cache" not in caplog.text


def test_temporary_files_an_interrupted_run_left_are_removed_with_one_warning(engine, oracle, warm, tmp_path,
                                                                              caplog):
    import shutil

    folder = tmp_path / "kv"
    shutil.copytree(warm, folder)
    old = [folder / "blocks" / "feedfeedfeedfeedfeedfeedfeedfeed.1234.tmp", folder / "0badc0de.99.tmp"]
    for path in old:
        path.write_bytes(b"half a record")
        an_hour_ago = time.time() - 3600
        os.utime(path, (an_hour_ago, an_hour_ago))
    live = folder / "blocks" / "abcdabcdabcdabcdabcdabcdabcdabcd.777.tmp"  # another process writing it now
    live.write_bytes(b"being written")
    caplog.clear()
    responses = run(engine, DATA, folder)
    assert [r.output_token_ids for r in responses] == oracle and any(r.reused_tokens for r in responses)
    assert not any(path.exists() for path in old) and live.exists()
    assert caplog.text.count("removed 2 temporary files") == 1


def test_a_folder_in_place_of_a_record_is_one_warning(engine, oracle, tmp_path, caplog):
    folder = tmp_path / "kv"
    run(engine, DATA, folder)
    blocks = sorted((folder / "blocks").glob("*.safetensors"))
    for path in blocks:  # every record a folder now: nothing can be read or written there
        path.unlink()
        path.mkdir()
    caplog.clear()
    responses = run(engine, DATA, folder)
    assert [r.output_token_ids for r in responses] == oracle
    for path in blocks:
        assert caplog.text.count(path.name) <= 1
    assert "cannot write" in caplog.text and not list((folder / "blocks").glob("*.tmp"))


def run_cli(engine, tmp_path, cache_dir):
    (tmp_path / "in.json").write_text(json.dumps(DATA))
    out = tmp_path / "out.json"
    result = subprocess.run([sys.executable, "-m", "trt_llm.runtime.app.run_cli", str(tmp_path / "in.json"),
                             "--engine-dir", str(engine), "-o", str(out), "--threads", "1", "--context-reuse",
                             "--kv-cache-dir", str(cache_dir)], capture_output=True, text=True, timeout=300)
    return result, out


@pytest.mark.parametrize("case", ["blocks_is_a_file", "engine_dir"])
def test_a_folder_that_cannot_be_the_cache_is_one_line(case, engine, tmp_path):
    if case == "blocks_is_a_file":
        cache_dir = tmp_path / "kv"
        cache_dir.mkdir()
        (cache_dir / "blocks").write_text("not a folder")
        expected = f"{str(cache_dir / 'blocks')!r} is a file, not a folder"
    else:
        cache_dir = engine
        expected = "holds manifest.json (an engine directory or bundle)"
    before = sorted(p.name for p in engine.iterdir())
    result, out = run_cli(engine, tmp_path, cache_dir)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "--kv-cache-dir" in lines[0] and expected in lines[0]
    assert not out.exists()  # refused before any request ran
    assert sorted(p.name for p in engine.iterdir()) == before  # nothing written into the engine


def test_records_of_another_engine_are_left_alone(tmp_path, caplog):
    """A kept system prompt of another engine sharing the folder is not this engine's to remove."""
    from trt_llm.runtime.cache.context_cache import Entry

    keys = [np.ones((2, 3, 4), np.float32)]
    ContextCache("engine-a", directory=tmp_path).put(None, Entry((1, 2, 3), keys, keys))
    assert ContextCache("engine-b", directory=tmp_path).get(None, (1, 2, 3)) is None
    assert "another engine" in caplog.text and "ignored" in caplog.text
    assert ContextCache("engine-a", directory=tmp_path).get(None, (1, 2, 3)) is not None
