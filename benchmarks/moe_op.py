#!/usr/bin/env python
"""The MoE op (plugins/moe.py) on ONNX Runtime against transformers' Qwen3MoeSparseMoeBlock, at
Qwen3-30B-A3B's widths (hidden 2048, 128 experts, top 8, expert width 768), in one interleaved run.

    python benchmarks/moe_op.py            # 2 threads, 20 repetitions: about 3 minutes, up to 21 GB of memory
    python benchmarks/moe_op.py --smoke    # tiny widths, seconds: checks the plumbing

Part 1, the lowering's kernels (one layer): ONNX Runtime's com.microsoft.MoE (fp32) and our
MixtureOfExperts, which the runtime swaps in for it (runtime/backends/cpu_kernels/moe.c) / QMoE (int4 in
blocks of 128, the build's default, at accuracy levels 0 and 4; int8 in blocks of 32, the cpu default)
at 1 and 8 tokens (decode) and a 64-token prefill. (The op's function body, which they were chosen
against on 2026-12-02, no longer loads in this hand-made graph under ONNX Runtime 1.32.) Part 1 repeats
one input, so its chosen experts stay in the cache: its 1-token rows are cache speed, part 2's are not. Part 2: two blocks in sequence, decode (one token per row) at
batch 1 and 8: our op on ONNX Runtime (fp32 on our MixtureOfExperts, as the runtime runs it, and on
ONNX Runtime's MoE; int4) against transformers' block in eager torch, both
its experts implementations (grouped_mm is what from_pretrained picks; eager is its loop).

Each setting runs every implementation in turn, repetition after repetition, a turn being an untimed
call and BURST timed ones (interleaved_medians: on 2 cores, back-to-back calls of different
implementations shared the cores with the last one's spinning threads); part 2 gives every call a new
input. The medians and the ratios are reported. The ONNX graphs are what the export and
compile_cpu make of SparseMoe (a router MatMul, then the op's node with its function body; lowered
by plugins.moe.lower_for_onnxruntime), written by hand so that the weights stay in memory: every
session reads the same buffers (add_external_initializers), no copy on disk. Every implementation is
checked against the torch op before it is timed. Writes moe_op.json into --out-dir and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trt_llm.build.models.moe import SparseMoe  # noqa: E402
from trt_llm.build.quantize import QuantSpec  # noqa: E402
from trt_llm.plugins import moe as moe_op  # noqa: E402
from trt_llm.runtime.backends import cpu_kernels  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out-dir", type=Path, default=REPO / "out" / "bench")
    p.add_argument("--parts", default="1,2", help="which parts to run (1: one layer's implementations, 2: against transformers)")
    p.add_argument("--smoke", action="store_true", help="hidden 64, 8 experts, top 2, width 32, 3 repetitions")
    args = p.parse_args(argv)
    args.parts = {int(n) for n in args.parts.split(",")}
    args.widths = dict(hidden=64, experts=8, top_k=2, width=32) if args.smoke else dict(
        hidden=2048, experts=128, top_k=8, width=768)
    if args.smoke and args.reps == p.get_default("reps"):
        args.reps = 3
    return args


def hf_block(widths: dict, seed: int, implementation: str):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    config = Qwen3MoeConfig(hidden_size=widths["hidden"], num_experts=widths["experts"],
                            num_experts_per_tok=widths["top_k"], moe_intermediate_size=widths["width"],
                            norm_topk_prob=True)  # Qwen3-30B-A3B's
    config._experts_implementation = implementation
    torch.manual_seed(seed)
    block = Qwen3MoeSparseMoeBlock(config).eval().requires_grad_(False)
    for parameter in block.parameters():
        parameter.normal_(std=0.02)
    return block


class Graph:
    """A chain of SparseMoe layers as ONNX: per layer a router MatMul and the op's node, its
    weights external initializers bound to the module's own buffers."""

    def __init__(self, layers: list[SparseMoe], lowered: bool, accuracy_level: int | None = None):
        nodes, initializers, self.buffers = [], [], {}
        value = "x"
        for i, layer in enumerate(layers):
            names = {"router_t": layer.router.detach().t().contiguous(), "gate_up": layer.gate_up, "down": layer.down}
            if layer.bits:
                names |= {"gate_up_scales": layer.gate_up_scales, "down_scales": layer.down_scales}
            for name, tensor in names.items():
                array = tensor.detach().contiguous().numpy()
                self.buffers[f"l{i}.{name}"] = array
                initializers.append(external(f"l{i}.{name}", array))
            nodes.append(helper.make_node("MatMul", [value, f"l{i}.router_t"], [f"l{i}.logits"]))
            inputs = [value, f"l{i}.logits", f"l{i}.gate_up"] + (
                [f"l{i}.gate_up_scales", f"l{i}.down", f"l{i}.down_scales"] if layer.bits else [f"l{i}.down"])
            attributes = dict(top_k=layer.top_k, normalize=layer.normalize, plugin_namespace=moe_op.PLUGIN_NAMESPACE)
            if layer.bits:
                attributes["bits"] = layer.bits
            value = f"l{i}.y" if i < len(layers) - 1 else "y"
            nodes.append(helper.make_node(moe_op.QUANTIZED_OP_NAME if layer.bits else moe_op.OP_NAME, inputs, [value],
                                          name=f"l{i}.moe", domain=moe_op.DOMAIN, **attributes))
        hidden = layers[0].router.shape[1]
        graph = helper.make_graph(nodes, "moe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", hidden])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", hidden])], initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(moe_op.DOMAIN, 1)],
                                  functions=moe_op.function_protos())
        if lowered:
            moe_op.lower_for_onnxruntime(model)
            if accuracy_level is not None:
                for node in model.graph.node:
                    if node.op_type == "QMoE":
                        next(a for a in node.attribute if a.name == "accuracy_level").i = accuracy_level
        self.kernels = sorted({n.op_type for n in model.graph.node if n.op_type not in ("MatMul", "Constant", "Reshape",
                                                                                         "Squeeze", "Softmax")})
        self.model = model

    def session(self, threads: int, ours: bool = False) -> ort.InferenceSession:
        """ours: the lowered graph as the runtime opens it (cpu_kernels.adopt: a float MoE on our
        MixtureOfExperts), else as written (ONNX Runtime's MoE / QMoE)."""
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.log_severity_level = 3
        # Each session's worker threads would spin on after its run, on the cores the next implementation
        # runs on (see interleaved_medians): stopped at the end of every run.
        options.add_session_config_entry("session.force_spinning_stop", "1")
        names = list(self.buffers)
        options.add_external_initializers(names, [ort.OrtValue.ortvalue_from_numpy(self.buffers[n]) for n in names])
        graph = self.model.SerializeToString()
        if ours:
            graph = cpu_kernels.adopt(graph, options, REPO)
            if b"MixtureOfExperts" not in graph:
                raise SystemExit(f"our MoE kernel is not used here: {cpu_kernels.describe()}")
        session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        session.keep = options  # the OrtValues live as long as the session reads them
        return session


