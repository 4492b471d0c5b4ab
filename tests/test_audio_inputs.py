"""Audio inputs: runtime/media/audio/decode.py turns an audio part's source into a 16 kHz mono float32 waveform
and runtime/media/audio/features.py into an encoder's log-mel features, both against transformers.

Oracles: for decoding, the samples written (lossless formats, at their own rate) and transformers'
`audio_utils.load_audio` with its soundfile backend (the same file, bit for bit, at 16 kHz); for the
features, `WhisperFeatureExtractor` (its torch and its numpy path, 80 and 128 mel bins, padded to 30 s
as Whisper and Qwen2-Audio call it, and unpadded) and `ParakeetFeatureExtractor`, given the same
16 kHz array. The speech is real: Debian's pocketsphinx-testdata (LibriVox and spoken card names) and
espeak-ng, fetched by scripts/setup.sh --test through tests/audio_assets.py."""

import base64
import io
import math

import numpy as np
import pytest
import soundfile
import soxr
import torch
import transformers.models.parakeet.feature_extraction_parakeet as hf_parakeet
import transformers.models.whisper.feature_extraction_whisper as hf_whisper
from transformers import ParakeetFeatureExtractor, WhisperFeatureExtractor
from transformers.audio_utils import load_audio as hf_load_audio
from transformers.audio_utils import mel_filter_bank as hf_mel_filter_bank

import audio_assets
from assets import AssetUnavailable
from trt_llm.runtime.media.audio.decode import AudioError, decode_audio, load_audio, resample
from trt_llm.runtime.media.audio.features import (
    ParakeetFeatures,
    WhisperFeatures,
    config_from_preprocessor,
    extractor_for,
    mel_filter_bank,
)
from trt_llm.runtime.media.sources import MediaError

TOLERANCE = 1e-4  # transformers computes in float32 (torch): its rounding, not ours
NUMPY_PATH_TOLERANCE = 1e-6  # WhisperFeatureExtractor without torch computes in float64, as we do
LIBRIVOX = [f"sense_and_sensibility_01_austen_64kb-{n:04d}" for n in (870, 880, 890, 920, 930)]
CARDS = ["001", "002", "003", "004", "005"]
ESPEAK_TEXT = "Hello. My name is John. I like to read books."
SPEECH = [*LIBRIVOX, *CARDS, "espeak"]
RATES = (8000, 16000, 22050, 48000)
FORMATS = {"wav": "WAV", "flac": "FLAC", "mp3": "MP3", "ogg": "OGG"}  # suffix: libsndfile format
LOSSY_SNR_DB = 12  # mp3 / ogg against the wav: 17 to 31 dB at soundfile's default bitrates


# --- Assets -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pocketsphinx():
    try:
        return audio_assets.pocketsphinx_clips()
    except AssetUnavailable as error:
        pytest.skip(f"pocketsphinx-testdata unavailable: {error}")


@pytest.fixture(scope="module")
def speech(pocketsphinx):
    """speech(name) -> the clip at 16 kHz, mono float32, decoded by runtime/media/audio/decode.py (once)."""
    decoded = {}

    def get(name: str) -> np.ndarray:
        if name not in decoded:
            if name == "espeak":
                try:
                    path = audio_assets.espeak_speech(ESPEAK_TEXT)
                except AssetUnavailable as error:
                    pytest.skip(f"espeak-ng unavailable: {error}")
            else:
                path = pocketsphinx[name].path
            decoded[name] = load_audio(str(path))
        return decoded[name]

    return get


def _pcm16(samples: np.ndarray) -> np.ndarray:
    return np.clip(np.round(samples * 32768), -32768, 32767).astype(np.int16)


