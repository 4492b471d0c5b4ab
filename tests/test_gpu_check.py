"""scripts/gpu_check.py on this machine: the CPU rows pass, the rows that need a GPU (or a module that
is not installed) are skipped and say why, and the script exits 0; its checks fail when what they
check is wrong."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from trt_llm.plugins.attention import attention_kernel
from trt_llm.common.trt_import import cuda_device_count

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
HAS_GPU = cuda_device_count()[0] > 0 and torch.cuda.is_available()


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gpu_check = _load_script()


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The whole script, as a person runs it (plus --json and a kept work folder)."""
    work = tmp_path_factory.mktemp("gpu-check")
    done = subprocess.run([sys.executable, str(SCRIPT), "--json", str(work / "report.json"),
                           "--work-dir", str(work / "work")], capture_output=True, text=True, timeout=1800)
    return done, json.loads((work / "report.json").read_text())


def test_script_exits_zero_with_a_table(report):
    done, data = report
    assert done.returncode == 0, done.stdout + done.stderr
    assert "passed, 0 failed" in done.stdout
    statuses = {row["status"] for row in data["rows"]}
    assert statuses <= {"pass", "skip"}
    for row in data["rows"]:
        assert row["check"] in done.stdout


def test_cpu_kernel_rows_pass_for_every_dtype(report):
    rows = {row["check"]: row for row in report[1]["rows"]}
    for dtype in ("fp32", "fp16", "bf16"):
        row = rows[f"attention kernel, cpu, {dtype}"]
        assert row["status"] == "pass", row
        assert f"{len(gpu_check.CASES)} cases" in row["detail"]
        assert rows[f"vision attention kernel, cpu, {dtype}"]["status"] == "pass"
        assert rows[f"cross attention kernel, cpu, {dtype}"]["status"] == "pass"


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_gpu_rows_are_skipped_saying_why(report):
    rows = {row["check"]: row for row in report[1]["rows"]}
    for dtype in ("fp32", "fp16", "bf16"):
        for check in (f"attention kernel, cuda, {dtype}", f"attention kernel in a CUDA graph, cuda, {dtype}",
                      f"vision attention kernel, cuda, {dtype}", f"cross attention kernel, cuda, {dtype}"):
            assert rows[check]["status"] == "skip" and "no CUDA device" in rows[check]["detail"]
    for backend in ("tensorrt", "tensorrt-rtx"):
        for check in (f"{backend}: run, CUDA graphs off", f"{backend}: run, CUDA graphs on",
                      f"{backend}: EAGLE3 run, speculation equals vanilla"):
            assert rows[check]["status"] == "skip"
            assert "no CUDA device" in rows[check]["detail"] or "cannot be imported" in rows[check]["detail"]


@pytest.mark.parametrize("check", ["tensorrt-rtx: build", "tensorrt-rtx: EAGLE3 build"])
def test_tensorrt_rtx_builds_without_a_gpu(report, check):
    row = {row["check"]: row for row in report[1]["rows"]}[check]
    if importlib.util.find_spec("tensorrt_rtx") is None:
        assert row["status"] == "skip" and "pip install" in row["detail"]
    else:
        assert row["status"] == "pass", row


# --- the checks fail when what they check is wrong --------------------------------------------


def _without_rotary_on_keys(qkv, past_key, past_value, past_lengths, query_lengths, position_ids, cos, sin, *rest,
                            **kwargs):
    ones, zeros = torch.ones_like(cos), torch.zeros_like(sin)
    out, _, _ = attention_kernel(qkv, past_key, past_value, past_lengths, query_lengths, position_ids, cos, sin,
                                 *rest, **kwargs)
    _, key, value = attention_kernel(qkv, past_key, past_value, past_lengths, query_lengths, position_ids, ones,
                                     zeros, *rest)
    return out, key, value


def _ignoring_the_tree(*args, **kwargs):
    args = list(args)
    args[8] = None
    return attention_kernel(*args, **kwargs)


def _ignoring_window_and_softcap(*args, **kwargs):
    return attention_kernel(*args[:12], **kwargs)  # qkv .. scale: the defaults, neither


