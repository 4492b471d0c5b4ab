"""Shared fixtures: the offline assets of tests/assets.py, built once per run.

Under pytest-xdist (scripts/test.sh runs `-n 2`) each worker is a session of its own: the models and
engines that cost seconds to build are built by the first worker that needs them, into a folder that
all the workers of the run share, and reused by the others (shared_build)."""

import hashlib
import os
import shutil
import sys
from pathlib import Path

# Tests must never reach the Hugging Face hub; fail fast instead of hanging on the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# transformers 5.25 swaps layers for the Hub's kernels at from_pretrained (use_kernels defaults on): the
# references must be its own torch code, as the build's (build/__init__.py) are.
os.environ.setdefault("USE_HUB_KERNELS", "0")

# `from assets import ...` works from any test file, also in sub-folders and under
# --import-mode=importlib (which does not put test folders on sys.path).
_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

import pytest  # noqa: E402
import torch  # noqa: E402

import assets  # noqa: E402
import skip_report  # noqa: E402

# The test machines have 2 shared cores; more threads only add contention.
torch.set_num_threads(1)

# The tests never download: `bash scripts/setup.sh --test` fetches every asset into the test cache, and a
# test whose asset is missing fails saying so (assets.AssetNotFetched) instead of fetching or skipping.
assets.forbid_fetching()


def pytest_configure(config):
    skip_report.register(config)  # every skip and its reason in the summary; CI fails one not allow-listed


def _shared_root(tmp_path_factory) -> Path:
    """A folder common to every worker of this run: under xdist each worker's base temp is
    <run>/popen-gwN, and <run> is theirs together; without xdist, the session's own base temp."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
    root.mkdir(exist_ok=True)
    return root


def shared_build(tmp_path_factory, kind: str, key: str, build) -> Path:
    """build(folder) once per run for `key` (a deterministic description of what is built: the same
    key in two workers means the same thing), into <shared root>/<kind>-<hash of key>; returns the folder.

    A file lock makes the other workers wait for the first one's build instead of repeating it; a
    marker beside the folder, written last, says it is whole: a folder without one (a build that
    failed or was killed) is removed and built again, as the serial suite would retry it."""
    from filelock import FileLock

    root = _shared_root(tmp_path_factory)
    name = f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    folder, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.write_text(key + "\n")
    return folder


def _cache_root() -> Path:
    """Survives across sessions: the SmolLM2 conversion takes ~40 s."""
    return Path(os.environ.get("TRT_LLM_TEST_CACHE", "~/.cache/trt-llm-tests")).expanduser()


@pytest.fixture(scope="session")
def built():
    """Our cpu kernels' library (runtime/backends/cpu_kernels), as scripts/setup.sh built it (the header
    fetched then); compiled here if the cache has the header but not this source's build; the test is
    skipped, naming why, where it cannot be."""
    from trt_llm.runtime.backends.cpu_kernels import library

    try:
        return library.library()
    except library.LibraryUnavailable as error:
        pytest.skip(f"our cpu kernels are not built: {error}")


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    """A folder with only the tiny ChatML tokenizer."""
    return assets.make_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Factory: tiny_model(family, **overrides) -> Path, each distinct call built once."""
    built = {}

    def make(family: str, **overrides) -> Path:
        key = repr((family, sorted(overrides.items())))  # overrides may hold dicts
        if key not in built:  # seeded: the same key is the same model in every worker
            built[key] = shared_build(tmp_path_factory, f"tiny-{family}", key,
                                      lambda folder: assets.make_tiny_model(family, folder, **overrides))
        return built[key]

    return make


@pytest.fixture(scope="session", params=assets.FAMILIES)
def tiny_model_dir(request, tiny_model) -> Path:
    """A tiny random model of each family in turn (a test using it runs once per family)."""
    return tiny_model(request.param)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a plain fp32 HF folder, converted once and cached on disk."""
    try:
        return assets.smollm2_hf_dir(_cache_root())
    except assets.AssetUnavailable as exc:
        pytest.skip(f"SmolLM2 unavailable: {exc}")


@pytest.fixture(scope="session")
def npm_tokenizer():
    """Factory: npm_tokenizer("qwen3" | "llama3_1" | "gemma3") -> the real tokenizer's folder (skips without npm)."""
    def get(name: str) -> Path:
        try:
            return assets.npm_tokenizer_dir(name, _cache_root())
        except assets.AssetUnavailable as exc:
            pytest.skip(f"{name} tokenizer unavailable: {exc}")

    return get


