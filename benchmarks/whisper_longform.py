#!/usr/bin/env python
"""Long-form Whisper tiny.en side by side: trt-llm (cpu backend, fp32 and int8), transformers' pipeline
and faster-whisper (sequential, fp32 and int8) transcribing one recording of about five minutes, with
timestamps, and their real-time factors and word error rates; then with voice activity detection,
trt-llm's vad_filter (fp32 and int8) against faster-whisper's BatchedInferencePipeline (fp32 and
int8); optionally trt-llm's peak memory at two lengths.

trt-llm-int8 (and trt-llm-int8-vad) is the engine built with `quantization: int8`: every linear of
the decoder and the encoder int8 in blocks of 32 (the convolutions float), ONNX Runtime's MatMulNBits
with int8 activations: the precision of faster-whisper's compute_type int8.

The recording is Debian's pocketsphinx-testdata LibriVox clips (tests/audio_assets.py) joined with
1.5 s pauses and repeated to --minutes; the model is tests/whisper_assets.py's tiny.en (the same
weights for everyone: CTranslate2's fp16 model.bin, widened to fp32 for transformers and for us, and
by CTranslate2 itself with compute_type float32). Every engine decodes greedily (temperature 0, no
fallback), without conditioning on the previous text and without VAD; transformers and trt-llm keep
the same no-speech / log-prob / compression thresholds (2.4, -1.0, 0.6), faster-whisper its own
defaults for them. After one untimed warm-up each, one interleaved timed run (each engine once, in
turn), --threads threads each.

With VAD (the *-vad engines): trt-llm's whisper.vad_filter (Silero VAD, the batched pipeline's
settings: chunks of at most 30 s, 160 ms silences) on an engine of 8 rows, its chunks decoded side
by side, against faster-whisper's BatchedInferencePipeline (batch_size 8, its own copy of Silero VAD),
greedy: without timestamps (the pipeline's default: one decode per chunk on both sides) and, the
*-vad-ts engines, with them (a chunk is then transcribed as a clip alone on our side, its windows
advanced by the timestamps: Whisper often stops a chunk's first decode seconds before its end, and a
second window decodes the rest; the pipeline keeps its one decode per chunk).

The word error rate is against the clips' own transcripts (pocketsphinx-testdata ships them), in the
recording's order; the recording holds whole clips only (silence after the last one to --minutes).
Both sides go through Whisper's English text normalizer (transformers' EnglishTextNormalizer with the
checkpoint's normalizer.json: "Mr." and "mister" are one word, numbers are digits), then jiwer.

    python benchmarks/whisper_longform.py                       # 5 minutes, 2 threads
    python benchmarks/whisper_longform.py --memory 1,10         # + trt-llm's peak RSS at 1 and 10 minutes

Prints a Markdown table (engine, precision, audio s, wall s, RTF, WER, trt-llm's speed-up over it: the
sequential trt-llm against the sequential engines, trt-llm with VAD against the batched ones, each at
the engine's precision: trt-llm-int8 against the int8 ones), then the same-precision ratios (e.g.
"trt-llm-int8 / faster-whisper-int8": their wall over ours, over 1 is trt-llm faster), and writes
whisper_longform.json into --out-dir (default out/bench).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
RATE = 16000
PAUSE_S = 1.5
THRESHOLDS = {"compression_ratio_threshold": 2.4, "logprob_threshold": -1.0, "no_speech_threshold": 0.6}


def recording(minutes: float, with_reference: bool = False):
    """The clips joined with PAUSE_S pauses, whole clips only, silence after the last to `minutes`;
    with_reference: also the words said, in order (the clips' transcripts)."""
    import audio_assets

    from trt_llm.runtime.media.audio.decode import load_audio

    clips = audio_assets.pocketsphinx_clips()
    pieces = [load_audio(str(clips[name].path)) for name in audio_assets.LIBRIVOX]
    texts = [clips[name].transcript for name in audio_assets.LIBRIVOX]
    pause = np.zeros(int(PAUSE_S * RATE), dtype=np.float32)
    total_samples = int(minutes * 60 * RATE)
    out, said, total, i = [], [], 0, 0
    while total + len(pieces[i % len(pieces)]) <= total_samples:
        piece = pieces[i % len(pieces)]
        out += [piece, pause]
        said.append(texts[i % len(pieces)])
        total += len(piece) + len(pause)
        i += 3  # a different order on each pass through the clips
    audio = np.zeros(total_samples, dtype=np.float32)
    joined = np.concatenate(out)[:total_samples]
    audio[: len(joined)] = joined
    return (audio, " ".join(said)) if with_reference else audio


def word_error_rate(reference: str, hypothesis: str) -> float:
    """jiwer's WER after Whisper's English normalizer on both sides."""
    import jiwer
    import whisper_assets
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    spelling = json.loads((whisper_assets.whisper_tiny_en_dir() / "normalizer.json").read_text())
    normalize = EnglishTextNormalizer(spelling)
    return jiwer.wer(normalize(reference), normalize(hypothesis))


VAD_ROWS = 8  # the chunks decoded side by side, both sides


def engine_dir(rows: int = 1, quantization: str = "none") -> Path:
    """trt-llm's engine of `rows` rows (fp32, or `quantization: int8`), built once under ~/.cache/trt-llm-bench."""
    import whisper_assets

    from trt_llm.build.cli import build_engine
    from trt_llm.schemas.build_config import BuildConfig

    suffix = ("" if quantization == "none" else f"-{quantization}") + ("" if rows == 1 else f"-b{rows}")
    engine = Path(f"~/.cache/trt-llm-bench/whisper-tiny.en/engine{suffix}").expanduser()
    if not (engine / "manifest.json").is_file():
        build_engine(BuildConfig(model=str(whisper_assets.whisper_tiny_en_dir()), output_dir=str(engine),
                                 max_batch_size=rows, quantization=quantization), progress=False)
    return engine


def ours(vad: bool, timestamps: bool = True, quantization: str = "none"):
    def load(threads: int):
        import soundfile

        from trt_llm.runtime.engine_dir import EngineDir
        from trt_llm.runtime.requests.runner import Runner
        from trt_llm.schemas.input_file import load_input_file

        runner = Runner(EngineDir.open(engine_dir(VAD_ROWS if vad else 1, quantization)), threads=threads)
        scratch = Path(tempfile.mkdtemp(prefix="whisper-longform-"))
        whisper = {"return_timestamps": timestamps, **THRESHOLDS, **({"vad_filter": True} if vad else {})}

        def transcribe(audio):
            soundfile.write(scratch / "clip.wav", audio, RATE, subtype="FLOAT")  # its time counts as ours
            (scratch / "input.json").write_text(json.dumps({
                "temperature": 0.0, "max_generate_length": 448, "whisper": whisper,
                "requests": [{"messages": [{"role": "user", "content": [{"type": "audio", "audio": "clip.wav"}]}]}]}))
            loaded = load_input_file(scratch / "input.json")
            (response,) = runner.run(loaded, loaded.settings).responses
            return response.output_text, len(response.segments or [])

        return transcribe

    return load


load_ours = ours(vad=False)  # peak_memory's


def load_transformers(threads: int):
    import torch
    import whisper_assets
    from transformers import WhisperForConditionalGeneration, WhisperProcessor, pipeline
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(threads)
    model_dir = whisper_assets.whisper_tiny_en_dir()
    processor = WhisperProcessor.from_pretrained(model_dir)
    model = WhisperForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    # No chunk_length_s: the pipeline hands the whole clip to generate's sequential long-form path.
    asr = pipeline("automatic-speech-recognition", model=model, tokenizer=processor.tokenizer,
                   feature_extractor=processor.feature_extractor, device="cpu")

    def transcribe(audio):
        with torch.inference_mode():
            out = asr({"raw": audio, "sampling_rate": RATE}, return_timestamps=True,
                      generate_kwargs={"temperature": 0.0, **THRESHOLDS})
        return out["text"], len(out.get("chunks", []))

    return transcribe


def faster_whisper(compute_type: str):
    def load(threads: int):
        import whisper_assets
        from faster_whisper import WhisperModel

        model = WhisperModel(str(whisper_assets.whisper_tiny_en_ct2_dir()), device="cpu", compute_type=compute_type,
                             cpu_threads=threads, num_workers=1)

        def transcribe(audio):
            segments, _ = model.transcribe(audio, beam_size=1, temperature=0.0, condition_on_previous_text=False,
                                           vad_filter=False)
            segments = list(segments)
            return "".join(s.text for s in segments), len(segments)

        return transcribe

    return load


def faster_whisper_batched(compute_type: str, timestamps: bool = False):
    def load(threads: int):
        import whisper_assets
        from faster_whisper import BatchedInferencePipeline, WhisperModel

        model = WhisperModel(str(whisper_assets.whisper_tiny_en_ct2_dir()), device="cpu", compute_type=compute_type,
                             cpu_threads=threads, num_workers=1)
        pipeline = BatchedInferencePipeline(model)

        def transcribe(audio):
            segments, _ = pipeline.transcribe(audio, batch_size=VAD_ROWS, beam_size=1, temperature=0.0,
                                              without_timestamps=not timestamps, vad_filter=True)
            segments = list(segments)
            return "".join(s.text for s in segments), len(segments)

        return transcribe

    return load


ENGINES = {"trt-llm": (ours(vad=False), "fp32"), "transformers-pipeline": (load_transformers, "fp32"),
           "faster-whisper": (faster_whisper("float32"), "fp32"),
           "trt-llm-int8": (ours(vad=False, quantization="int8"), "int8 weights"),
           "faster-whisper-int8": (faster_whisper("int8"), "int8 weights"),
           "trt-llm-vad": (ours(vad=True, timestamps=False), "fp32"),
           "faster-whisper-batched-vad": (faster_whisper_batched("float32"), "fp32"),
           "trt-llm-int8-vad": (ours(vad=True, timestamps=False, quantization="int8"), "int8 weights"),
           "faster-whisper-batched-vad-int8": (faster_whisper_batched("int8"), "int8 weights"),
           "trt-llm-vad-ts": (ours(vad=True), "fp32"),
           "faster-whisper-batched-vad-ts": (faster_whisper_batched("float32", timestamps=True), "fp32")}
# trt-llm against faster-whisper in the same mode at the same precision: (ours, theirs)
SAME_PRECISION = (("trt-llm", "faster-whisper"), ("trt-llm-int8", "faster-whisper-int8"),
                  ("trt-llm-vad", "faster-whisper-batched-vad"),
                  ("trt-llm-int8-vad", "faster-whisper-batched-vad-int8"),
                  ("trt-llm-vad-ts", "faster-whisper-batched-vad-ts"))


def counterpart(name: str) -> str:
    """The trt-llm engine a row is measured against: the same mode (sequential, VAD, VAD with
    timestamps) and precision (int8 against trt-llm-int8)."""
    mode = ("-vad-ts" if name.endswith("-ts") else "-vad") if "vad" in name else ""
    return "trt-llm" + ("-int8" if "int8" in name else "") + mode


def speed_ratios(results: dict) -> dict:
    """{"ours / theirs": their wall / ours} for each same-precision pair that ran (over 1: trt-llm faster)."""
    return {f"{ours} / {theirs}": round(results[theirs]["wall_s"] / results[ours]["wall_s"], 3)
            for ours, theirs in SAME_PRECISION if ours in results and theirs in results}


def peak_memory(minutes: float, threads: int) -> float:
    """trt-llm's peak resident set (MiB) transcribing `minutes` of the recording, in a fresh process:
    its VmHWM, not ru_maxrss, which Linux carries over from the parent through fork and exec (this
    process's gigabytes of models would be the child's peak)."""
    code = (f"import sys; sys.path.insert(0, {str(REPO / 'benchmarks')!r}); import whisper_longform as w; "
            f"w.load_ours({threads})(w.recording({minutes})); "
            "print(next(l for l in open('/proc/self/status') if l.startswith('VmHWM:')).split()[1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1]) / 1024  # kB


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--memory", default="", help="minutes, comma-separated: trt-llm's peak RSS at each")
    parser.add_argument("--out-dir", type=Path, default=REPO / "out" / "bench")
    args = parser.parse_args(argv)
    audio, reference = recording(args.minutes, with_reference=True)
    seconds = len(audio) / RATE
    names = [n for n in args.engines.split(",") if n]
    transcribers = {}
    for name in names:
        transcribers[name] = ENGINES[name][0](args.threads)
        transcribers[name](audio[: 60 * RATE])  # warm-up: one minute
    results = {}
    for name, transcribe in transcribers.items():  # the one timed run, each engine in turn
        start = time.perf_counter()
        text, segments = transcribe(audio)
        wall = time.perf_counter() - start
        results[name] = {"precision": ENGINES[name][1], "audio_s": round(seconds, 2), "wall_s": round(wall, 2),
                         "rtf": round(wall / seconds, 4), "segments": segments, "words": len(text.split()),
                         "wer": round(word_error_rate(reference, text), 4)}
        print(f"{name}: {wall:.2f} s for {seconds:.0f} s of audio", file=sys.stderr)
    memory = {m: round(peak_memory(float(m), args.threads), 1) for m in args.memory.split(",") if m}
    ratios = speed_ratios(results)
    report = {"threads": args.threads, "reference_words": len(reference.split()), "results": results,
              "speed_ratios": ratios, "peak_rss_mib_by_minutes": memory,
              "bench_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "whisper_longform.json").write_text(json.dumps(report, indent=1) + "\n")
    print("| engine | precision | audio s | wall s | RTF | segments | words | WER | trt-llm's speed-up |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        mine = results.get(counterpart(name))  # like against like
        speedup = f"{r['wall_s'] / mine['wall_s']:.2f}x" if mine else "-"
        print(f"| {name} | {r['precision']} | {r['audio_s']} | {r['wall_s']} | {r['rtf']} | {r['segments']} | "
              f"{r['words']} | {r['wer']:.2%} | {speedup} |")
    if ratios:
        print()
        print("| trt-llm / faster-whisper, same mode and precision | speed (their wall / ours) |")
        print("|---|---|")
        for pair, ratio in ratios.items():
            print(f"| {pair} | {ratio:.2f}x |")
    for minutes, mib in memory.items():
        print(f"trt-llm peak RSS at {minutes} min: {mib} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
