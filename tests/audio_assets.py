"""Real speech for the audio tests, from Debian packages fetched with `apt-get download` (which needs
no root) and unpacked with `dpkg-deb -x`, cached under the test cache (~/.cache/trt-llm-tests).

- `pocketsphinx-testdata` (1.8 MB): five LibriVox clips of "Sense and Sensibility" and five spoken
  card names, 16 kHz mono 16-bit WAV, each with its transcript.
- `espeak-ng` makes more speech: the system's when it is installed, else the package and the
  libraries it needs that the system lacks (apt-get's own resolution, `apt-get -s install`),
  unpacked side by side and run with LD_LIBRARY_PATH. It writes 22.05 kHz mono WAV.

No audio model weights are involved (none ship in a package: shared/notes/multimodal-facts.md).
Everything raises AssetUnavailable when apt, its package lists or the mirror are out of reach.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

from assets import AssetUnavailable, before_fetch

POCKETSPHINX = "pocketsphinx-testdata"
POCKETSPHINX_DATA = "usr/share/pocketsphinx/test/data"
POCKETSPHINX_SETS = {"librivox": "transcription", "cards": "cards.transcription"}
# The five LibriVox utterances of "Sense and Sensibility" (24.7 s, 71 words), in order.
LIBRIVOX = [f"sense_and_sensibility_01_austen_64kb-{n:04d}" for n in (870, 880, 890, 920, 930)]


class Clip(NamedTuple):
    path: Path
    transcript: str


def cache_root() -> Path:
    """The test cache conftest.py uses too."""
    return Path(os.environ.get("TRT_LLM_TEST_CACHE", "~/.cache/trt-llm-tests")).expanduser()


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise AssetUnavailable(f"{name} is not installed (the speech assets are Debian packages)")
    return path


def _run(command: list[str], cwd: Path, timeout: float = 300, env: dict | None = None) -> str:
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env,
                              check=False)  # the exit status is turned into AssetUnavailable below
    except (subprocess.SubprocessError, OSError) as error:
        raise AssetUnavailable(f"{' '.join(command)} failed: {error}") from None
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise AssetUnavailable(f"{' '.join(command)} exited with {done.returncode}: {last[0]}")
    return done.stdout


def _unpack(packages: list[str], root: Path) -> None:
    """`apt-get download` the packages into a scratch folder and unpack them all into `root`."""
    before_fetch(f"the Debian packages {', '.join(packages)}", root.parent)
    with tempfile.TemporaryDirectory(prefix=".debs-", dir=root.parent) as scratch:
        _run([_tool("apt-get"), "download", *packages], Path(scratch))
        dpkg_deb = _tool("dpkg-deb")
        for deb in sorted(Path(scratch).glob("*.deb")):
            _run([dpkg_deb, "-x", str(deb), str(root)], Path(scratch))


def _install(final: Path, build) -> Path:
    """Run `build(folder)` in a temporary folder beside `final` and rename it into place, so an
    interrupted run leaves nothing half-made; another process that finished first wins."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    tmp.chmod(0o755)
    try:
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _transcripts(text: str) -> dict[str, str]:
    """Sphinx transcription lines, `<s> words </s> (utterance id)`."""
    found = {}
    for line in text.splitlines():
        match = re.fullmatch(r"\s*(?:<s>)?(.*?)(?:</s>)?\s*\((\S+)\)\s*", line)
        if match:
            found[match.group(2)] = " ".join(match.group(1).split())
    return found


def pocketsphinx_clips(cache_dir: Path | None = None) -> dict[str, Clip]:
    """The ten clips of pocketsphinx-testdata by utterance id ("001", ...,
    "sense_and_sensibility_01_austen_64kb-0870", ...), fetched once."""
    final = Path(cache_dir or cache_root()) / POCKETSPHINX
    index = final / "transcripts.json"

    def build(folder: Path) -> None:
        _unpack([POCKETSPHINX], folder / "deb")
        data = folder / "deb" / POCKETSPHINX_DATA
        transcripts = {}
        for subset, listing in POCKETSPHINX_SETS.items():
            for utterance, words in _transcripts((data / subset / listing).read_text()).items():
                if (data / subset / f"{utterance}.wav").is_file():
                    shutil.copy(data / subset / f"{utterance}.wav", folder / f"{utterance}.wav")
                    transcripts[utterance] = words
        shutil.rmtree(folder / "deb")
        if not transcripts:
            raise AssetUnavailable(f"{POCKETSPHINX} holds none of the expected clips")
        (folder / "transcripts.json").write_text(json.dumps(transcripts, indent=1) + "\n")

    if not index.is_file():
        before_fetch(f"the Debian package {POCKETSPHINX}", final)
        _install(final, build)
    return {utterance: Clip(final / f"{utterance}.wav", words)
            for utterance, words in json.loads(index.read_text()).items()}


def _espeak_tree(cache_dir: Path) -> Path:
    """espeak-ng and the libraries the system lacks, unpacked under `cache_dir/espeak-ng`."""
    final = cache_dir / "espeak-ng"

    def build(folder: Path) -> None:
        plan = _run([_tool("apt-get"), "-s", "install", "--no-install-recommends", "espeak-ng"], folder,
                    env={**os.environ, "LC_ALL": "C"})
        packages = re.findall(r"^Inst (\S+)", plan, flags=re.MULTILINE)
        if "espeak-ng" not in packages:
            raise AssetUnavailable("apt-get does not plan to install espeak-ng (no package list?)")
        _unpack(packages, folder)

    if not (final / "usr" / "bin" / "espeak-ng").is_file():
        before_fetch("espeak-ng (not installed on this system) and its Debian packages", final)
        _install(final, build)
    return final


def _espeak_command(cache_dir: Path) -> tuple[list[str], dict[str, str]]:
    system = shutil.which("espeak-ng")
    if system is not None:
        return [system], dict(os.environ)
    tree = _espeak_tree(cache_dir)
    libraries = sorted({str(p.parent) for p in tree.glob("usr/lib/**/*.so*")})
    data = next(tree.glob("usr/lib/**/espeak-ng-data"), None) or next(tree.glob("usr/share/espeak-ng-data"), None)
    if data is None:
        raise AssetUnavailable("the espeak-ng packages hold no espeak-ng-data folder")
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(libraries)}
    return [str(tree / "usr" / "bin" / "espeak-ng"), f"--path={data.parent}"], env


def espeak_ready(cache_dir: Path | None = None) -> str:
    """Makes espeak-ng runnable (the system's, else its packages fetched into the cache); returns which."""
    command, _ = _espeak_command(Path(cache_dir or cache_root()))
    return command[0]


def espeak_speech(text: str, cache_dir: Path | None = None, *, words_per_minute: int = 140,
                  voice: str = "en") -> Path:
    """A WAV of espeak-ng saying `text` (22.05 kHz mono), made once and cached by its settings."""
    cache_dir = Path(cache_dir or cache_root())
    key = hashlib.sha256(json.dumps([text, words_per_minute, voice]).encode()).hexdigest()[:16]
    path = cache_dir / "espeak-speech" / f"{key}.wav"
    if path.is_file():
        return path
    command, env = _espeak_command(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    try:
        _run([*command, "-v", voice, "-s", str(words_per_minute), "-w", str(partial), text], path.parent,
             timeout=60, env=env)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path
