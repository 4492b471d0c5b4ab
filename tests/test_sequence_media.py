"""A prompt's media rows (runtime/media/sequence_media.py) on hand-made prompts: placeholders widened
(bare, and wrapped as Gemma 4's processor wraps a clip), and a prompt's image rows moved past the clips
widened after them, as one prompt with images and audio needs (Gemma 4)."""

from types import SimpleNamespace

import numpy as np
import pytest

from trt_llm.runtime.media.sequence_media import SequenceMedia, widen_placeholders, widened_position

IMAGE, AUDIO, BOA, EOA = 7, 9, 90, 91


def part(tokens: int, both_ways: bool = True, value: float = 0.0):
    return SimpleNamespace(tokens=tokens, embeds=np.full((tokens, 2), value, np.float32), deepstack=None,
                           both_ways=both_ways)


def test_placeholders_widen_bare_and_wrapped():
    ids = [1, AUDIO, 2, AUDIO, 3]
    assert widen_placeholders(ids, AUDIO, [2, 3]) == ([1, AUDIO, AUDIO, 2, AUDIO, AUDIO, AUDIO, 3], [1, 4])
    assert widen_placeholders(ids, AUDIO, [2, 1], (BOA, EOA)) == (
        [1, BOA, AUDIO, AUDIO, EOA, 2, BOA, AUDIO, EOA, 3], [2, 7])


def test_image_rows_move_past_the_clips_before_them():
    # an image (3 tokens at 1..3), a clip, a second image (2 tokens), a second clip
    ids = [0, IMAGE, IMAGE, IMAGE, 5, AUDIO, 6, IMAGE, IMAGE, AUDIO]
    images = SequenceMedia([(1, part(3, value=1.0)), (7, part(2, value=2.0))], keys=("i1", "i2"))
    widened, offsets = widen_placeholders(ids, AUDIO, [4, 1], (BOA, EOA))
    clips = SequenceMedia([(offsets[0], part(4, False, 3.0)), (offsets[1], part(1, False, 4.0))], keys=("a1", "a2"))
    media = images.joined(clips, widened_position(ids, AUDIO, [6, 3]))
    assert [offset for offset, _ in media.rows] == [1, 6, 12, 15] and media.keys == ("i1", "a1", "i2", "a2")
    # each row's values land at its own tokens of the widened prompt
    embeds = np.zeros((len(widened), 2), np.float32)
    media.write_rows(embeds, None, 0, len(widened))
    expected = {IMAGE: {1.0, 2.0}, AUDIO: {3.0, 4.0}}
    for token, row in zip(widened, embeds[:, 0]):
        assert row in expected.get(token, {0.0}), (token, row)
    assert [widened[o] for o, _ in media.rows] == [IMAGE, AUDIO, IMAGE, AUDIO]
    assert media.blocks() == ((1, 3), (12, 2))  # the images only: a clip's tokens never see ahead


def test_positions_from_a_multimodal_rope_are_refused():
    with pytest.raises(ValueError, match="1-D positions"):
        SequenceMedia([], rope=object()).joined(SequenceMedia([]), lambda p: p)
