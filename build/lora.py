"""Where LoRA inputs go in the decoder graph: one (A, B) input pair per packed projection and layer.

Projections are packed (q/k/v into one matmul, gate/up into another), so their adapters are packed
too: A stacks the targeted modules' A matrices along the rank axis, and B places each module's B as a
block at that module's output rows and rank columns (zeros elsewhere). Rows of a batch carry their own
adapter (or zeros), so one batch may mix adapters.

    lora_{group}_a_{layer}  [batch, rank, in]    rank = the group's stacked rank
    lora_{group}_b_{layer}  [batch, out, rank]   out = the packed projection's width; scale folded in
"""

from __future__ import annotations

from trt_llm.build.models.llama import ModelDims

# group -> the modules packed into its projection, in packing order
GROUPS = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}


def module_shapes(dims: ModelDims, intermediate_size: int) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each projection."""
    h, q, kv = dims.hidden_size, dims.num_heads * dims.head_dim, dims.kv_heads * dims.head_dim
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, intermediate_size), "up_proj": (h, intermediate_size),
            "down_proj": (intermediate_size, h)}


def layout(dims: ModelDims, intermediate_size: int, max_rank: int, target_modules: list[str]) -> dict:
    """The manifest's description of the LoRA inputs; the runtime lays adapters out from it."""
    shapes = module_shapes(dims, intermediate_size)
    groups = []
    for name, modules in GROUPS.items():
        targeted = [m for m in modules if m in target_modules]
        if not targeted:
            continue
        out_offsets, offset = {}, 0
        for m in modules:
            out_offsets[m] = offset
            offset += shapes[m][1]
        groups.append({"name": name, "modules": targeted, "in_features": shapes[modules[0]][0],
                       "out_features": offset, "out_offsets": {m: out_offsets[m] for m in targeted},
                       "module_out_features": {m: shapes[m][1] for m in targeted}})
    return {"max_rank": max_rank, "target_modules": list(target_modules), "num_layers": dims.num_layers,
            "groups": groups}


def input_names(lora_layout: dict) -> list[str]:
    from trt_llm.schemas.graph_spec import lora_inputs

    return [spec.name for spec in lora_inputs(lora_layout)]