@pytest.fixture(scope="session")
def family_model(tmp_path_factory):
    """Factory: family_model(family) -> the tiny checkpoint's folder (tests/family_assets.py), each built once."""
    import family_assets

    built = {}

    def make(family: str):
        if family not in built:
            try:
                built[family] = shared_build(tmp_path_factory, family, family, lambda folder:
                                             family_assets.make_family_model(family, folder, _cache_root()))
            except family_assets.assets.AssetUnavailable as exc:
                pytest.skip(f"the {family} tokenizer is unavailable: {exc}")
        return built[family]

    return make


@pytest.fixture(scope="session")
def build_engine_for(tmp_path_factory):
    """Factory: build_engine_for(model_dir, **config) -> engine directory, each built once a run (all
    workers: a model folder of tiny_model, family_model or the cache has the same path in each)."""
    from trt_llm.build.cli import build_engine
    from trt_llm.schemas.build_config import BuildConfig

    built = {}

    def build(model_dir, config, folder: Path) -> None:
        out = folder / "engine"
        settings = {"max_batch_size": 4, "max_input_len": 256, "max_kv_cache_capacity": 512, **config}
        made = build_engine(BuildConfig(model=str(model_dir), output_dir=str(out), **settings), progress=False)
        assert Path(made) == out, made  # the engine is where the other workers will look

    def make(model_dir, **config) -> Path:
        key = repr((str(model_dir), sorted(config.items())))
        if key not in built:
            built[key] = shared_build(tmp_path_factory, "engine", key,
                                      lambda folder: build(model_dir, config, folder)) / "engine"
        return built[key]

    return make


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_dir, build_engine_for) -> Path:
    return build_engine_for(smollm2_dir, max_input_len=1024, max_kv_cache_capacity=2048)


@pytest.fixture(scope="session")
def whisper_tiny_en_dir() -> Path:
    """The real Whisper tiny.en as a transformers checkpoint (tests/whisper_assets.py), converted once."""
    import whisper_assets

    try:
        return whisper_assets.whisper_tiny_en_dir()
    except assets.AssetUnavailable as exc:
        pytest.skip(f"whisper tiny.en unavailable: {exc}")


@pytest.fixture(scope="session")
def gemma3_270m_gguf() -> Path:
    """The real Gemma-3-270M Q4_K_M GGUF (tests/gemma3_assets.py), its PyPI parts joined once."""
    import gemma3_assets

    try:
        return gemma3_assets.gemma3_270m_gguf()
    except assets.AssetUnavailable as exc:
        pytest.skip(f"Gemma-3-270M GGUF unavailable: {exc}")


@pytest.fixture(scope="session")
def gemma3_270m_dir(gemma3_270m_gguf) -> Path:
    """That GGUF as transformers loads it, saved once as a plain fp32 folder."""
    import gemma3_assets

    try:
        return gemma3_assets.gemma3_270m_hf_dir()
    except assets.AssetUnavailable as exc:
        pytest.skip(f"Gemma-3-270M fp32 folder unavailable: {exc}")


@pytest.fixture(scope="session")
def librivox_clips() -> list:
    """The five LibriVox clips of Debian's pocketsphinx-testdata (audio_assets.Clip: path, transcript)."""
    import audio_assets

    try:
        found = audio_assets.pocketsphinx_clips()
    except assets.AssetUnavailable as exc:
        pytest.skip(f"pocketsphinx-testdata unavailable: {exc}")
    return [found[name] for name in audio_assets.LIBRIVOX]


@pytest.fixture
def every_chain(monkeypatch):
    """Prompt lookup verifies every chain it proposes, whole (runtime/decoding/pass_cost.plan decides by
    timings, which a test of exactness must not depend on: here every proposal is taken and refused)."""
    from trt_llm.runtime.decoding import lookup

    monkeypatch.setattr(lookup, "plan", lambda rows, slope, replay=0.0, worth=None: [n for n, _ in rows])
