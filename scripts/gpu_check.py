#!/usr/bin/env python3
"""The GPU parts of trt-llm, checked in one command on a CUDA machine: `python scripts/gpu_check.py`.

1. The attention plugin's kernel (plugins/attention.py facet 4, `attention_kernel`, the code the
   TensorRT plugin runs) against the torch reference op on the CPU, case by case: ragged prefill,
   ragged decode, several new tokens on a non-empty cache, idle rows, a full cache, a tree mask,
   present written over past (in place), a sliding window with soft-capping; in fp32, fp16 and bf16. On the CPU always; on the GPU where
   torch sees one, also captured in a CUDA graph and replayed on new data (what TrtEngine's graphs do).
   Needs only torch. The vision attention plugin's kernel (plugins/vision_attention.py) likewise,
   over ragged image / window segments, and the cross-attention plugin's (plugins/cross_attention.py,
   Whisper's decoder over 1,500 encoder frames), on the CPU and the GPU.
2. Where `tensorrt` imports and a GPU is present: a tiny random model (tests/assets.py) built with
   backend tensorrt, an input file run on it with trt-llm-run with CUDA graphs off and on, and the
   output tokens compared with the cpu backend's; with graphs on, TrtEngine's log must show graphs
   captured and no capture failure. Then the same model with a random EAGLE3 draft (which rarely
   guesses right): speculation on the GPU must give the cpu backend's vanilla tokens.
3. The same for `tensorrt-rtx` (whose builds also run without a GPU).

Prints a pass / fail / skip table; exit status 1 when anything failed, else 0. Rows that need what
this machine lacks are skipped and say why ("no CUDA device").

    python3 scripts/gpu_check.py [--json report.json] [--work-dir DIR] [--kernels-only]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # assets.py: the offline tiny models

from trt_llm.plugins.attention import attention, attention_kernel, tree_mask_for  # noqa: E402

PASS, FAIL, SKIP = "pass", "fail", "skip"
NO_CUDA = "no CUDA device"


@dataclass
class Row:
    check: str
    status: str
    detail: str = ""


# --- 1. the attention kernel ---------------------------------------------------------------------

HEADS, KV_HEADS, HEAD_DIM, CAPACITY, POSITIONS = 4, 2, 16, 24, 64
SCALE = HEAD_DIM ** -0.5
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# |kernel - reference| <= tol * (1 + |reference|); the reference runs in fp32 on the same rounded inputs.
# Measured on the CPU: fp32 2e-7, fp16 1.5e-3, bf16 8.4e-3.
TOLERANCE = {"fp32": 2e-5, "fp16": 1e-2, "bf16": 5e-2}
# (past lengths, new tokens per row, new tokens in the batch's widest row)
CASES = {
    "ragged prefill": ([0, 0, 0], [5, 3, 1], 5),
    "ragged decode": ([7, 2, 12, 0], [1, 1, 1, 1], 1),
    "new tokens on a cache": ([6, 3], [4, 2], 4),
    "idle rows": ([4, 0, 9], [0, 3, 0], 3),
    "full cache": ([CAPACITY - 3, 1], [3, 2], 3),
    "tree mask": ([6, 2, 4], [5, 3, 0], 5),
    "in place": ([5, 1, 8], [1, 1, 1], 1),
    "window and soft-cap": ([6, 3, 0], [4, 2, 5], 5),
}
# (window, softcap) of the cases that have them (a window shorter than most rows); the rest have neither.
WINDOWED = {"window and soft-cap": (3, 2.0)}
# The tree case: row 0 a tree (parents first), row 1 a chain, row 2 idle.
TREE_PARENTS = {0: [None, 0, 0, 1, 2], 1: [None, 0, 1]}


def rotary_tables() -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
    freqs = torch.outer(torch.arange(POSITIONS).float(), inv_freq)
    return freqs.cos(), freqs.sin()


def case_inputs(case: str, seed: int) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """The op's inputs for a case, fp32 on the CPU: [qkv, past_key, past_value, past_lengths,
    query_lengths, position_ids, cos, sin], and the tree mask or None."""
    past, new, seq = CASES[case]
    generator = torch.Generator().manual_seed(seed)
    batch = len(past)
    past_t = torch.tensor(past, dtype=torch.int32)
    positions = (past_t[:, None] + torch.arange(seq)[None]).int()
    cos, sin = rotary_tables()
    inputs = [torch.randn(batch, seq, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=generator),
              torch.randn(batch, KV_HEADS, CAPACITY, HEAD_DIM, generator=generator),
              torch.randn(batch, KV_HEADS, CAPACITY, HEAD_DIM, generator=generator),
              past_t, torch.tensor(new, dtype=torch.int32), positions, cos, sin]
    if case != "tree mask":
        return inputs, None
    mask = torch.zeros(batch, seq, seq, dtype=torch.bool)
    for row in range(batch):
        tree = TREE_PARENTS.get(row, [])
        mask[row], depths = tree_mask_for(tree, seq)
        positions[row, :len(tree)] = past[row] + torch.tensor(depths, dtype=torch.int32)
        for node in range(len(tree), seq):
            mask[row, node, node] = True  # padding sees itself only, as the runtime pads
    return inputs, mask


def _rounded(inputs: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    return [t.to(dtype) if t.is_floating_point() else t for t in inputs]


def compare(case: str, dtype: str, inputs: list[torch.Tensor], expected, got) -> tuple[str | None, float]:
    """(what is wrong, or None; the largest scaled error). Only valid query positions and the slots
    a row wrote carry values; padded queries must be 0 and every other slot must be past, exactly."""
    past, new = inputs[3].tolist(), inputs[4].tolist()
    tolerance, worst = TOLERANCE[dtype], 0.0
    got = [t.detach().float().cpu() for t in got]
    for name, value in zip(("output", "present_key", "present_value"), got):
        if not torch.isfinite(value).all():
            return f"{case}: {name} has non-finite values", worst
    for row, (p, q) in enumerate(zip(past, new)):
        pairs = [("output", got[0][row, :q], expected[0][row, :q])]
        pairs += [(name, got[i][row, :, p:p + q], expected[i][row, :, p:p + q])
                  for i, name in ((1, "present_key"), (2, "present_value"))]
        for name, g, e in pairs:
            if g.numel():
                error = float(((g - e).abs() / (1 + e.abs())).max())
                worst = max(worst, error)
                if error > tolerance:
                    return f"{case}: {name} of row {row} off by {error:.2e} (tolerance {tolerance:.0e})", worst
        if got[0][row, q:].count_nonzero():
            return f"{case}: padded queries of row {row} are not zero", worst
        for i, name in ((1, "present_key"), (2, "present_value")):
            kept = torch.cat([got[i][row, :, :p], got[i][row, :, p + q:]], dim=1)
            before = torch.cat([inputs[i][row, :, :p], inputs[i][row, :, p + q:]], dim=1).float()
            if not torch.equal(kept, before):
                return f"{case}: {name} of row {row} changed slots it must keep", worst
    return None, worst


def check_kernel(device: str, dtype: str, kernel=attention_kernel, seeds=(0, 1)) -> Row:
    """The kernel on `device` in `dtype` against the reference in fp32 on the CPU, every case."""
    name = f"attention kernel, {device}, {dtype}"
    worst = 0.0
    for case in CASES:
        for seed in seeds:
            inputs, mask = case_inputs(case, seed)
            attributes = (HEADS, KV_HEADS, SCALE, *WINDOWED.get(case, (0, 0.0)))
            rounded = _rounded(inputs, DTYPES[dtype])
            expected = attention(*[t.float() if t.is_floating_point() else t for t in rounded], mask, *attributes)
            on_device = [t.to(device, copy=True) for t in rounded]  # `rounded` stays as it was
            with torch.no_grad():
                if case == "in place":  # present written over past's own memory, as TensorRT may bind it
                    output = torch.empty(on_device[0].shape[0], on_device[0].shape[1], HEADS * HEAD_DIM,
                                         dtype=DTYPES[dtype], device=device)
                    got = kernel(*on_device, None, *attributes, out=[output, on_device[1], on_device[2]])
                else:
                    got = kernel(*on_device, None if mask is None else mask.to(device), *attributes)
            problem, error = compare(case, dtype, rounded, expected, got)
            worst = max(worst, error)
            if problem:
                return Row(name, FAIL, problem)
    return Row(name, PASS, f"{len(CASES)} cases x {len(seeds)} seeds, largest error {worst:.1e}")


def cuda_graph(step):
    """Capture `step` in a CUDA graph (after a warm-up off the capture, as torch.cuda.graph asks);
    returns the replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        step()

    def replay():
        graph.replay()
        torch.cuda.synchronize()

    return replay


