"""Video input (runtime/media/video) end to end: tiny random Qwen2.5-VL and Qwen3-VL engines with the real
Qwen tokenizer, run on videos made with numpy and written to mp4 with PyAV, against transformers
`generate` with `pixel_values_videos` (greedy tokens identical).

The oracle prepares its own inputs with transformers' code where it runs without torchvision: the clip
decoded by `video_utils.read_video_pyav`, Qwen3-VL's frames chosen by `Qwen3VLVideoProcessor.sample_frames`
(Qwen2.5-VL's by its processor's formula in torch, its module cannot be imported here), each frame's size
by transformers' `smart_resize`, the patches cut by the video processor's `_preprocess` (resize off: the
frames are resized with Pillow's bicubic first, as the runtime does, torchvision's resize being
unavailable), Qwen3-VL's timestamps by `Qwen3VLProcessor.replace_video_token`, Qwen2.5-VL's
second_per_grid_ts as its processor computes it; `generate` computes the mRoPE positions itself.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import re
import types

import numpy as np
import pytest
import torch
from PIL import Image

import helpers
import vlm_assets
from trt_llm.runtime.app.run_cli import main as run_main
from trt_llm.runtime.cache.context_cache import BLOCK_TOKENS as BLOCK
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.media.video import decode, sampling
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import load_input_file

MAX_NEW = 12
# The engine's per-frame pixel bounds by hand, as test_vlm's: the checkpoint's range narrowed to the
# build's default 4 to 512 tokens an image (a token is (patch * 2)^2 pixels).
PIXEL_BOUNDS = {"qwen2_5_vl": (3136, 512 * 28 * 28), "qwen3_vl": (65536, 512 * 32 * 32)}
PATCH = {"qwen2_5_vl": 14, "qwen3_vl": 16}


@pytest.fixture(scope="module", params=vlm_assets.VLM_FAMILIES)
def vlm(request, tmp_path_factory, npm_tokenizer, build_engine_for):
    family = request.param
    folder = vlm_assets.shared_tiny_vlm(family, tmp_path_factory, npm_tokenizer("qwen3"))
    engine = build_engine_for(folder, max_batch_size=4, max_input_len=768, max_kv_cache_capacity=1024)
    return family, folder, engine


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """Two 2-second clips (12 frames at 6 fps, 84 x 112; 10 frames at 5 fps, 64 x 96), their frames
    as PNG files, and a picture."""
    folder = tmp_path_factory.mktemp("clips")
    out = {"a.mp4": vlm_assets.write_video(folder / "a.mp4", vlm_assets.video_frames(12, 84, 112), 6),
           "b.mp4": vlm_assets.write_video(folder / "b.mp4", vlm_assets.video_frames(10, 64, 96, seed=1), 5)}
    for i, frame in enumerate(vlm_assets.video_frames(5, 56, 84, seed=2)):
        Image.fromarray(frame).save(folder / f"frame{i}.png")
    out["frames"] = [str(folder / f"frame{i}.png") for i in range(5)]
    Image.fromarray((np.random.default_rng(3).random((60, 90, 3)) * 255).astype(np.uint8)).save(folder / "pic.png")
    out["pic.png"] = folder / "pic.png"
    return out


def video(source, **options) -> dict:
    return {"type": "video", "video": source if isinstance(source, list) else str(source), **options}


def request_of(*parts) -> dict:
    """A user message: a str is text, a dict a video part, anything else an image path."""
    content = [{"type": "text", "text": p} if isinstance(p, str) else p if isinstance(p, dict)
               else {"type": "image", "image": str(p)} for p in parts]
    return {"messages": [{"role": "user", "content": content}]}


def run_file(engine, folder, requests: list[dict], runner=None):
    path = folder / "input.json"
    path.write_text(json.dumps({"batch_size": len(requests), "temperature": 0.0, "max_generate_length": MAX_NEW,
                                "requests": requests}))
    loaded = load_input_file(path)
    return (runner or Runner(EngineDir.open(engine), threads=1)).run(loaded, loaded.settings)


# -- the oracle ---------------------------------------------------------------------------------

def _video_processor(family):
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    class Patches(Qwen3VLVideoProcessor):  # torchvision's normalize, in torch
        def normalize(self, image, mean, std, inplace=False, **kwargs):
            return (image - torch.as_tensor(mean).view(-1, 1, 1)) / torch.as_tensor(std).view(-1, 1, 1)

    settings = vlm_assets.PREPROCESSOR[family]
    return Patches(do_resize=False, do_convert_rgb=False, do_sample_frames=False, cap_pixels_per_frame=False,
                   patch_size=settings["patch_size"], image_mean=settings["image_mean"],
                   image_std=settings["image_std"])


def qwen2_sample(metadata, fps, max_frames=768):
    """Qwen2VLVideoProcessor.sample_frames with fps (transformers 5.24), in torch as it is written."""
    total = metadata.total_num_frames
    most = math.floor(min(max_frames, total) / 2) * 2
    count = min(max(total / metadata.fps * fps, 4), most, total)
    count = math.floor(count / 2) * 2
    return torch.arange(0, total, total / count).int().numpy()


def oracle_video(family, part, base):
    """(frames [F, H, W, 3], VideoMetadata with frames_indices) as transformers decodes and samples them."""
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import VideoMetadata, read_video_pyav

    fps = part.get("fps", 2.0)
    if isinstance(part["video"], list):
        frames = np.stack([np.asarray(Image.open(base / p).convert("RGB")) for p in part["video"]])
        return frames, VideoMetadata(total_num_frames=len(frames), fps=fps, frames_indices=list(range(len(frames))))
    most = part.get("max_frames", 768)
    if family == "qwen3_vl":
        sample = functools.partial(Qwen3VLVideoProcessor(max_frames=most).sample_frames, fps=fps)
    else:
        sample = functools.partial(qwen2_sample, fps=fps, max_frames=most)
    return read_video_pyav(str(base / part["video"]), lambda metadata, **kw: sample(metadata))


def oracle_size(family, frames, height, width):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as video_smart_resize

    low, high = PIXEL_BOUNDS[family]
    if family == "qwen3_vl":
        return video_smart_resize(frames, height, width, 2, 32, low * frames, high * frames)
    return smart_resize(height, width, 28, low, high)


_HF = {}


def transformers_greedy(family, folder, request: dict, base) -> list[int]:
    from transformers import AutoModelForImageTextToText, AutoTokenizer, Qwen2VLImageProcessorPil
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    if folder not in _HF:
        _HF[folder] = (AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval(),
                       AutoTokenizer.from_pretrained(folder))
    model, tokenizer = _HF[folder]
    messages = request["messages"]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    parts = [p for m in messages if isinstance(m["content"], list) for p in m["content"] if p["type"] != "text"]
    processor = _video_processor(family)
    extra, pieces, seconds, picture_rows, video_rows = {}, re.split(r"(<\|image_pad\|>|<\|video_pad\|>)", text), [], [], []
    pictures = [Image.open(base / p["image"]).convert("RGB") for p in parts if p["type"] == "image"]
    if pictures:
        settings = {k: v for k, v in vlm_assets.PREPROCESSOR[family].items()
                    if k not in ("image_processor_type", "size", "min_pixels", "max_pixels")}
        low, high = PIXEL_BOUNDS[family]
        images = Qwen2VLImageProcessorPil(**settings, min_pixels=low, max_pixels=high)(images=pictures, return_tensors="pt")
        extra.update(pixel_values=images["pixel_values"], image_grid_thw=images["image_grid_thw"])
        picture_rows = [int(g.prod()) // 4 for g in images["image_grid_thw"]]
    clips, metadata = [], []
    for part in (p for p in parts if p["type"] == "video"):
        frames, meta = oracle_video(family, part, base)
        height, width = oracle_size(family, len(frames), *frames.shape[1:3])
        clips.append(np.stack([np.asarray(Image.fromarray(f).resize((width, height), Image.Resampling.BICUBIC))
                               for f in frames]))
        metadata.append(meta)
        seconds.append(2 / meta.sampled_fps)
    if clips:
        videos = processor(videos=clips, video_metadata=metadata, return_metadata=True, return_tensors="pt")
        extra.update(pixel_values_videos=videos["pixel_values_videos"], video_grid_thw=videos["video_grid_thw"])
        if family == "qwen2_5_vl":
            extra["second_per_grid_ts"] = torch.tensor(seconds)
        names = types.SimpleNamespace(video_processor=processor, video_token="<|video_pad|>",
                                      vision_start_token="<|vision_start|>", vision_end_token="<|vision_end|>")
        names._calculate_timestamps = functools.partial(Qwen3VLProcessor._calculate_timestamps, names)
        for i, grid in enumerate(videos["video_grid_thw"]):
            video_rows.append("<|video_pad|>" * (int(grid.prod()) // 4) if family == "qwen2_5_vl"
                              else Qwen3VLProcessor.replace_video_token(names, videos, i))
    images_left, videos_left = iter(picture_rows), iter(video_rows)
    text = "".join("<|image_pad|>" * next(images_left) if piece == "<|image_pad|>" else next(videos_left)
                   if piece == "<|video_pad|>" else piece for piece in pieces)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    kinds = (ids == vlm_assets.IMAGE_TOKEN).long() + 2 * (ids == vlm_assets.VIDEO_TOKEN).long()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW,
                             do_sample=False, mm_token_type_ids=kinds, **extra)
    return out[0, ids.shape[1]:].tolist()


# -- sampling and sizes against transformers' code -------------------------------------------------

def test_frame_choice_and_sizes_are_transformers():
    """Frame indices (Qwen3-VL: transformers' sample_frames; Qwen2.5-VL: its formula in torch), the
    clip sizes of Qwen3-VL's smart_resize and Qwen3-VL's timestamps, over many clips."""
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as video_smart_resize
    from transformers.video_utils import VideoMetadata

    for total in (2, 3, 7, 10, 13, 30, 61, 240, 1001):
        for source_fps, fps, most in ((30.0, 2.0, 768), (6.0, 2.0, 768), (24.0, 1.5, 16), (25.0, 4.0, 9), (5.0, 2.0, 4)):
            metadata = VideoMetadata(total_num_frames=total, fps=source_fps)
            if total >= 2:
                assert sampling.qwen2_indices(total, source_fps, fps, most, 2).tolist() == \
                    qwen2_sample(metadata, fps, most).tolist(), (total, source_fps, fps, most)
            expected = Qwen3VLVideoProcessor(max_frames=most).sample_frames(metadata, fps=fps)
            assert sampling.qwen3_indices(total, source_fps, fps, most).tolist() == expected.tolist()
            stamps = Qwen3VLProcessor._calculate_timestamps(None, expected, source_fps, 2)
            assert sampling.timestamps(expected, source_fps, 2) == stamps
    for frames, height, width in ((4, 64, 96), (5, 30, 2000), (16, 1080, 1920), (3, 17, 40), (768, 480, 640)):
        for low, high in ((65536, 524288), (4096, 16384), (1024, 10 ** 7)):
            assert sampling.smart_resize_video(frames, height, width, 2, 32, low, high) == \
                video_smart_resize(frames, height, width, 2, 32, low, high)
    # by hand: 12 frames at 6 fps sampled at 2 a second keep 0, 3, 6, 9; Qwen2.5-VL's step
    # tokens_per_second 4 x (2 / (4 / 12 x 6)) = 4
    assert sampling.qwen2_indices(12, 6.0, 2.0, 768, 2).tolist() == [0, 3, 6, 9]
    assert sampling.time_interval(4, 4, 12, 6.0, 2) == 4.0


# -- end to end ---------------------------------------------------------------------------------

def test_videos_match_transformers(vlm, clips, tmp_path):
    """A clip file; a list of frame images at 1 frame a second; an image and a clip of another size
    with max_frames in one request; a text-only request beside them."""
    family, folder, engine = vlm
    requests = [request_of(video(clips["a.mp4"]), "Describe this video."),
                request_of(video(clips["frames"], fps=1.0), "What happens?"),
                {"messages": [{"role": "user", "content": "Hello there"}]},
                request_of(clips["pic.png"], "and", video(clips["b.mp4"], max_frames=6, fps=3.0), "Compare them.")]
    output = run_file(engine, tmp_path, requests)
    for request, response in zip(requests, output.responses):
        assert response.finish_reason in ("end-of-sequence", "max-length"), response.error
        assert response.output_token_ids == transformers_greedy(family, folder, request, tmp_path)
    assert output.responses[0].prompt_tokens > output.responses[2].prompt_tokens


def test_the_same_clip_as_a_data_url_and_the_cache(vlm, clips, tmp_path):
    """The clip as a path and as a data URL: the same tokens, encoded once; other sampling options are
    another encoding."""
    _, _, engine = vlm
    data_url = "data:video/mp4;base64," + base64.b64encode(clips["a.mp4"].read_bytes()).decode()
    runner = Runner(EngineDir.open(engine), threads=1)
    requests = [request_of(video(clips["a.mp4"]), "What is it?"), request_of(video(data_url), "What is it?"),
                request_of(video(clips["a.mp4"], max_frames=2), "What is it?")]
    responses = run_file(engine, tmp_path, requests, runner).responses
    assert responses[0].output_token_ids == responses[1].output_token_ids
    assert responses[0].prompt_tokens > responses[2].prompt_tokens  # 2 frames, not 4
    assert runner.vision.encoded_videos == 2


def test_a_bad_video_fails_its_request_alone_and_the_file_is_written(vlm, clips, tmp_path):
    _, _, engine = vlm
    (tmp_path / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 64)
    big = np.zeros((112, 84, 3), np.uint8)
    Image.fromarray(big).save(tmp_path / "big.png")
    requests = [request_of(video(clips["a.mp4"]), "Fine."),
                request_of("Look:", video("missing.mp4")),
                request_of(video("broken.mp4")),
                request_of(video(str(clips["pic.png"]))),
                request_of(video([clips["frames"][0]])),
                request_of(video([clips["frames"][0], str(tmp_path / "big.png")])),
                request_of(video("https://example.com/cat.mp4")),
                request_of(video(clips["a.mp4"]), "Fine too.")]
    source, out = tmp_path / "in.json", tmp_path / "out.json"
    source.write_text(json.dumps({"temperature": 0.0, "max_generate_length": 4, "requests": requests}))
    assert run_main([str(source), "--engine-dir", str(engine), "-o", str(out), "--threads", "1"]) == 1
    responses = json.loads(out.read_text())["responses"]
    assert [r["finish_reason"] == "error" for r in responses] == [False] + [True] * 6 + [False]
    errors = [r.get("error", "") for r in responses]
    assert "requests[1].messages[0].content[1]: video 'missing.mp4'" in errors[1] and "no such file" in errors[1]
    assert "requests[2].messages[0].content[0]: video 'broken.mp4'" in errors[2] and "cannot decode it" in errors[2]
    assert "requests[3].messages[0].content[0]" in errors[3] and "not a video in a supported container" in errors[3]
    assert "requests[4].messages[0].content[0]" in errors[4] and "fewer than one temporal patch (2)" in errors[4]
    assert "requests[5].messages[0].content[0]: video frame [1]" in errors[5] and "share a size" in errors[5]
    assert "requests[6].messages[0].content[0]" in errors[6] and "nothing is fetched" in errors[6]
    assert all(len(e.splitlines()) == 1 for e in errors[1:7])
    assert responses[0]["generated_tokens"] > 0 and responses[7]["generated_tokens"] > 0


def test_the_limits_are_checked_before_decoding_and_encoding(vlm, clips, tmp_path, monkeypatch):
    from PIL import Image as PILImage

    _, _, engine = vlm
    runner = Runner(EngineDir.open(engine), threads=1)
    decoded = []
    monkeypatch.setattr(decode, "_decode", lambda *args: decoded.append(1) or (_ for _ in ()).throw(AssertionError))

    def refused(**options):
        (response,) = run_file(engine, tmp_path, [request_of(video(clips["a.mp4"], **options))], runner).responses
        assert response.finish_reason == "error" and "requests[0].messages[0].content[0]" in response.error
        return response.error

    monkeypatch.setattr(decode, "MAX_SOURCE_FRAMES", 10)
    assert "12 frames, over the limit of 10 frames a video" in refused()
    monkeypatch.setattr(decode, "MAX_SOURCE_FRAMES", 10 ** 5)
    monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", 5000)
    assert "112x84 are 9,408 pixels, over the limit of 5,000" in refused()
    monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", 10 ** 8)
    monkeypatch.setattr(runner.vision, "max_request_tokens", 1)
    assert "need 2 image tokens at least, more than the 1 the request's max_image_tokens leaves" in refused()
    assert decoded == [] and getattr(runner.vision, "encoded_videos", 0) == 0
    monkeypatch.undo()
    monkeypatch.setitem(runner.preparer.limits, "max_input_len", 30)
    (response,) = run_file(engine, tmp_path, [request_of(video(clips["a.mp4"]))], runner).responses
    assert "longer than the engine's max_input_len 30" in response.error
    assert getattr(runner.vision, "encoded_videos", 0) == 0  # refused before the tower ran
    path = tmp_path / "input.json"
    path.write_text(json.dumps({"requests": [request_of(video(clips["a.mp4"], max_frames=769))]}))
    loaded = load_input_file(path)
    assert "requests[0].messages[0].content[0].max_frames: 769 is greater than the maximum 768" in loaded.requests[0].message


def test_the_same_video_is_restored_past_its_tokens_and_another_is_not(vlm, clips, tmp_path):
    """Context reuse keyed by the video's content: the same clip (as a data URL) restores past its
    tokens; a clip of the same size and length with other frames restores nothing past its first
    token. Tokens are bypass's."""
    _, _, engine = vlm
    other = vlm_assets.write_video(tmp_path / "other.mp4", vlm_assets.video_frames(12, 84, 112, seed=9), 6)
    data_url = "data:video/mp4;base64," + base64.b64encode(clips["a.mp4"].read_bytes()).decode()
    question = "Describe this clip in a few words, please."
    requests = [request_of(video(clips["a.mp4"]), question), request_of(video(data_url), question),
                request_of(video(other), question)]
    responses, prompts = helpers.reuse_run(engine, tmp_path, requests, MAX_NEW)
    spans = prompts[0][1]
    assert prompts[2][0] == prompts[0][0] and prompts[2][1] == spans  # equal tokens: only the content differs
    first, last = spans[0][0], spans[-1][0] + spans[-1][1]
    assert responses[1].reused_tokens > last
    assert responses[2].reused_tokens == first // BLOCK * BLOCK
    assert [r.output_token_ids for r in responses] == helpers.tokens_of_bypass(engine, tmp_path, requests, MAX_NEW)


def test_the_server_takes_a_video_url(vlm, clips, tmp_path):
    """POST /v1/chat/completions with a video_url data URL (vLLM's part) and max_frames: the file runner's
    answer to the same video part."""
    from test_server import LiveServer
    from trt_llm.server.app import ServerConfig, create_app

    _, _, engine = vlm
    data_url = "data:video/mp4;base64," + base64.b64encode(clips["b.mp4"].read_bytes()).decode()
    expected = run_file(engine, tmp_path, [request_of(video(data_url, max_frames=4), "What is it?")]).responses[0]
    live = LiveServer(create_app(Runner(EngineDir.open(engine), threads=1, scheduling="continuous"),
                                 ServerConfig(model_name="tiny", max_rows=2)))
    try:
        answer = live.client().chat.completions.create(
            model="tiny", temperature=0, max_tokens=MAX_NEW,
            messages=[{"role": "user", "content": [{"type": "video_url", "video_url": {"url": data_url, "max_frames": 4}},
                                                   {"type": "text", "text": "What is it?"}]}])
    finally:
        live.close()
    assert answer.choices[0].message.content == expected.output_text
    assert answer.usage.prompt_tokens == expected.prompt_tokens