def external(name: str, array: np.ndarray) -> onnx.TensorProto:
    """An initializer whose data the session is handed in memory (add_external_initializers)."""
    tensor = onnx.TensorProto(name=name, data_type=onnx.helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape,
                              data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "in-memory.bin"), ("offset", "0"), ("length", str(array.nbytes))):
        tensor.external_data.add(key=key, value=value)
    return tensor


def torch_reference(layers: list[SparseMoe], x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        for layer in layers:
            x = layer(x)
    return x


BURST = 3  # timed calls of one implementation in a row, after an untimed one


def interleaved_medians(runs: dict, inputs: dict[str, list], reps: int) -> dict[str, dict[str, float]]:
    """{setting: {implementation: median ms}}; within a setting the implementations take turns, each turn an
    untimed call and BURST timed ones, the k-th call of a turn on the setting's k-th input (cycled: every
    implementation sees the same inputs in the same order). On 2 cores the implementation before would
    otherwise share the cores: ONNX Runtime's worker threads spin on for over 20 ms after a run, torch's
    OpenMP threads for a few.
    Measured on 2 layers at batch 1, one call a turn: ours 14-15 ms, transformers eager 40-42 ms; with a
    100 ms pause before each call, 11 and 23-24 ms. Hence the sessions stop spinning at the end of each run
    (Graph.session) and the untimed call takes the cores back from torch; a pause instead would time calls
    that start on idle cores, which slows the short ones most (int4 at 2 ms: 5.4)."""
    result = {}
    for setting, xs in inputs.items():
        names = [n for n in runs if runs[n].get(setting) is not None]
        times = {n: [] for n in names}
        for _ in range(reps):
            for n in names:
                runs[n][setting](xs[0])  # (untimed)
                for k in range(1, BURST + 1):
                    start = time.perf_counter()
                    runs[n][setting](xs[k % len(xs)])
                    times[n].append((time.perf_counter() - start) * 1e3)
        result[setting] = {n: statistics.median(t) for n, t in times.items()}
        print(f"  {setting}: " + ", ".join(f"{n} {m:.2f} ms" for n, m in result[setting].items()), flush=True)
    return result


def ort_runner(session):
    return lambda x: session.run(None, {"x": x.numpy()})[0]


def check(name: str, got: np.ndarray, expected: torch.Tensor, tolerance: float) -> None:
    error = float(np.abs(got - expected.numpy()).max() / expected.abs().max())
    if error > tolerance:
        raise SystemExit(f"{name}: off the torch op by {error:.2e} of its largest value")


def rss_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 2**20
    return 0.0


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    w = args.widths
    hidden = w["hidden"]
    generator = torch.Generator().manual_seed(0)
    tokens = {f"{t} tokens": torch.randn(1, t, hidden, generator=generator) for t in (1, 8, 64)}
    decode = {f"batch {b}": torch.randn(b, 1, hidden, generator=generator) for b in (1, 8)}
    report = {"widths": w, "threads": args.threads, "reps": args.reps, "onnxruntime": ort.__version__,
              "torch": torch.__version__, "cpu": platform.processor() or platform.machine()}

    print("building two layers", flush=True)
    blocks = [hf_block(w, seed, "grouped_mm") for seed in (1, 2)]
    fp32 = [SparseMoe.from_hf(b, None) for b in blocks]
    group = 32 if args.smoke else 128  # smoke: I = 32
    int4 = [SparseMoe.from_hf(b, QuantSpec(4, group)) for b in blocks]
    int8 = [SparseMoe.from_hf(blocks[0], QuantSpec(8, 32))] if 1 in args.parts else []
    print(f"  resident {rss_gb():.1f} GB", flush=True)

    # Part 1: one layer, the body against the kernels.
    body_tokens = {"1 tokens", "8 tokens"}  # 64 tokens: the body would gather 512 experts' weights (9.6 GB fp32)
    part1 = {}
    for label, layers, tolerance, variants in () if 1 not in args.parts else (
        # The function bodies (the lowering's first choice against the kernels, 2026-12-02) no longer load in this
        # hand-made graph (ONNX Runtime 1.32 refuses their attribute-referencing Constant outside an export): the
        # kernels are what runs.
        ("fp32", fp32[:1], 1e-4, [("MoE", True, None), ("ours (MixtureOfExperts)", True, None)]),
        (f"int4 g{group}", int4[:1], 1e-4, [("QMoE level 0", True, 0), ("QMoE level 4", True, 4)]),
        ("int8 g32", int8, 5e-2, [("QMoE", True, None)]),
    ):
        runs = {}
        for name, lowered, level in variants:
            graph = Graph(layers, lowered, level)
            session = graph.session(args.threads, ours=name.startswith("ours"))
            runs[name] = {}
            for setting, x in tokens.items():
                if name == "body" and setting not in body_tokens and not args.smoke:
                    continue
                got = session.run(None, {"x": x.numpy()})[0]
                # int4 level 4 and int8 round the activations to int8: within their rounding
                check(f"{label} {name} {setting}", got, torch_reference(layers, x),
                      5e-2 if level == 4 else tolerance)
                runs[name][setting] = ort_runner(session)
            print(f"  {label} {name}: {graph.kernels}, resident {rss_gb():.1f} GB", flush=True)
        print(f"part 1, {label}", flush=True)
        part1[label] = interleaved_medians(runs, {s: [x] for s, x in tokens.items()}, args.reps)
        del runs
    report["part1_one_layer_ms"] = part1

    # Part 2: two layers, decode, ours against transformers.
    def hf_runner(implementation):
        def run(x):
            for block in blocks:  # the same weights, either experts implementation
                block.experts.config._experts_implementation = implementation
            with torch.no_grad():
                return blocks[1](blocks[0](x))
        return run

    for implementation in ("grouped_mm", "eager"):
        for x in decode.values():
            check("the torch op", torch_reference(fp32, x).numpy(), hf_runner(implementation)(x), 1e-4)
    sessions = {"ours fp32 (MixtureOfExperts)": Graph(fp32, True).session(args.threads, ours=True),
                "ours fp32 (MoE)": Graph(fp32, True).session(args.threads),
                f"ours int4 g{group} (QMoE)": Graph(int4, True).session(args.threads)}
    first_int4 = Graph(int4[:1], True).session(args.threads)
    for x in decode.values():
        for name in ("ours fp32 (MixtureOfExperts)", "ours fp32 (MoE)"):
            check(name, sessions[name].run(None, {"x": x.numpy()})[0], torch_reference(fp32, x), 1e-4)
        # int4 at QMoE's accuracy level 4 rounds the activations to int8: within that rounding, one layer
        # (random blocks chained without a residual make the second layer's routing near-ties, which
        # that rounding flips)
        check("ours int4", first_int4.run(None, {"x": x.numpy()})[0], torch_reference(int4[:1], x), 5e-2)
    del first_int4

    runs = {name: {s: ort_runner(session) for s in decode} for name, session in sessions.items()}
    runs["transformers grouped_mm"] = {s: hf_runner("grouped_mm") for s in decode}
    runs["transformers eager"] = {s: hf_runner("eager") for s in decode}
    print(f"part 2, two layers, decode (resident {rss_gb():.1f} GB)", flush=True)
    # each call a new input, as each decode step's token is routed anew (part 1 repeats one on purpose)
    steps = {s: [x] + [torch.randn(x.shape, generator=generator) for _ in range(BURST)] for s, x in decode.items()}
    part2 = interleaved_medians(runs, steps, args.reps)
    report["part2_two_layers_decode_ms"] = part2
    ratios = {}
    for setting, medians in part2.items():
        best_hf = min(medians["transformers grouped_mm"], medians["transformers eager"])
        ratios[setting] = {name: best_hf / medians[name] for name in sessions}
    report["part2_speedup_over_best_transformers"] = ratios

    lines = [f"MoE op, widths {w}, {args.threads} threads, {args.reps} repetitions interleaved, medians (ms)", "",
             "part 1: one layer"]
    for label, table in part1.items():
        for setting, medians in table.items():
            lines.append(f"  {label:10s} {setting:10s} " + "  ".join(f"{n} {m:8.2f}" for n, m in medians.items()))
    lines += ["", "part 2: two layers in sequence, decode (one token per row)"]
    for setting, medians in part2.items():
        lines.append(f"  {setting:8s} " + "  ".join(f"{n} {m:8.2f}" for n, m in medians.items()))
        lines.append("           speedup over the faster transformers: " + "  ".join(
            f"{n} {r:.2f}x" for n, r in ratios[setting].items()))
    text = "\n".join(lines)
    print("\n" + text)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    report["table"] = text
    (args.out_dir / "moe_op.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