def check_kernel_in_graph(dtype: str, kernel=attention_kernel, device: str = "cuda", capture=cuda_graph) -> Row:
    """Capture the kernel on one decode batch, replay it on another with the same shapes (other
    lengths, other data) and compare with the reference: the kernel is capture-safe."""
    name = f"attention kernel in a CUDA graph, {device}, {dtype}"
    first, _ = case_inputs("ragged decode", 0)
    second, _ = case_inputs("ragged decode", 5)
    second[3] = torch.tensor([3, 20, 0, 9], dtype=torch.int32)  # other past lengths, same shapes
    second[5] = second[3][:, None].clone()
    static = [t.to(device, copy=True) for t in _rounded(first, DTYPES[dtype])]
    outputs = [torch.empty(4, 1, HEADS * HEAD_DIM, dtype=DTYPES[dtype], device=device),
               torch.empty_like(static[1]), torch.empty_like(static[2])]
    try:
        replay = capture(lambda: kernel(*static, None, HEADS, KV_HEADS, SCALE, out=outputs))
    except Exception as error:  # noqa: BLE001
        text = str(error).strip().splitlines()
        return Row(name, FAIL, f"capture failed: {text[0] if text else type(error).__name__}")
    rounded = _rounded(second, DTYPES[dtype])
    for target, value in zip(static, rounded):
        target.copy_(value)
    replay()
    expected = attention(*[t.float() if t.is_floating_point() else t for t in rounded], None,
                         HEADS, KV_HEADS, SCALE)
    problem, error = compare("replay on new data", dtype, rounded, expected, outputs)
    return Row(name, FAIL, problem) if problem else Row(name, PASS, f"replayed on new data, error {error:.1e}")


