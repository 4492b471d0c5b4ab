"""Prompts of an exact token length, the same token ids for every engine.

Each prompt is chat-formatted: a passage of notes (cut to fit) followed by one of eight questions, so the
eight rows of a batch differ but have the same length: no engine pads, and greedy tokens of every row can
be compared across engines. The engines get token ids, never text, so tokenization cannot differ.
"""

from __future__ import annotations

QUESTIONS = [
    "Write a long story about a lighthouse keeper who finds a mysterious map.",
    "Explain how photosynthesis works.",
    "List ten tips for learning a new programming language.",
    "What is the capital of France? Describe its history in detail.",
    "Describe the water cycle step by step for a school student.",
    "Write a poem about the sea at night.",
    "Give me a recipe for a simple tomato soup.",
    "Why is the sky blue?",
]

PASSAGE = (
    "The harbour town sits at the mouth of a wide grey river, where the fishing boats come in every "
    "morning before the market opens. In the spring the council repaints the railings along the quay, "
    "and the children race paper boats between the moored dinghies. The old lighthouse at the end of the "
    "breakwater has not guided a ship for thirty years, but the town still lights it on the first night of "
    "winter. The keeper's cottage beside it is now a small museum with maps, lamps, logbooks and a "
    "brass telescope that visitors may look through on clear afternoons. "
    "Most families in the town have worked on the water for generations. They mend nets in the long sheds "
    "by the slipway, smoke fish in brick kilns behind the church, and sell oysters from wooden stalls in "
    "the square. On Saturdays a train brings walkers from the city, who climb the cliff path to the ruined "
    "chapel, eat chips on the harbour wall and argue about the best place to watch the sunset. "
    "The weather changes quickly here. A calm blue morning can turn into a gale by noon, and the fishermen "
    "read the sky as carefully as any forecast: high thin clouds mean wind tomorrow, a red dawn means rain, "
    "and a ring around the moon means a storm within three days. The school teaches every child to swim "
    "before the age of eight, and the lifeboat crew, all volunteers, train on Tuesday evenings whatever the "
    "season. "
    "Last autumn a storm tore the roof from the fish market and flooded the lower streets for two days. "
    "Neighbours carried furniture upstairs, the bakery fed anyone who knocked, and the lifeboat brought "
    "three stranded hikers down from the headland at night. When the water went down the whole town "
    "turned out with brooms and buckets, and within a month the market reopened under a new slate roof "
    "paid for by a concert, a raffle and a very long bake sale. "
    "Visitors often ask why anyone would choose to live in such an exposed place. The answer the townspeople "
    "give is always the same: the light. In the evening the river turns to copper, the cliffs glow pink, "
    "and the boats come home with their lamps lit, one after another, until the harbour is full and quiet. "
)

_MARK = "\x00CONTENT\x00"


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def exact_prompts(tokenizer, length: int, count: int, chat: bool = True) -> list[list[int]]:
    """`count` different prompts of exactly `length` tokens each.

    Chat-formatted with the tokenizer's template (its default system prompt included) unless chat is
    False. When the template and question alone are longer than `length`, the prompt is the passage only.
    """
    if chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], add_generation_prompt=True,
                                             tokenize=False)
        head, tail = text.split(_MARK)
    else:
        head, tail = "", ""
    head_ids = _encode(tokenizer, head + "Here are my notes.\n\n")
    passage = _encode(tokenizer, PASSAGE)
    prompts = []
    for row in range(count):
        tail_ids = _encode(tokenizer, "\n\n" + QUESTIONS[row % len(QUESTIONS)] + tail)
        room = length - len(head_ids) - len(tail_ids)
        # A different slice of the passage per row, repeated when the prompt is longer than the passage.
        start = row * len(passage) // max(count, 1)
        source = passage[start:] + passage * (1 + max(room, length) // len(passage))
        if room > 0:
            ids = head_ids + source[:room] + tail_ids
        else:
            ids = source[:length]
        assert len(ids) == length, (len(ids), length)
        prompts.append(ids)
    return prompts
