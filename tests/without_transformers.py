"""Run one of our command-line programs in a Python where `transformers` (and, when asked, `torch`)
cannot be imported.

The device of a two-stage deployment has no transformers: a meta-path finder makes any import of
it fail as if it were not installed, and the run reports which forbidden modules ended up loaded
(none, when the program is clean): the forbidden packages themselves, or the build's export-side
modules. `forbidden=("transformers", "torch")` also blocks torch: the cpu runtime (trt-llm-run,
trt-llm-eval, trt-llm-serve on a cpu engine) needs neither.
"""

import json
import subprocess
import sys

FORBIDDEN_PACKAGES = ("transformers",)
FORBIDDEN_MODULES = ("trt_llm.build.checkpoint", "trt_llm.build.models.layers", "trt_llm.build.models.llama",
                     "trt_llm.build.export",
                     "trt_llm.build.bundle", "trt_llm.build.eagle.model", "trt_llm.build.eagle.graph",
                     "trt_llm.build.eagle.formats", "trt_llm.build.eagle.stage")
MARKER = "FORBIDDEN-MODULES-LOADED "

_WRAPPER = """
import importlib, json, signal, sys

# SIGTERM (how a test stops a server) ends the program through its `finally`, so it still reports:
# uvicorn shuts down on it and then raises it again, which by default would kill the process first.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))

PACKAGES = tuple(json.loads(sys.argv[1]))
MODULES = {modules!r}

class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in PACKAGES:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)
        return None

sys.meta_path.insert(0, _Blocked())
module, *argv = sys.argv[2:]
try:
    code = importlib.import_module(module).main(argv)
finally:
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in PACKAGES or m in MODULES)
    print({marker!r} + json.dumps(loaded), file=sys.stderr, flush=True)
sys.exit(code)
""".format(modules=FORBIDDEN_MODULES, marker=MARKER)


def command(module: str, *argv: str, forbidden: tuple[str, ...] = FORBIDDEN_PACKAGES) -> list[str]:
    """The command line that runs `module`'s main(argv) with the `forbidden` packages blocked (for a
    caller that starts it itself, e.g. a server; `loaded` reads its report from the stderr)."""
    return [sys.executable, "-c", _WRAPPER, json.dumps(list(forbidden)), module, *map(str, argv)]


def loaded(stderr: str, returncode: object = None) -> list[str]:
    """The forbidden modules a finished wrapper run reported loaded."""
    lines = [line for line in stderr.splitlines() if line.startswith(MARKER)]
    assert lines, f"the wrapper did not report (exit {returncode}):\n{stderr}"
    return json.loads(lines[-1][len(MARKER):])


def run(module: str, *argv: str, timeout: float = 600,
        forbidden: tuple[str, ...] = FORBIDDEN_PACKAGES) -> tuple[subprocess.CompletedProcess, list[str]]:
    """(the finished process, the forbidden modules it loaded) for `module`'s main(argv)."""
    result = subprocess.run(command(module, *argv, forbidden=forbidden), capture_output=True, text=True,
                            timeout=timeout)
    return result, loaded(result.stderr, result.returncode)
