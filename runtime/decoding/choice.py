"""Which decoding strategy a run takes: `--speculation {prompt-lookup,eagle,mtp,none}` on trt-llm-run and
trt-llm-serve, or an input file's top-level "speculation" (`prompt_lookup` spelled either way); by default
the engine's draft where it has one (an EAGLE3 draft: eagle; a multi-token-prediction head: mtp), else none. A request's `disable_spec_decode` keeps its meaning:
vanilla decoding for its batch (a continuous run: for itself)."""

from __future__ import annotations

SPECULATIONS = ("prompt-lookup", "eagle", "mtp", "none")


class SpeculationError(ValueError):
    pass


def normalised(value: str | None) -> str | None:
    """The strategy's canonical name (None stays None: the default); SpeculationError for another."""
    if value is None:
        return None
    name = value.replace("_", "-")
    if name not in SPECULATIONS:
        raise SpeculationError(f"speculation: {value!r} is not a strategy; choose one of {', '.join(SPECULATIONS)}")
    return name


NEEDS = {"eagle": "an EAGLE draft (draft: in its build config)",
         "mtp": "the checkpoint's multi-token-prediction head (mtp: true in its build config)"}


def resolved(asked: str | None, draft: str | None) -> str:
    """The strategy a run takes on an engine whose loaded draft is `draft` ("eagle", "mtp" or None);
    SpeculationError, one line naming why, where it cannot."""
    name = normalised(asked)
    if name is None:
        return draft or "none"
    if name in NEEDS and name != draft:
        raise SpeculationError(f"speculation: {name!r} needs an engine built with {NEEDS[name]}, and run without "
                               "--no-spec-decode")
    return name
