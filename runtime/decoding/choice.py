"""Which decoding strategy a run takes: `--speculation {prompt-lookup,eagle,mtp,none}` on trt-llm-run and
trt-llm-serve, or an input file's top-level "speculation" (`prompt_lookup` spelled either way); by default
the engine's EAGLE draft where it has one, else none. A request's `disable_spec_decode` keeps its meaning:
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


def resolved(asked: str | None, has_draft: bool) -> str:
    """The strategy a run takes on an engine (`has_draft`: it has an EAGLE draft, loaded); SpeculationError,
    one line naming why, where it cannot."""
    name = normalised(asked)
    if name is None:
        return "eagle" if has_draft else "none"
    if name == "eagle" and not has_draft:
        raise SpeculationError("speculation: 'eagle' needs an engine built with an EAGLE draft (draft: in its "
                               "build config), and run without --no-spec-decode")
    if name == "mtp":
        raise SpeculationError("speculation: 'mtp': this engine has no multi-token-prediction heads (MTP drafts are "
                               "not built yet); use prompt-lookup")
    return name