def guarded(name: str, check, *args) -> Row:
    """A check's row; an exception it raises is a failure of that row, not of the script."""
    try:
        return check(*args)
    except Exception as error:  # noqa: BLE001
        text = str(error).strip().splitlines()
        return Row(name, FAIL, f"{type(error).__name__}: {text[0] if text else ''}"[:300])


VISION_SEGMENTS = (1, 7, 64, 33, 256)  # ragged images / windows of one request


def check_vision_kernel(device: str, dtype: str) -> Row:
    """The vision attention plugin's kernel (plugins/vision_attention.py) on `device` against the op's
    float32 reference on the cpu, over ragged segments."""
    from trt_llm.plugins.vision_attention import vision_attention_kernel

    name = f"vision attention kernel, {device}, {dtype}"
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(sum(VISION_SEGMENTS), 4, 16, generator=generator).to(DTYPES[dtype]) for _ in range(3))
    cu = torch.tensor([0, *itertools.accumulate(VISION_SEGMENTS)], dtype=torch.int32)
    expected = torch.ops.trt_llm.vision_attention(q.float(), k.float(), v.float(), cu, 0.25)
    got = vision_attention_kernel(q.to(device), k.to(device), v.to(device), cu.to(device), 0.25).float().cpu()
    error = float((got - expected).abs().max())
    tolerance = 1e-4 if dtype == "fp32" else 3e-2
    status = PASS if error <= tolerance else FAIL
    return Row(name, status, f"{len(VISION_SEGMENTS)} segments, error {error:.1e} (tolerance {tolerance:g})")


def check_cross_kernel(device: str, dtype: str) -> Row:
    """The cross-attention plugin's kernel (plugins/cross_attention.py: Whisper's decoder over the
    encoder's keys and values) on `device` against the op's float32 reference on the cpu: a ragged
    prefill width and a decode step over Whisper's 1,500 frames."""
    from trt_llm.plugins.cross_attention import cross_attention_kernel

    name = f"cross attention kernel, {device}, {dtype}"
    generator = torch.Generator().manual_seed(0)
    worst = 0.0
    for batch, seq in ((3, 4), (5, 1)):
        q = torch.randn(batch, seq, 6 * 64, generator=generator).to(DTYPES[dtype])
        key, value = (torch.randn(batch, 6, 1500, 64, generator=generator).to(DTYPES[dtype]) for _ in range(2))
        expected = torch.ops.trt_llm.cross_attention(q.float(), key.float(), value.float(), 6, 0.125)
        got = cross_attention_kernel(q.to(device), key.to(device), value.to(device), 6, 0.125).float().cpu()
        worst = max(worst, float((got - expected).abs().max()))
    tolerance = 1e-4 if dtype == "fp32" else 3e-2
    return Row(name, PASS if worst <= tolerance else FAIL, f"2 shapes, error {worst:.1e} (tolerance {tolerance:g})")


