"""Multilingual Whisper engines: a tiny random multilingual WhisperForConditionalGeneration built by
our builder and run on real speech (Debian's LibriVox clips), against transformers' `generate(...,
language="en", task="transcribe")`: greedy tokens identical, with and without a previous-text prompt.

No multilingual Whisper weights can be had offline, so the model is random (seeded, d_model 64, 2 + 2
layers, weights made non-trivial as tests/test_whisper_graphs.py does) but shaped as the real ones
where it matters to the runtime: 51,865 tokens, 1,500 encoder positions (the real 3,000-frame features
and the audio limits apply), 80 mel bins, 448 decoder positions. Its tokenizer is the real one:
openai-whisper 20230124 (PyPI) ships `whisper/assets/multilingual/{vocab.json,merges.txt}`, the byte
BPE that the Hugging Face openai/whisper-* tokenizers were made from, plus the 107 special tokens
in tiny.en's order (<|endoftext|> 50257, <|startoftranscript|> 50258, the 99 languages from <|en|>
50259, <|translate|> 50358, <|transcribe|> 50359, <|startoflm|>, <|startofprev|> 50361,
<|nocaptions|>, <|notimestamps|> 50363) and the 1,501 timestamps. Its generation config is
openai/whisper-tiny's: is_multilingual, lang_to_id, task_to_id, the prompt tokens, and
suppress_tokens computed by openai-whisper's own rule (its `non_speech_tokens` plus the task and
prompt tokens; the same rule gives tiny.en's published list exactly, checked below).

These runs name the language (whisper.language "en"), so the reference is generate with language="en";
without one the language is detected as transformers' `detect_language` does (the last test). A random model emits timestamp tokens, which
transformers' generate takes as segment ends and seeks on in further decoder calls; the real models
never do after <|notimestamps|>, and an engine request is one decode, so the reference is one call
(`force_unique_generate_call`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import whisper_assets
from assets import AssetUnavailable, make_nontrivial
from whisper_assets import multilingual_tokenizer_dir

from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import load_input_file

VOCAB = 51865
EOT, SOT, EN, TRANSLATE, TRANSCRIBE, PREV, NOTIMESTAMPS = 50257, 50258, 50259, 50358, 50359, 50361, 50363
NEW_TOKENS = 48  # the random model rarely ends: every clip runs to this many


def non_speech_tokens(tokenizer) -> list[int]:
    """openai-whisper's `Tokenizer.non_speech_tokens`: symbols and speaker-tag brackets, a word-initial
    hyphen or quote, and the first token of each musical sign."""
    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False)

    symbols = list("\"#()*+/:;<=>@[\\]^_`{|}~「」『』")
    symbols += ["<<", ">>", "<<<", ">>>", "--", "---", "-(", "-[", "('", '("', "((", "))", "(((", ")))", "[[", "]]",
                "{{", "}}", "♪♪", "♪♪♪"]
    miscellaneous = set("♩♪♫♬♭♮♯")
    result = {encode(" -")[0], encode(" '")[0]}
    for symbol in symbols + list(miscellaneous):
        for tokens in (encode(symbol), encode(" " + symbol)):
            if len(tokens) == 1 or symbol in miscellaneous:
                result.add(tokens[0])
    return sorted(result)


def suppress_tokens(tokenizer) -> list[int]:
    """The published generation configs' suppress_tokens: the non-speech tokens, the task tokens and
    the prompt tokens a transcription never generates."""
    prompt = ("<|startoftranscript|>", "<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>",
              "<|nocaptions|>")
    return sorted({*non_speech_tokens(tokenizer), *tokenizer.convert_tokens_to_ids(list(prompt))})


def make_multilingual_whisper(folder: Path, tokenizer_dir: Path) -> Path:
    from transformers import (
        AutoTokenizer,
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
    )

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = tokenizer.convert_tokens_to_ids
    languages = {t: ids(t) for t in tokenizer.all_special_tokens if SOT < ids(t) < TRANSLATE}
    suppress, begin_suppress = suppress_tokens(tokenizer), [ids("Ġ"), EOT]  # 220: a lone space
    config = WhisperConfig(
        vocab_size=len(tokenizer), d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=1500,
        max_target_positions=448, num_mel_bins=80, activation_function="gelu", scale_embedding=False,
        pad_token_id=EOT, bos_token_id=EOT, eos_token_id=EOT, decoder_start_token_id=SOT,
        suppress_tokens=suppress, begin_suppress_tokens=begin_suppress, tie_word_embeddings=True,
        init_std=0.2,  # transformers' 0.02 makes every greedy token the same one
        architectures=["WhisperForConditionalGeneration"])
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config).eval()
    make_nontrivial(model)
    # openai/whisper-tiny's generation config (forced_decoder_ids: detect, then transcribe, which
    # generate's language= and task= override)
    model.generation_config = GenerationConfig(
        begin_suppress_tokens=begin_suppress, suppress_tokens=suppress, bos_token_id=EOT, eos_token_id=EOT,
        pad_token_id=EOT, decoder_start_token_id=SOT, is_multilingual=True, lang_to_id=languages,
        forced_decoder_ids=[[1, None], [2, TRANSCRIBE]],
        task_to_id={"transcribe": TRANSCRIBE, "translate": TRANSLATE}, no_timestamps_token_id=NOTIMESTAMPS,
        prev_sot_token_id=PREV, max_initial_timestamp_index=50, max_length=448, return_timestamps=False)
    model.save_pretrained(folder)
    extractor = WhisperFeatureExtractor(feature_size=config.num_mel_bins)
    WhisperProcessor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(folder)
    extractor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tokenizer_dir():
    try:
        return multilingual_tokenizer_dir()
    except AssetUnavailable as error:
        pytest.skip(f"the multilingual Whisper tokenizer is unavailable: {error}")


@pytest.fixture(scope="module")
def model_dir(tokenizer_dir, tmp_path_factory):
    return make_multilingual_whisper(tmp_path_factory.mktemp("whisper-multilingual"), tokenizer_dir)


@pytest.fixture(scope="module")
def clips(librivox_clips):
    return [clip.path for clip in librivox_clips]


@pytest.fixture(scope="module")
def engine(model_dir, build_engine_for):
    return build_engine_for(model_dir, max_batch_size=4)


def transcribe_request(clip, text: str | None = None) -> dict:
    content = [{"type": "audio", "audio": str(clip)}] + ([{"type": "text", "text": text}] if text else [])
    return {"messages": [{"role": "user", "content": content}]}


def run_file(engine, folder, requests: list[dict], whisper: dict | None = None, **runner_options):
    path = folder / "input.json"
    path.write_text(json.dumps({"batch_size": 4, "temperature": 0.0, "max_generate_length": NEW_TOKENS,
                                "requests": requests, "whisper": {"language": "en", **(whisper or {})}}))
    loaded = load_input_file(path)
    return Runner(EngineDir.open(engine), threads=2, **runner_options).run(loaded, loaded.settings)


_HF = {}


def transformers_tokens(model_dir, clip, text: str | None = None) -> list[int]:
    """transformers' greedy English transcription of one clip, in one decoder call: the tokens after
    its decoder prompt, without the end of text."""
    from transformers import WhisperForConditionalGeneration, WhisperProcessor
    from trt_llm.runtime.media.audio.decode import load_audio

    if model_dir not in _HF:
        _HF[model_dir] = (WhisperForConditionalGeneration.from_pretrained(model_dir).eval(),
                          WhisperProcessor.from_pretrained(model_dir))
    model, processor = _HF[model_dir]
    features = processor(load_audio(str(clip)), sampling_rate=16000, return_tensors="pt").input_features
    extra = {"prompt_ids": torch.tensor(processor.get_prompt_ids(text))} if text else {}
    with torch.inference_mode():
        out = model.generate(features, language="en", task="transcribe", do_sample=False, num_beams=1,
                             max_new_tokens=NEW_TOKENS, force_unique_generate_call=True, return_dict_in_generate=True,
                             **extra).sequences[0].tolist()
    start = out.index(NOTIMESTAMPS) + 1
    assert out[start - 4:start] == [SOT, EN, TRANSCRIBE, NOTIMESTAMPS]
    return [t for t in out[start:] if t != EOT]


def test_the_checkpoint_is_multilingual_whispers(model_dir, engine):
    """The tokenizer has the published layout, the suppression rule gives tiny.en's published list,
    and the engine's audio config carries the languages and tasks."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    names = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|translate|>", "<|transcribe|>",
             "<|startofprev|>", "<|notimestamps|>", "<|0.00|>", "<|30.00|>"]
    assert tokenizer.convert_tokens_to_ids(names) == [EOT, SOT, EN, TRANSLATE, TRANSCRIBE, PREV, NOTIMESTAMPS,
                                                      NOTIMESTAMPS + 1, VOCAB - 1]
    assert len(tokenizer) == VOCAB
    text = " Ça va très bien, 你好, Grüße"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    english = whisper_assets.whisper_tiny_en_dir()
    published = json.loads((english / "generation_config.json").read_text())["suppress_tokens"]
    assert suppress_tokens(AutoTokenizer.from_pretrained(english)) == published
    audio = json.loads((engine / "audio" / "config.json").read_text())
    assert audio["is_multilingual"] and len(audio["lang_to_id"]) == 99 and audio["lang_to_id"]["<|en|>"] == EN
    assert audio["task_to_id"] == {"transcribe": TRANSCRIBE, "translate": TRANSLATE}
    assert (audio["decoder_start_token_id"], audio["prev_token_id"], audio["no_timestamps_token_id"]) == \
        (SOT, PREV, NOTIMESTAMPS)
    assert audio["window_frames"] == 3000 and audio["max_target_positions"] == 448