@pytest.fixture(scope="module")
def clips(pocketsphinx, tmp_path_factory):
    """(suffix, rate, channels) -> (path, the int16 samples written [frames, channels]): one LibriVox
    clip (the right channel another, so the downmix matters), resampled with soxr to each rate."""
    folder = tmp_path_factory.mktemp("clips")
    left, _ = soundfile.read(pocketsphinx[LIBRIVOX[1]].path, dtype="float32")
    right, _ = soundfile.read(pocketsphinx[LIBRIVOX[4]].path, dtype="float32")
    stereo = np.stack([left, right[:len(left)]], axis=1)
    made = {}
    for rate in RATES:
        for channels, source in ((1, left[:, None]), (2, stereo)):
            samples = _pcm16(soxr.resample(source, 16000, rate) if rate != 16000 else source)
            for suffix, kind in FORMATS.items():
                path = folder / f"speech-{rate}-{channels}ch.{suffix}"
                # The lossy encoders get the same samples as float32: libsndfile 1.2's MP3 encoder
                # corrupts stereo int16 input (it copies half the bytes: libsndfile PR #1106).
                lossless = kind in ("WAV", "FLAC")
                soundfile.write(path, samples if lossless else samples.astype(np.float32) / 32768, rate, format=kind)
                made[suffix, rate, channels] = path, samples
    return made


def _clip_ids(value):
    return "-".join(map(str, value)) if isinstance(value, tuple) else None


ALL_CLIPS = [(suffix, rate, channels) for suffix in FORMATS for rate in RATES for channels in (1, 2)]


# --- Decoding ---------------------------------------------------------------------------------

@pytest.mark.parametrize("key", [k for k in ALL_CLIPS if k[0] in ("wav", "flac")], ids=_clip_ids)
def test_lossless_clip_decodes_to_its_samples(clips, key):
    """At the file's own rate nothing is resampled: the samples written, scaled by 1/32768, and a
    stereo file's channels averaged in float32."""
    path, samples = clips[key]
    decoded = decode_audio(path.read_bytes(), repr(str(path)), sampling_rate=key[1])
    channels = (samples.astype(np.float32) / 32768).T
    expected = channels.mean(axis=0) if key[2] > 1 else channels[0]
    assert decoded.dtype == np.float32 and decoded.ndim == 1
    np.testing.assert_array_equal(decoded, expected)


@pytest.mark.parametrize("key", ALL_CLIPS, ids=_clip_ids)
def test_decoding_is_transformers_load_audio(clips, key):
    """Every format, rate and channel count at 16 kHz, bit for bit what transformers' load_audio
    (soundfile backend: decode, average the channels, soxr "HQ", fix the length) returns."""
    path, samples = clips[key]
    ours = load_audio(str(path))
    assert len(ours) == math.ceil(len(samples) * 16000 / key[1])
    np.testing.assert_array_equal(ours, hf_load_audio(str(path), sampling_rate=16000, backend="soundfile"))


def test_channels_are_averaged_before_resampling(clips):
    """The order of transformers' load_audio and ASR pipeline: a 48 kHz stereo clip is the soxr
    resampling of its channels' mean, exactly; resampling each channel and then averaging differs
    (by rounding only, as resampling is linear), so the test tells the orders apart."""
    path, samples = clips["flac", 48000, 2]
    ours = load_audio(str(path))
    channels = (samples.astype(np.float32) / 32768).T
    np.testing.assert_array_equal(ours, resample(channels.mean(axis=0), 48000, 16000))
    np.testing.assert_array_equal(ours[:len(ours) - 1],
                                  soxr.resample(channels.mean(axis=0), 48000, 16000, quality="HQ")[:len(ours) - 1])
    per_channel = np.mean([resample(channel, 48000, 16000) for channel in channels], axis=0)
    assert not np.array_equal(ours, per_channel)
    np.testing.assert_allclose(ours, per_channel, atol=1e-6)


@pytest.mark.parametrize("key", [k for k in ALL_CLIPS if k[0] in ("mp3", "ogg")], ids=_clip_ids)
def test_lossy_clip_is_close_to_the_wav(clips, key):
    """MP3 and Ogg Vorbis decode gaplessly: as many samples as the wav, in step with it."""
    lossy = load_audio(str(clips[key][0]))
    wav = load_audio(str(clips["wav", *key[1:]][0]))
    assert len(lossy) == len(wav)
    snr = 10 * np.log10(np.sum(wav.astype(np.float64) ** 2) / np.sum((lossy - wav).astype(np.float64) ** 2))
    assert snr > LOSSY_SNR_DB, f"{key}: {snr:.1f} dB"