def kernel_rows(dtypes=tuple(DTYPES)) -> list[Row]:
    rows = [guarded(f"attention kernel, cpu, {d}", check_kernel, "cpu", d) for d in dtypes]
    rows += [guarded(f"vision attention kernel, cpu, {d}", check_vision_kernel, "cpu", d) for d in dtypes]
    rows += [guarded(f"cross attention kernel, cpu, {d}", check_cross_kernel, "cpu", d) for d in dtypes]
    if not torch.cuda.is_available():
        why = NO_CUDA if torch.version.cuda else f"{NO_CUDA} (torch {torch.__version__} is a CPU build)"
        rows += [Row(f"attention kernel, cuda, {d}", SKIP, why) for d in dtypes]
        rows += [Row(f"attention kernel in a CUDA graph, cuda, {d}", SKIP, why) for d in dtypes]
        rows += [Row(f"vision attention kernel, cuda, {d}", SKIP, why) for d in dtypes]
        rows += [Row(f"cross attention kernel, cuda, {d}", SKIP, why) for d in dtypes]
        return rows
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here
    rows += [guarded(f"attention kernel, cuda, {d}", check_kernel, "cuda", d) for d in dtypes]
    rows += [guarded(f"attention kernel in a CUDA graph, cuda, {d}", check_kernel_in_graph, d) for d in dtypes]
    rows += [guarded(f"vision attention kernel, cuda, {d}", check_vision_kernel, "cuda", d) for d in dtypes]
    rows += [guarded(f"cross attention kernel, cuda, {d}", check_cross_kernel, "cuda", d) for d in dtypes]
    return rows


# --- 2, 3. engines on the GPU backends vs the cpu backend ----------------------------------------

GPU_BACKENDS = ("tensorrt", "tensorrt-rtx")
BUILD = "import sys; from trt_llm.build.cli import main; sys.exit(main())"
RUN = "import sys; from trt_llm.runtime.app.run_cli import main; sys.exit(main())"
GRAPH_EVIDENCE = {"tensorrt": "CUDA graph captured", "tensorrt-rtx": "TensorRT-RTX whole-graph capture"}
GRAPH_FAILURE = "CUDA graph capture failed"


def input_file(eos_id: int) -> dict:
    """Two batches (4 + 2), ragged prompts; one row ends after its first token (the batch shrinks)."""
    def user(text: str, **extra) -> dict:
        return {"messages": [{"role": "user", "content": text}], **extra}

    return {"batch_size": 4, "temperature": 0.0, "max_generate_length": 24, "requests": [
        user("What is the capital of France?"),
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "Why is the sky blue? Tell me in some detail, please."}]},
        user("Hi", logit_bias={str(eos_id): 100.0}),
        user("Write a haiku about the sea."),
        user("Count from one to ten."),
        user("Name a colour."),
    ]}


def _tail(text: str, lines: int = 3) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-600:]