def test_transcriptions_are_token_identical_to_generate_in_english(engine, model_dir, clips, tmp_path):
    """Five clips in two static batches (4 + 1), then continuously batched: each transcription is
    transformers' own, after the prompt <|startoftranscript|><|en|><|transcribe|><|notimestamps|>."""
    requests = [transcribe_request(clip) for clip in clips]
    static = run_file(engine, tmp_path, requests)
    for clip, response in zip(clips, static.responses):
        assert response.finish_reason in ("end-of-sequence", "max-length"), response.error
        assert response.prompt_tokens == 4
        assert [t for t in response.output_token_ids if t != EOT] == transformers_tokens(model_dir, clip)
    assert len({tuple(r.output_token_ids) for r in static.responses}) == len(clips)  # the clips matter
    continuous = run_file(engine, tmp_path, requests, scheduling="continuous")
    assert [r.output_token_ids for r in continuous.responses] == [r.output_token_ids for r in static.responses]


def test_a_previous_text_prompt_is_transformers_prompt_ids(engine, model_dir, clips, tmp_path):
    text = "Mr. Dashwood, Sense and Sensibility."
    output = run_file(engine, tmp_path, [transcribe_request(clips[0], text), transcribe_request(clips[1])])
    prompted, plain = output.responses
    assert prompted.finish_reason in ("end-of-sequence", "max-length"), prompted.error
    assert [t for t in prompted.output_token_ids if t != EOT] == transformers_tokens(model_dir, clips[0], text)
    assert [t for t in plain.output_token_ids if t != EOT] == transformers_tokens(model_dir, clips[1])


def test_without_a_language_it_is_detected_as_transformers_does(engine, model_dir, clips, tmp_path):
    """transformers' detect_language: a decode of <|startoftranscript|> over the clip's first window,
    argmax over the language tokens; the response reports it, and the prompt carries it."""
    from transformers import WhisperForConditionalGeneration, WhisperProcessor
    from trt_llm.runtime.media.audio.decode import load_audio

    model = WhisperForConditionalGeneration.from_pretrained(model_dir).eval()
    processor = WhisperProcessor.from_pretrained(model_dir)
    languages = {v: k.strip("<|>") for k, v in model.generation_config.lang_to_id.items()}
    output = run_file(engine, tmp_path, [transcribe_request(clip) for clip in clips[:2]], whisper={"language": None})
    for clip, response in zip(clips, output.responses):
        features = processor(load_audio(str(clip)), sampling_rate=16000, return_tensors="pt").input_features
        with torch.inference_mode():
            (expected,) = model.detect_language(features).tolist()
        assert response.finish_reason != "error", response.error
        assert response.language == languages[expected]
        assert f"<|{languages[expected]}|><|transcribe|><|notimestamps|>" in response.formatted_complete_request
