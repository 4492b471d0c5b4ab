#!/usr/bin/env python
"""Peak memory against a clip's duration (issue 47 item 1): a long clip is decoded as a stream, window
by window (runtime/media/audio/streaming.py), so trt-llm-run's and the server's peak resident set stay
within 1.2x of a 1-minute clip's, and a clip over the duration limit is refused from its header.

Clips (FLAC, 16 kHz mono, 16-bit, written a block at a time into --work-dir):

- 1 minute and 40 minutes of speech: Debian's pocketsphinx-testdata LibriVox clips joined with 1.5 s
  pauses and repeated (benchmarks/whisper_longform.py's recording), silence after the last whole clip;
- 2 hours of digital silence (the issue's case: a few hundred KB that decode to 7,200 s).

Each goes, alone in a fresh process, through `trt-llm-run` (one request, greedy, the default
`whisper` settings: a clip over 30 s is transcribed window by window with timestamps) and through
`trt-llm-serve` (POST /v1/audio/transcriptions, response_format json; --max-upload-mb 200 and
--max-audio-seconds 7200 so that the long clips are admitted), on tests/whisper_assets.py's real
Whisper tiny.en built as whisper_longform.py builds it (fp32, one row). The peak is the process's own
VmHWM from /proc: trt-llm-run's read as it exits (a wrapper around its main), the server's after its
one request. Then the refusals: the 2-hour file under trt-llm-run's `whisper.max_audio_seconds` 3600
and under the server's default --max-audio-seconds (1,800): their time and peak beside the 1-minute
clip's.

    python benchmarks/audio_memory.py                 # writes audio_memory.json into --out-dir
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))
RATE = 16000
TARGET = 1.2
RUN = ("import json, sys, time; from trt_llm.runtime.app.run_cli import main; started = time.perf_counter(); "
       "rc = main(sys.argv[1:]); hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:')); "
       "print(json.dumps({'rc': rc, 'wall_s': time.perf_counter() - started, 'peak_kb': int(hwm.split()[1])}), "
       "file=sys.stderr); sys.exit(rc)")


def write_flac(path: Path, minutes: float, speech: bool) -> Path:
    """The clip, written a minute at a time (this process never holds two hours of samples)."""
    import soundfile

    if path.is_file():
        return path
    audio = None
    if speech:
        import whisper_longform

        audio = whisper_longform.recording(minutes)
    partial = path.with_suffix(".partial.flac")
    with soundfile.SoundFile(partial, "w", RATE, 1, subtype="PCM_16", format="FLAC") as out:
        total = int(minutes * 60 * RATE)
        for start in range(0, total, 60 * RATE):
            count = min(60 * RATE, total - start)
            out.write(audio[start:start + count] if audio is not None else np.zeros(count, np.float32))
    partial.rename(path)
    return path


def peak_of(pid: int) -> int:
    """VmHWM of a live process, in kB."""
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("VmHWM:")).split()[1])


def run_file(engine: Path, clip: Path, work: Path, threads: int, whisper: dict | None = None) -> dict:
    request = {"messages": [{"role": "user", "content": [{"type": "audio", "audio": str(clip)}]}]}
    source = work / f"{clip.stem}.json"
    source.write_text(json.dumps({"temperature": 0.0, "max_generate_length": 448, "whisper": whisper or {},
                                  "requests": [request]}))
    out = work / f"{clip.stem}.out.json"
    done = subprocess.run([sys.executable, "-c", RUN, str(source), "--engine-dir", str(engine), "-o", str(out),
                           "--threads", str(threads)], capture_output=True, text=True)
    measured = json.loads(done.stderr.strip().splitlines()[-1])
    (response,) = json.loads(out.read_text())["responses"]
    return {"peak_mib": round(measured["peak_kb"] / 1024, 1), "wall_s": round(measured["wall_s"], 2),
            "exit_status": measured["rc"], "finish_reason": response["finish_reason"], "error": response.get("error"),
            "segments": len(response.get("segments") or []), "words": len((response.get("output_text") or "").split())}


class Server:
    def __init__(self, engine: Path, threads: int, *flags: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trt_llm.server.cli", "--engine-dir", str(engine), "--port", "0", "--threads",
             str(threads), "--model-name", "whisper", "--max-upload-mb", "200", *flags],
            stderr=subprocess.PIPE, text=True)
        for line in self.process.stderr:
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                self.url = found.group(1)
                break
        else:
            raise RuntimeError("trt-llm-serve did not start")

    def transcribe(self, clip: Path) -> dict:
        import httpx

        idle = peak_of(self.process.pid)
        started = time.perf_counter()
        with clip.open("rb") as file:
            answer = httpx.post(f"{self.url}/v1/audio/transcriptions", timeout=3600,
                                files={"file": (clip.name, file, "audio/flac")}, data={"model": "whisper"})
        wall = time.perf_counter() - started
        body = answer.json()
        return {"peak_mib": round(peak_of(self.process.pid) / 1024, 1), "idle_peak_mib": round(idle / 1024, 1),
                "wall_s": round(wall, 2), "status": answer.status_code,
                "error": body.get("error", {}).get("message") if answer.status_code != 200 else None,
                "words": len(body.get("text", "").split())}

    def close(self):
        self.process.terminate()
        self.process.wait(timeout=60)


def serve(engine: Path, clip: Path, threads: int, *flags: str) -> dict:
    server = Server(engine, threads, *flags)
    try:
        return server.transcribe(clip)
    finally:
        server.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=Path("~/.cache/trt-llm-bench/audio-memory").expanduser())
    parser.add_argument("--out-dir", type=Path, default=REPO / "out" / "bench")
    args = parser.parse_args(argv)
    import whisper_longform

    engine = whisper_longform.engine_dir()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    clips = {"speech_1m": write_flac(args.work_dir / "speech_1m.flac", 1, True),
             "speech_40m": write_flac(args.work_dir / "speech_40m.flac", 40, True),
             "silence_2h": write_flac(args.work_dir / "silence_2h.flac", 120, False)}
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), None)
    results = {"machine": {"cpus": os.cpu_count(), "cpu": cpu, "threads": args.threads},
               "engine": "whisper tiny.en fp32 (cpu)",
               "clips": {name: {"bytes": path.stat().st_size, "seconds": round(__import__("soundfile").info(
                   str(path)).duration, 2)} for name, path in clips.items()}, "trt_llm_run": {}, "server": {}}
    for name, clip in clips.items():
        results["trt_llm_run"][name] = run_file(engine, clip, args.work_dir, args.threads)
        print("trt-llm-run", name, results["trt_llm_run"][name], flush=True)
        results["server"][name] = serve(engine, clip, args.threads, "--max-audio-seconds", "7200")
        print("trt-llm-serve", name, results["server"][name], flush=True)
    results["refusals"] = {
        "trt_llm_run_max_audio_seconds_3600": run_file(engine, clips["silence_2h"], args.work_dir, args.threads,
                                                       {"max_audio_seconds": 3600}),
        "server_default_1800": serve(engine, clips["silence_2h"], args.threads)}
    print("refusals", results["refusals"], flush=True)
    ratios = {}
    for side in ("trt_llm_run", "server"):
        base = results[side]["speech_1m"]["peak_mib"]
        for name in ("speech_40m", "silence_2h"):
            ratios[f"{side} {name} / speech_1m"] = round(results[side][name]["peak_mib"] / base, 3)
        ratios[f"{side} refusal / speech_1m"] = round(
            results["refusals"]["trt_llm_run_max_audio_seconds_3600" if side == "trt_llm_run"
                                else "server_default_1800"]["peak_mib"] / base, 3)
    results["peak_ratios"] = ratios
    results["within_target"] = all(value <= TARGET for value in ratios.values())
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "audio_memory.json").write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(ratios, indent=1))
    return 0 if results["within_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