class EngineCheck:
    def __init__(self, work: Path, family: str, dtype: str, has_cuda: bool):
        self.work, self.family, self.dtype, self.has_cuda = work, family, dtype, has_cuda
        self._model: Path | None = None
        self._reference: dict | None = None
        self.rows: list[Row] = []

    def model(self) -> Path:
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tiny model is made here, never fetched
            os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
            import assets
            from transformers.utils import logging as transformers_logging

            transformers_logging.disable_progress_bar()
            self._model = assets.make_tiny_model(self.family, self.work / f"tiny-{self.family}")
            config = json.loads((self._model / "generation_config.json").read_text())
            eos = config["eos_token_id"]
            eos = eos[0] if isinstance(eos, list) else eos
            (self.work / "input.json").write_text(json.dumps(input_file(eos), indent=1))
        return self._model

    def build(self, backend: str, name: str | None = None, draft: bool = False) -> tuple[Path | None, str]:
        """(the engine directory, or None; the build's time or what went wrong). draft: with a random
        EAGLE3 draft (speculation must still give the cpu backend's vanilla tokens)."""
        name = name or backend
        out = self.work / f"engine-{name}"
        config = self.work / f"{name}.yaml"
        text = (f"model: {self.model()}\noutput_dir: {out}\nbackend: {backend}\ndtype: {self.dtype}\n"
                "max_batch_size: 4\nmax_input_len: 128\nmax_kv_cache_capacity: 256\n")
        if draft:
            import assets

            folder = self.work / "random-draft"
            if not folder.is_dir():
                assets.make_random_draft(self.model(), folder)
            text += f"draft: {{model: {folder}, max_draft_tree_size: 60, max_verify_tree_size: 60, quantization: none}}\n"
        config.write_text(text)
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", BUILD, str(config), "--quiet"], capture_output=True, text=True,
                              timeout=3600)
        if done.returncode != 0:
            return None, f"trt-llm-build exit {done.returncode}: {_tail(done.stderr)}"
        return out, f"{time.perf_counter() - started:.0f} s"

    def run(self, engine: Path, graphs: bool | None) -> tuple[dict | None, str, str]:
        """(request index -> output token ids, or None; what went wrong; stderr)."""
        self.model()  # which also writes input.json
        output = self.work / f"out-{engine.name}-{'graphs' if graphs else 'plain'}.json"
        env = dict(os.environ)
        if graphs is not None:
            env["TRT_LLM_CUDA_GRAPHS"] = "1" if graphs else "0"
        done = subprocess.run([sys.executable, "-c", RUN, str(self.work / "input.json"), "--engine-dir", str(engine),
                               "-o", str(output), "-v"], capture_output=True, text=True, timeout=1800, env=env)
        if done.returncode != 0:
            return None, f"trt-llm-run exit {done.returncode}: {_tail(done.stderr)}", done.stderr
        responses = json.loads(output.read_text())["responses"]
        return {r["request_idx"]: r["output_token_ids"] for r in responses}, "", done.stderr

    def reference(self) -> dict | None:
        """The cpu backend's tokens (built and run once)."""
        if self._reference is None:
            engine, detail = self.build("cpu", "cpu-reference")
            self.rows.append(Row("cpu backend (reference): build", PASS if engine else FAIL, detail))
            if engine is None:
                self._reference = {}
                return None
            tokens, problem, _ = self.run(engine, None)
            self.rows.append(Row("cpu backend (reference): run", PASS if tokens else FAIL,
                                 problem or f"{len(tokens)} requests, {sum(map(len, tokens.values()))} tokens"))
            self._reference = tokens or {}
        return self._reference or None

    def backend(self, backend: str, module=None) -> None:
        """Build, run with graphs off and on, compare with the cpu backend. module: the backend's
        Python module (default: import it; its absence skips the rows)."""
        from trt_llm.common.trt_import import BackendUnavailable, import_tensorrt

        checks = [f"{backend}: build", f"{backend}: run, CUDA graphs off", f"{backend}: run, CUDA graphs on",
                  f"{backend}: EAGLE3 build", f"{backend}: EAGLE3 run, speculation equals vanilla"]
        try:
            module = module or import_tensorrt(backend)
        except BackendUnavailable as error:
            self.rows += [Row(check, SKIP, str(error)) for check in checks]
            return
        if backend == "tensorrt" and not self.has_cuda:
            self.rows += [Row(check, SKIP, f"{NO_CUDA} (TensorRT builds on the GPU)") for check in checks]
            return
        engine, detail = self.build(backend)
        self.rows.append(Row(checks[0], PASS if engine else FAIL,
                             f"{module.__name__} {getattr(module, '__version__', '?')}, {detail}"))
        eagle, eagle_detail = self.build(backend, f"{backend}-eagle", draft=True)
        self.rows.append(Row(checks[3], PASS if eagle else FAIL, eagle_detail))
        runs = [(checks[1], False, engine), (checks[2], True, engine), (checks[4], None, eagle)]
        expected = self.reference() if self.has_cuda else None
        for check, graphs, built in runs:
            if built is None or not self.has_cuda:
                self.rows.append(Row(check, SKIP, "no engine" if built is None else NO_CUDA))
                continue
            if expected is None:
                self.rows.append(Row(check, FAIL, "no cpu reference to compare with"))
                continue
            tokens, problem, log = self.run(built, graphs)
            if tokens is None:
                self.rows.append(Row(check, FAIL, problem))
                continue
            difference = token_difference(expected, tokens)
            if difference:
                self.rows.append(Row(check, FAIL, difference))
            elif graphs and GRAPH_FAILURE in log:
                line = next(line for line in log.splitlines() if GRAPH_FAILURE in line)
                self.rows.append(Row(check, FAIL, f"tokens equal, but graphs fell back: {line[-300:]}"))
            elif graphs and GRAPH_EVIDENCE.get(backend, GRAPH_EVIDENCE["tensorrt"]) not in log:
                evidence = GRAPH_EVIDENCE.get(backend, GRAPH_EVIDENCE["tensorrt"])
                self.rows.append(Row(check, FAIL, f"tokens equal, but the log shows no {evidence!r}"))
            else:
                captured = log.count("CUDA graph captured")
                self.rows.append(Row(check, PASS, f"tokens equal to cpu ({sum(map(len, tokens.values()))})"
                                     + (f", {captured} graphs captured" if graphs and captured else "")))


