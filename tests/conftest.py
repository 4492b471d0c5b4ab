"""Shared fixtures: the offline assets of tests/assets.py, built once per session."""

import os
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


def _cache_root() -> Path:
    """Survives across sessions: the SmolLM2 conversion takes ~40 s."""
    return Path(os.environ.get("TRT_LLM_TEST_CACHE", "~/.cache/trt-llm-tests")).expanduser()


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
        if key not in built:
            built[key] = assets.make_tiny_model(family, tmp_path_factory.mktemp(f"tiny-{family}"), **overrides)
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
                built[family] = family_assets.make_family_model(family, tmp_path_factory.mktemp(family),
                                                                _cache_root())
            except family_assets.assets.AssetUnavailable as exc:
                pytest.skip(f"the {family} tokenizer is unavailable: {exc}")
        return built[family]

    return make


@pytest.fixture(scope="session")
def build_engine_for(tmp_path_factory):
    """Factory: build_engine_for(model_dir, **config) -> engine directory, each built once."""
    from trt_llm.build.cli import build_engine
    from trt_llm.schemas.build_config import BuildConfig

    built = {}

    def make(model_dir, **config) -> Path:
        key = repr((str(model_dir), sorted(config.items())))
        if key not in built:
            out = tmp_path_factory.mktemp("engine") / "engine"
            settings = {"max_batch_size": 4, "max_input_len": 256, "max_kv_cache_capacity": 512, **config}
            built[key] = build_engine(BuildConfig(model=str(model_dir), output_dir=str(out), **settings),
                                      progress=False)
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

    monkeypatch.setattr(lookup, "plan", lambda rows, slope, replay=0.0: [n for n, _ in rows])
