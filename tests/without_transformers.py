"""Run one of our command-line programs in a Python where `transformers` cannot be imported.

The device of a two-stage deployment has no transformers: a meta-path finder makes any import of
it fail as if it were not installed, and the run reports which forbidden modules ended up loaded
(none, when the program is clean): transformers itself, or the build's export-side modules.
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

_WRAPPER = f"""
import importlib, json, sys

class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {FORBIDDEN_PACKAGES!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)
        return None

sys.meta_path.insert(0, _Blocked())
module, *argv = sys.argv[1:]
try:
    code = importlib.import_module(module).main(argv)
finally:
    loaded = sorted(m for m in sys.modules
                    if m.split(".")[0] in {FORBIDDEN_PACKAGES!r} or m in {FORBIDDEN_MODULES!r})
    print({MARKER!r} + json.dumps(loaded), file=sys.stderr)
sys.exit(code)
"""


def run(module: str, *argv: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess, list[str]]:
    """(the finished process, the forbidden modules it loaded) for `module`'s main(argv)."""
    result = subprocess.run([sys.executable, "-c", _WRAPPER, module, *map(str, argv)], capture_output=True,
                            text=True, timeout=timeout)
    lines = [line for line in result.stderr.splitlines() if line.startswith(MARKER)]
    assert lines, f"the wrapper did not report (exit {result.returncode}):\n{result.stderr}"
    return result, json.loads(lines[-1][len(MARKER):])