def token_difference(expected: dict, got: dict) -> str | None:
    """Where two runs' output tokens first differ, or None."""
    for index in sorted(set(expected) | set(got)):
        a, b = expected.get(index), got.get(index)
        if a == b:
            continue
        if a is None or b is None:
            return f"request {index}: missing in one run"
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return (f"request {index} differs at token {at}: cpu {a[at:at + 3]}..., got {b[at:at + 3]}... "
                f"(lengths {len(a)} / {len(b)})")
    return None


def engine_rows(work: Path, family: str, dtype: str) -> list[Row]:
    from trt_llm.common.trt_import import cuda_device_count

    check = EngineCheck(work, family, dtype, cuda_device_count()[0] > 0)
    for backend in GPU_BACKENDS:
        check.backend(backend)
    return check.rows


# --- the report ----------------------------------------------------------------------------------


def environment() -> str:
    from trt_llm.common.trt_import import cuda_device_count

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    count, why = cuda_device_count()
    versions = []
    for module in ("tensorrt", "tensorrt_rtx"):
        try:
            versions.append(f"{module} {__import__(module).__version__}")
        except Exception:  # noqa: BLE001 - a stub or a missing library
            versions.append(f"{module} -")
    return (f"torch {torch.__version__}, CUDA device: {device or (f'{count} (cudart)' if count else why or 'none')}, "
            + ", ".join(versions))


def table(rows: list[Row]) -> str:
    width = max(len(r.check) for r in rows)
    lines = [f"{'status':6}  {'check':{width}}  detail"]
    lines += [f"{r.status:6}  {r.check:{width}}  {r.detail}" for r in rows]
    counts = {status: sum(r.status == status for r in rows) for status in (PASS, FAIL, SKIP)}
    lines.append(f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the rows here (JSON)")
    parser.add_argument("--work-dir", help="build models and engines here and keep them (default: a temporary folder)")
    parser.add_argument("--family", default="qwen3", choices=("llama", "qwen2", "qwen3"), help="tiny model family")
    parser.add_argument("--engine-dtype", default="fp32", choices=("fp32", "fp16"),
                        help="engine precision (fp32: tokens must equal the cpu backend's)")
    parser.add_argument("--kernels-only", action="store_true", help="only the attention kernel rows")
    args = parser.parse_args(argv)

    print(f"trt-llm GPU check: {environment()}", flush=True)
    rows = kernel_rows()
    if not args.kernels_only:
        work = Path(args.work_dir or tempfile.mkdtemp(prefix="trt-llm-gpu-check-"))
        work.mkdir(parents=True, exist_ok=True)
        try:
            rows += engine_rows(work, args.family, args.engine_dtype)
        finally:
            if not args.work_dir:
                shutil.rmtree(work, ignore_errors=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": environment(), "rows": [asdict(r) for r in rows]},
                                              indent=1) + "\n")
    return 1 if any(r.status == FAIL for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