def _clobbering_the_next_slot(*args, **kwargs):
    out, key, value = attention_kernel(*args, **kwargs)
    for row, end in enumerate((args[3] + args[4]).tolist()):
        if end < key.shape[2]:
            key[row, :, end] = 0  # a slot after the row's new tokens: it must keep the cache's value
    return out, key, value


@pytest.mark.parametrize("broken, expected", [
    (_without_rotary_on_keys, "present_key"),
    (_ignoring_the_tree, "tree mask"),
    (_ignoring_window_and_softcap, "window and soft-cap"),
    (_clobbering_the_next_slot, "changed slots it must keep"),
])
def test_kernel_check_fails_a_broken_kernel(broken, expected):
    row = gpu_check.check_kernel("cpu", "fp32", kernel=broken, seeds=(0,))
    assert row.status == "fail" and expected in row.detail, row


def test_kernel_check_of_the_real_kernel_passes_in_place_too():
    row = gpu_check.check_kernel("cpu", "fp16", seeds=(3,))
    assert row.status == "pass", row


def test_graph_check_replays_on_new_data():
    """The CUDA-graph row's data flow, with stand-ins for the capture: a replay must show the second
    batch's results, and one that leaves the first batch's results is caught."""
    eager = lambda step: (step(), step)[1]  # noqa: E731 - capture = run once, replay = run again
    assert gpu_check.check_kernel_in_graph("fp32", device="cpu", capture=eager).status == "pass"

    stale = lambda step: (step(), lambda: None)[1]  # noqa: E731 - the replay leaves the first batch's results
    row = gpu_check.check_kernel_in_graph("fp32", device="cpu", capture=stale)
    assert row.status == "fail" and "replay on new data" in row.detail, row


def test_token_difference_names_the_request_and_position():
    assert gpu_check.token_difference({0: [1, 2, 3]}, {0: [1, 2, 3]}) is None
    text = gpu_check.token_difference({0: [1, 2], 1: [5, 6, 7]}, {0: [1, 2], 1: [5, 9, 7]})
    assert text.startswith("request 1 differs at token 1")
    assert "request 0: missing" in gpu_check.token_difference({0: [1]}, {})


def test_engine_rows_compare_tokens_and_demand_graph_evidence(tmp_path, tiny_model, build_engine_for, monkeypatch):
    """The engine part end to end with the cpu backend standing in for a GPU one: the same tokens
    pass with graphs off; with graphs on, a log without captured graphs is a failure."""
    import assets

    model = tiny_model("qwen3")
    engine = build_engine_for(model)
    eagle = build_engine_for(model, draft={"model": str(assets.make_random_draft(model, tmp_path / "draft")),
                                           "max_draft_tree_size": 24, "max_verify_tree_size": 16})
    monkeypatch.setattr(assets, "make_tiny_model", lambda family, folder: model)
    monkeypatch.setattr(gpu_check.EngineCheck, "build",
                        lambda self, backend, name=None, draft=False: (eagle if draft else engine, "prebuilt"))
    check = gpu_check.EngineCheck(tmp_path, "qwen3", "fp32", has_cuda=True)
    check.backend("cpu", module=types.SimpleNamespace(__name__="onnxruntime", __version__="-"))
    rows = {row.check: row for row in check.rows}
    assert rows["cpu backend (reference): run"].status == "pass", rows
    assert rows["cpu: run, CUDA graphs off"].status == "pass", rows
    assert rows["cpu: run, CUDA graphs off"].detail.startswith("tokens equal to cpu")
    speculation = rows["cpu: EAGLE3 run, speculation equals vanilla"]
    assert speculation.status == "pass" and speculation.detail.startswith("tokens equal to cpu"), speculation
    graphs_on = rows["cpu: run, CUDA graphs on"]
    assert graphs_on.status == "fail" and "log shows no 'CUDA graph captured'" in graphs_on.detail
    request = json.loads((tmp_path / "input.json").read_text())
    assert request["requests"][2]["logit_bias"] == {"2": 100.0}  # <|im_end|>: that row ends at once