def _tone(seconds: float = 0.5, rate: int = 16000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 440 * t) * np.sin(2 * np.pi * 3 * t)).astype(np.float32)


def _file_bytes(samples: np.ndarray, rate: int = 16000, kind: str = "WAV", subtype: str | None = None) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=kind, subtype=subtype)
    return buffer.getvalue()


def test_sources_paths_file_and_data_urls(tmp_path):
    """A relative path (from the input file's folder), a file:// URL and a data: URL of the same
    clip decode alike (runtime/media/sources.py resolves them)."""
    data = _file_bytes(_tone(), subtype="FLOAT")
    (tmp_path / "clip.wav").write_bytes(data)
    expected = _tone()
    np.testing.assert_array_equal(load_audio("clip.wav", base_dir=tmp_path), expected)
    np.testing.assert_array_equal(load_audio((tmp_path / "clip.wav").as_uri()), expected)
    url = "data:audio/wav;base64," + base64.b64encode(data).decode()
    np.testing.assert_array_equal(load_audio(url), expected)
    np.testing.assert_array_equal(load_audio(url, sampling_rate=8000), resample(expected, 16000, 8000))


def _error(call) -> str:
    with pytest.raises(MediaError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and message.startswith("audio ")
    return message


def test_errors_are_one_line_and_name_the_source(tmp_path):
    (tmp_path / "noise.wav").write_bytes(np.random.default_rng(0).bytes(4096))
    (tmp_path / "empty.wav").write_bytes(_file_bytes(np.zeros(0, np.int16)))
    (tmp_path / "long.flac").write_bytes(_file_bytes(_tone(3.0), kind="FLAC"))
    nan = _tone()
    nan[100] = np.nan
    (tmp_path / "nan.wav").write_bytes(_file_bytes(nan, subtype="FLOAT"))
    inf = _tone()
    inf[7] = -np.inf
    (tmp_path / "inf.wav").write_bytes(_file_bytes(inf, subtype="FLOAT"))
    (tmp_path / "sun.au").write_bytes(_file_bytes(_tone(), kind="AU"))
    flac = _file_bytes(np.random.default_rng(1).normal(0, 0.1, 16000).astype(np.float32), kind="FLAC")
    (tmp_path / "cut.flac").write_bytes(flac[:len(flac) // 2])  # a valid header, then a broken stream

    assert "no such file" in _error(lambda: load_audio("missing.wav", base_dir=tmp_path))
    assert "'missing.wav'" in _error(lambda: load_audio("missing.wav", base_dir=tmp_path))
    message = _error(lambda: load_audio("noise.wav", base_dir=tmp_path))
    assert "'noise.wav'" in message and "not audio in a supported format" in message
    assert "'empty.wav'" in _error(lambda: load_audio("empty.wav", base_dir=tmp_path))
    assert "empty" in _error(lambda: load_audio("empty.wav", base_dir=tmp_path))
    message = _error(lambda: load_audio("long.flac", base_dir=tmp_path, max_seconds=2.5))
    assert "'long.flac'" in message and "3.00 s long, over the limit of 2.5 s" in message
    assert len(load_audio("long.flac", base_dir=tmp_path, max_seconds=3)) == 48000
    for name in ("nan.wav", "inf.wav"):
        message = _error(lambda name=name: load_audio(name, base_dir=tmp_path))
        assert repr(name) in message and "NaN or infinite" in message
    message = _error(lambda: load_audio("sun.au", base_dir=tmp_path))
    assert "'sun.au'" in message and "not a supported format" in message
    message = _error(lambda: load_audio("cut.flac", base_dir=tmp_path))
    assert "'cut.flac'" in message and "cannot decode it" in message

    png = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(64)).decode()
    message = _error(lambda: load_audio(png))
    assert "data:image/png" in message and "not audio/*" in message
    fake = "data:audio/wav;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(64)).decode()
    assert "not audio in a supported format" in _error(lambda: load_audio(fake))
    assert "nothing is fetched" in _error(lambda: load_audio("https://example.com/a.wav"))
    with pytest.raises(AudioError):  # the decoding errors are AudioErrors, all are MediaErrors
        decode_audio(b"not audio at all", "'bytes'")


def test_bad_arguments():
    data = _file_bytes(_tone())
    for bad in (0, -16000, 16000.0, True):
        with pytest.raises(ValueError, match="sampling_rate"):
            decode_audio(data, "'x'", sampling_rate=bad)
    for bad in (0, -1.0, "10"):
        with pytest.raises(ValueError, match="max_seconds"):
            decode_audio(data, "'x'", max_seconds=bad)


# --- Features: the oracles --------------------------------------------------------------------

def _whisper_numpy_path(extractor, clip, **kwargs):
    """WhisperFeatureExtractor as it computes without torch (float64 numpy STFT)."""
    saved = hf_whisper.is_torch_available
    hf_whisper.is_torch_available = lambda: False
    try:
        return extractor(clip, sampling_rate=16000, return_tensors="np", **kwargs)["input_features"][0]
    finally:
        hf_whisper.is_torch_available = saved


class _TorchInFloat64:
    """The torch module as transformers' Parakeet extractor sees it, its float32 being float64."""

    def __getattr__(self, name):
        return getattr(torch, "float64" if name == "float32" else name)


def _parakeet_in_float64(clip: np.ndarray, bins: int) -> np.ndarray:
    """ParakeetFeatureExtractor's own code run in float64 after its (float32) padding step: the
    oracle where its float32 arithmetic is too coarse to compare with (quiet or band-limited audio)."""
    extractor = ParakeetFeatureExtractor(feature_size=bins)
    extractor.mel_filters = torch.from_numpy(np.ascontiguousarray(
        hf_mel_filter_bank(257, bins, 0.0, 8000.0, 16000, norm="slaney", mel_scale="slaney").T))
    saved, default = hf_parakeet.torch, torch.get_default_dtype()
    hf_parakeet.torch = _TorchInFloat64()
    torch.set_default_dtype(torch.float64)  # the window
    try:
        return extractor(clip, sampling_rate=16000, return_tensors="np")["input_features"][0]
    finally:
        hf_parakeet.torch = saved
        torch.set_default_dtype(default)


@pytest.mark.parametrize("bins", [80, 128])
def test_mel_filter_bank_is_transformers(bins):
    for n_fft, top in ((400, 8000.0), (512, 8000.0)):
        expected = hf_mel_filter_bank(n_fft // 2 + 1, bins, 0.0, top, 16000, norm="slaney", mel_scale="slaney")
        np.testing.assert_allclose(mel_filter_bank(n_fft // 2 + 1, bins, 0.0, top, 16000), expected,
                                   rtol=0, atol=1e-12)


@pytest.mark.parametrize("bins", [80, 128])
@pytest.mark.parametrize("name", SPEECH)
def test_whisper_features_are_transformers(speech, name, bins):
    """Padded to 30 s as Whisper and Qwen2-Audio call it (with the attention mask Qwen2-Audio counts
    its tokens from) and unpadded (`padding="longest"`), against both of transformers' paths."""
    clip = speech(name)
    extractor = WhisperFeatureExtractor(feature_size=bins)
    ours = WhisperFeatures(num_mel_bins=bins)(clip)
    hf = extractor(clip, sampling_rate=16000, return_attention_mask=True, padding="max_length", return_tensors="np")
    assert ours.features.shape == (bins, 3000) and ours.features.dtype == np.float32
    np.testing.assert_allclose(ours.features, hf["input_features"][0], rtol=0, atol=TOLERANCE)
    assert ours.num_frames == hf["attention_mask"].sum() == math.ceil(len(clip) / 160)
    np.testing.assert_allclose(ours.features, _whisper_numpy_path(extractor, clip), rtol=0, atol=NUMPY_PATH_TOLERANCE)

    unpadded = WhisperFeatures(num_mel_bins=bins, pad_to_chunk=False)(clip)
    hf = extractor(clip, sampling_rate=16000, return_attention_mask=True, padding="longest", return_tensors="np")
    assert unpadded.features.shape == (bins, len(clip) // 160) == hf["input_features"][0].shape
    np.testing.assert_allclose(unpadded.features, hf["input_features"][0], rtol=0, atol=TOLERANCE)
    assert unpadded.num_frames == hf["attention_mask"].sum()


@pytest.mark.parametrize("bins", [80, 128])
@pytest.mark.parametrize("name", SPEECH)
def test_parakeet_features_are_transformers(speech, name, bins):
    clip = speech(name)
    ours = ParakeetFeatures(num_mel_bins=bins)(clip)
    hf = ParakeetFeatureExtractor(feature_size=bins)(clip, sampling_rate=16000, return_tensors="np")
    assert ours.features.shape == (1 + len(clip) // 160, bins) and ours.features.dtype == np.float32
    np.testing.assert_allclose(ours.features, hf["input_features"][0], rtol=0, atol=TOLERANCE)
    assert ours.num_frames == hf["attention_mask"][0].sum()


def test_whisper_features_of_unusual_clips(speech):
    """Over 30 s (cut), under one frame, a length off the hop, and digital silence."""
    long = np.concatenate([speech(name) for name in LIBRIVOX])  # 24.7 s
    long = np.concatenate([long, long[:16000 * 8]])
    clips = {"32.7 s": long, "100 samples": speech("001")[3000:3100], "off the hop": speech("002")[:12345],
             "silence": np.zeros(16000, np.float32)}
    extractor = WhisperFeatureExtractor(feature_size=80)
    for name, clip in clips.items():
        ours = WhisperFeatures()(clip)
        hf = extractor(clip, sampling_rate=16000, return_attention_mask=True, return_tensors="np")
        np.testing.assert_allclose(ours.features, hf["input_features"][0], rtol=0, atol=TOLERANCE, err_msg=name)
        assert ours.num_frames == hf["attention_mask"].sum(), name
        if len(clip) > 200:  # torch.stft cannot reflect-pad a shorter clip by 200
            ours = WhisperFeatures(pad_to_chunk=False)(clip)
            hf = extractor(clip, sampling_rate=16000, padding="longest", return_tensors="np")["input_features"][0]
            np.testing.assert_allclose(ours.features, hf, rtol=0, atol=TOLERANCE, err_msg=name)
    assert WhisperFeatures(pad_to_chunk=False)(long).features.shape == (80, 3000)


def test_parakeet_features_of_quiet_and_band_limited_clips(speech):
    """Where transformers' float32 arithmetic is coarse (speech at -60 dB: 0.1 off its own float64
    run; speech from an 8 kHz source: 8e-4; digital silence: noise of 0.16 where the features are 0),
    the features are its algorithm's, run in float64."""
    clip = speech(LIBRIVOX[0])
    clips = {"-60 dB": clip * np.float32(1e-3), "from 8 kHz": resample(resample(clip, 16000, 8000), 8000, 16000),
             "silence": np.zeros(8000, np.float32),
             "leading silence": np.concatenate([np.zeros(8000, np.float32), clip])}
    for name, audio in clips.items():
        for bins in (80, 128):
            ours = ParakeetFeatures(num_mel_bins=bins)(audio).features
            np.testing.assert_allclose(ours, _parakeet_in_float64(audio, bins), rtol=0, atol=1e-5, err_msg=name)
    assert np.abs(ParakeetFeatures()(clips["silence"]).features).max() < 1e-6


def test_frame_counts_are_the_attention_masks():
    """num_frames(n) without computing features: the count of the attention mask transformers
    returns (Whisper padded: what Qwen2-Audio turns into its number of audio tokens)."""
    whisper, unpadded, parakeet = WhisperFeatures(), WhisperFeatures(pad_to_chunk=False), ParakeetFeatures()
    hf_whisper_extractor, hf_parakeet_extractor = WhisperFeatureExtractor(), ParakeetFeatureExtractor()
    for n in (1, 159, 160, 161, 320, 12345, 480000, 480001, 500000):
        silence = np.zeros(n, np.float32)
        mask = hf_whisper_extractor(silence, sampling_rate=16000, return_attention_mask=True,
                                    return_tensors="np")["attention_mask"]
        assert whisper.num_frames(n) == mask.sum() == whisper(silence).num_frames, n
        if n > 200:  # under n_fft / 2 + 1 samples torch.stft cannot reflect-pad (its numpy path can)
            mask = hf_whisper_extractor(silence, sampling_rate=16000, return_attention_mask=True, padding="longest",
                                        return_tensors="np")["attention_mask"]
            assert unpadded.num_frames(n) == mask.sum(), n
        if n >= 320:
            mask = hf_parakeet_extractor(silence, sampling_rate=16000, return_tensors="np")["attention_mask"]
            assert parakeet.num_frames(n) == mask.sum() == parakeet(silence).num_frames, n


# --- Features: configuration and bad input ----------------------------------------------------

@pytest.mark.parametrize("extractor", [WhisperFeatureExtractor(feature_size=128), WhisperFeatureExtractor(),
                                       ParakeetFeatureExtractor(), ParakeetFeatureExtractor(feature_size=128)],
                         ids=["whisper-128", "whisper-80", "parakeet-80", "parakeet-128"])
def test_config_from_a_preprocessor_config(speech, extractor):
    """A model's preprocessor_config.json -> the audio config keys -> the same features."""
    config = config_from_preprocessor(extractor.to_dict())
    ours = extractor_for(config)
    clip = speech(CARDS[0])
    hf = extractor(clip, sampling_rate=16000, return_tensors="np")["input_features"][0]
    np.testing.assert_allclose(ours(clip).features, hf, rtol=0, atol=TOLERANCE)
    assert ours.num_mel_bins == extractor.feature_size


def test_config_keys():
    assert extractor_for({"feature_extractor": "whisper"}) == WhisperFeatures()
    assert extractor_for({"feature_extractor": "whisper", "num_mel_bins": 128, "pad_to_chunk": False,
                          "engine": "audio_encoder.onnx"}) == WhisperFeatures(num_mel_bins=128, pad_to_chunk=False)
    assert extractor_for({"feature_extractor": "parakeet", "preemphasis": None}) == ParakeetFeatures(preemphasis=None)
    bad = [({"num_mel_bins": 80}, "feature_extractor must be one of"),
           ({"feature_extractor": "wav2vec2"}, "feature_extractor must be one of"),
           ({"feature_extractor": "whisper", "num_mel_bins": 0}, "num_mel_bins must be a positive integer"),
           ({"feature_extractor": "whisper", "hop_length": 160.0}, "hop_length must be a positive integer"),
           ({"feature_extractor": "whisper", "pad_to_chunk": "yes"}, "pad_to_chunk must be true or false"),
           ({"feature_extractor": "parakeet", "win_length": 600}, "win_length 600 is over n_fft 512"),
           ({"feature_extractor": "parakeet", "preemphasis": "0.97"}, "preemphasis must be a number")]
    for config, message in bad:
        with pytest.raises(ValueError, match=message):
            extractor_for(config)
    with pytest.raises(ValueError, match="dither"):
        config_from_preprocessor({**WhisperFeatureExtractor().to_dict(), "dither": 1e-5})
    with pytest.raises(ValueError, match="feature_extractor_type 'Wav2Vec2FeatureExtractor'"):
        config_from_preprocessor({"feature_extractor_type": "Wav2Vec2FeatureExtractor"})


def test_features_refuse_bad_waveforms():
    for extractor in (WhisperFeatures(), ParakeetFeatures()):
        for audio, message in ((np.zeros((2, 1600), np.float32), "one dimension"), (np.zeros(0), "empty"),
                               (np.full(1600, np.nan, np.float32), "NaN or infinite")):
            with pytest.raises(ValueError, match=message):
                extractor(audio)
    with pytest.raises(ValueError, match="no whisper frame unpadded"):
        WhisperFeatures(pad_to_chunk=False)(np.zeros(159, np.float32))
    with pytest.raises(ValueError, match="too short for parakeet features"):
        ParakeetFeatures()(np.zeros(319, np.float32))
