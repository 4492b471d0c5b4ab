"""Measuring tools: thread pinning, read bandwidth, the matmul floor, weight bytes, other processes' CPU,
timed builds; what a report records of the machine and the checkout."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

CLEAN_LOAD = 0.3  # cores used by other processes below which a timed run counts as undisturbed
REPO = Path(__file__).resolve().parents[2]


def cpu_name() -> str:
    """The CPU's model name, for a report."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_head() -> str | None:
    """This checkout's commit, "-dirty" when the tree has changes (other sessions' edits included)."""
    done = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return done.stdout.strip() or None


def sha256(path: Path) -> str:
    """A file's SHA-256 (what a report records of a model file it ran)."""
    import hashlib

    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def free_port() -> int:
    """A loopback port free now, for a server that must be given a number (a subprocess, Ray's proxy)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def smoke_defaults(parser, args, values: dict) -> None:
    """--smoke's settings, for each option the command line left at its default."""
    for name, value in values.items():
        if getattr(args, name) == parser.get_default(name):
            setattr(args, name, value)


def engine_list(parser, spec: str, known) -> list[str]:
    """--engines' comma-separated names, each one of `known` (else the parser's one-line error)."""
    names = [e.strip() for e in spec.split(",") if e.strip()]
    if set(names) - set(known):
        parser.error(f"unknown engines: {', '.join(sorted(set(names) - set(known)))}")
    return names


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pin_threads(threads: int) -> None:
    """Before torch / numpy are imported: their OpenMP / MKL / OpenBLAS pools read these once."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def read_bandwidth(threads: int, mbytes: int = 512, repeats: int = 7) -> dict:
    """Read bandwidth in bytes/s over `mbytes` of fp32 (about one model's weights, beyond the caches),
    best of `repeats`, three ways: torch x.sum(), torch matrix-vector (x @ v) and numpy/BLAS
    vector-matrix (v @ x, the decode step's GEMV). The limit uses the fastest: a kernel that only
    sums can be slower than the memory system."""
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(max(1, mbytes * 2**20 // 4 // 576), 576, dtype=torch.float32)
    v = torch.ones(576, dtype=torch.float32)
    xn = x.numpy().reshape(576, -1)  # same memory, BLAS sgemv streams it row by row
    vn = np.ones((1, 576), dtype=np.float32)
    out = {}
    for name, fn in (("torch_sum", x.sum), ("torch_gemv", lambda: torch.mv(x, v)),
                     ("numpy_gemv", lambda: vn @ xn)):
        fn()
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        out[name] = x.numel() * 4 / best
    return out


def matmul_floor(engine_graph: Path, threads: int, repeats: int = 7, runs: int = 10) -> dict:
    """The decode step's matmuls alone: every MatMul of the engine graph whose weight is an initializer,
    with those very weights, each fed one row ([1, K], M = 1 as in batch-1 decoding), run one after
    another by ONNX Runtime with `threads` threads. Its time per pass is what a batch-1 step costs
    before attention, norms and everything else: an engine on these kernels decodes at most about this
    fast (one measurement: on a shared machine it moves as the timed runs do).
    Returns ms per pass (best of `repeats` means over `runs`), the matmul count and weight bytes."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import helper

    model = onnx.load(str(engine_graph), load_external_data=False)
    initializers = {t.name: t for t in model.graph.initializer}
    weights = [initializers[n.input[1]] for n in model.graph.node
               if n.op_type == "MatMul" and n.input[1] in initializers and len(initializers[n.input[1]].dims) == 2]
    dtype = weights[0].data_type
    widths = sorted({int(w.dims[0]) for w in weights})
    nodes, sums = [], []
    for i, w in enumerate(weights):
        nodes += [helper.make_node("MatMul", [f"x{w.dims[0]}", w.name], [f"y{i}"]),
                  helper.make_node("ReduceSum", [f"y{i}"], [f"s{i}"], keepdims=0)]
        sums.append(f"s{i}")
    nodes.append(helper.make_node("Sum", sums, ["total"]))
    graph = helper.make_graph(nodes, "matmul_floor",
                              [helper.make_tensor_value_info(f"x{k}", dtype, [1, k]) for k in widths],
                              [helper.make_tensor_value_info("total", dtype, [])], weights)
    chain = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    # Loaded from bytes, reading the engine's own weight file in place.
    options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                     str(engine_graph.parent))
    session = ort.InferenceSession(chain.SerializeToString(), options, providers=["CPUExecutionProvider"])
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    feeds = {f"x{k}": np.full((1, k), 0.01, dtype=np_dtype) for k in widths}
    for _ in range(3):
        session.run(None, feeds)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(runs):
            session.run(None, feeds)
        best = min(best, (time.perf_counter() - start) / runs)
    size = np.dtype(np_dtype).itemsize
    return {"ms_per_step": best * 1000, "matmuls": len(weights),
            "weight_bytes": int(sum(int(np.prod(w.dims)) * size for w in weights))}


def onnx_weight_bytes(path: Path) -> int:
    """Bytes of all initializers of an ONNX graph = weights streamed per decode step."""
    import numpy as np
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    total = 0
    for init in model.graph.initializer:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
        total += int(np.prod(init.dims, dtype=np.int64)) * itemsize
    return total


def checkpoint_weight_bytes(model_dir: Path) -> int:
    """An HF checkpoint's tensors in fp32 (a tied LM head counted once)."""
    import numpy as np
    from safetensors import safe_open

    total = 0
    for file in Path(model_dir).glob("*.safetensors"):
        with safe_open(str(file), "np") as f:
            for key in f.keys():
                total += int(np.prod(f.get_slice(key).get_shape(), dtype=np.int64)) * 4
    return total


def gguf_weight_bytes(path: Path) -> int:
    """Bytes of a GGUF file's tensor data (quantized blocks as stored)."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors)


def run_timed(cmd: list[str], log_path: Path, env: dict | None = None) -> dict:
    """Run a build command to the end: wall seconds, its own peak RSS (MB) and exit status; its output
    goes to log_path. It starts from a small launcher (rusage_run.py): see there why."""
    import json

    log_path.parent.mkdir(parents=True, exist_ok=True)
    result = log_path.with_suffix(".rusage.json")
    result.unlink(missing_ok=True)
    launcher = Path(__file__).with_name("rusage_run.py")
    with open(log_path, "w") as out:
        done = subprocess.run([sys.executable, str(launcher), str(result), *cmd], stdout=out,
                              stderr=subprocess.STDOUT, env=env)
    if not result.is_file():
        return {"seconds": None, "peak_rss_mb": None, "returncode": done.returncode or 1}
    return json.loads(result.read_text())


def peak_rss_mb() -> float:
    """This process's peak RSS since it started (VmHWM: unlike ru_maxrss, not inherited across exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class BusyLoad:
    """The loaded mode: `processes` busy processes beside the engines, each a pure-CPU spinner (a Python
    `while True: pass`, no memory traffic to speak of, default priority, no pinning: the scheduler
    places them as it would any neighbour). They are this process's children, so LoadMeter does not
    count them as "other processes" (a run beside them can still be clean of *foreign* load); what they
    used is measured here, from their CPU times."""

    SPIN = "while True: pass"

    def __init__(self, processes: int):
        self.processes = processes
        self.procs: list[subprocess.Popen] = []

    def start(self) -> None:
        self.procs = [subprocess.Popen([sys.executable, "-c", self.SPIN], stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                      for _ in range(self.processes)]
        # Past the interpreter's start-up: every spinner has been on a core before the first timed run.
        deadline = time.perf_counter() + 5
        while self.procs and time.perf_counter() < deadline:
            if all((self._cpu(p) or 0) > 0 for p in self.procs):
                break
            time.sleep(0.05)

    @staticmethod
    def _cpu(proc: subprocess.Popen) -> float | None:
        """CPU seconds one spinner has used: /proc/PID/schedstat (nanoseconds), else /proc/PID/stat (ticks)."""
        try:
            with open(f"/proc/{proc.pid}/schedstat") as f:
                return int(f.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            pass
        try:
            with open(f"/proc/{proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def cpu_seconds(self) -> float | None:
        """CPU seconds all spinners have used so far (None without /proc)."""
        times = [self._cpu(p) for p in self.procs]
        return None if not self.procs or None in times else sum(times)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait()
        self.procs = []


class LoadMeter:
    """CPU used by other processes (in cores) while we run: the machine is shared, and a busy
    neighbour on 2 cores ruins a 2-thread run (most of all torch's OpenMP barriers). Our own
    process and its children (the engine workers) are not "other"."""

    def __init__(self):
        try:
            import psutil
        except ImportError:
            psutil = None
        self.psutil = psutil
        self.me = psutil.Process() if psutil else None

    def _ours(self) -> float:
        total = 0.0
        for proc in [self.me, *self.me.children(recursive=True)]:
            try:
                t = proc.cpu_times()
            except self.psutil.Error:
                continue
            total += t.user + t.system
        return total

    def snapshot(self):
        if self.psutil is None:
            return None
        t = self.psutil.cpu_times()
        busy = sum(t) - t.idle - getattr(t, "iowait", 0.0)
        return time.perf_counter(), busy, self._ours()

    def other_cores(self, before, after) -> float | None:
        if before is None or after is None:
            return None
        wall = after[0] - before[0]
        return max(0.0, ((after[1] - before[1]) - (after[2] - before[2])) / wall) if wall > 0 else None

    def wait_idle(self, max_wait: float, threshold: float = CLEAN_LOAD) -> float | None:
        """Wait (up to max_wait s) until other processes use < threshold cores; returns the last load."""
        if self.psutil is None or max_wait <= 0:
            return None
        deadline = time.perf_counter() + max_wait
        while True:
            before = self.snapshot()
            time.sleep(0.5)
            load = self.other_cores(before, self.snapshot())
            if load < threshold or time.perf_counter() >= deadline:
                return load


def lock_work_dir(work_dir: Path):
    """One benchmark per work directory at a time: another would rebuild what this one's engines load.
    Returns the open lock file (held until it is closed or the process ends)."""
    import fcntl

    lock = open(Path(work_dir) / ".lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log(f"another benchmark uses {work_dir}; waiting for it")
        fcntl.flock(lock, fcntl.LOCK_EX)
    return lock
