"""Where LoRA inputs go in the decoder graph: one (A, B) input pair per packed projection and layer.

Projections are packed (q/k/v into one matmul, gate/up into another), so their adapters are packed
too: A stacks the targeted modules' A matrices along the rank axis, and B places each module's B as a
block at that module's output rows and rank columns (zeros elsewhere). Rows of a batch carry their own
adapter (or zeros), so one batch may mix adapters.

    lora_{group}_a_{layer}  [batch, rank, in]    rank = the group's stacked rank
    lora_{group}_b_{layer}  [batch, out, rank]   out = the packed projection's width; scale folded in

The groups are the same on every layer (`groups`), or each layer's own where the layers differ in shape
(`layer_groups`, Gemma 4's): schemas/graph_spec.lora_groups_at reads either.
"""

from __future__ import annotations

from torch import nn

from trt_llm.build.models.skeleton import ModelDims
from trt_llm.schemas.build_config import LORA_MODULES

# group -> the modules packed into its projection, in packing order
GROUPS = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}
# A checkpoint that packs them itself (Phi-3): one module per group, as its adapters name them.
PACKED_GROUPS = {"qkv": ("qkv_proj",), "o": ("o_proj",), "gate_up": ("gate_up_proj",), "down": ("down_proj",)}
PACKED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
          "up_proj": "gate_up_proj"}


def module_shapes(dims: ModelDims, intermediate_size: int) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each projection."""
    h, q, kv = dims.hidden_size, dims.num_heads * dims.head_dim, dims.kv_heads * dims.head_dim
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, intermediate_size), "up_proj": (h, intermediate_size),
            "down_proj": (intermediate_size, h), "qkv_proj": (h, q + 2 * kv),
            "gate_up_proj": (h, 2 * intermediate_size)}


def targets_of(target_modules: list[str], packed: bool, experts: bool) -> list[str]:
    """The build config's target_modules as the checkpoint names them: on a packed checkpoint the
    separate names mean the packed projection; a mixture of experts' MLPs take none. Raises
    ValueError (the build's one line) for a module the checkpoint does not have."""
    if packed:
        targets = list(dict.fromkeys(PACKED.get(m, m) for m in target_modules))
    else:
        for m in target_modules:
            if m in PACKED.values():
                raise ValueError(f"lora: target_modules {m!r} is a packed projection (Phi-3's); this model has "
                                 "q_proj, k_proj, v_proj, gate_proj and up_proj")
        targets = list(target_modules)
    mlp = [m for m in targets if m in ("gate_proj", "up_proj", "gate_up_proj", "down_proj")]
    if experts and mlp and set(target_modules) == set(LORA_MODULES):  # the default: the attention's only
        return [m for m in targets if m not in mlp]
    if experts and mlp:
        raise ValueError(f"lora: target_modules {', '.join(mlp)}: a mixture-of-experts model's MLPs take no LoRA "
                         "here; target q_proj, k_proj, v_proj and o_proj")
    return targets


def _groups(shapes: dict[str, tuple[int, int]], target_modules: list[str], packed: bool = False) -> list[dict]:
    """The packed groups of a layer whose projections have `shapes` (a module it lacks is absent): each
    group's projection packs the modules the layer has, in GROUPS order, as the graph packs them."""
    groups = []
    for name, modules in (PACKED_GROUPS if packed else GROUPS).items():
        present = [m for m in modules if m in shapes]
        targeted = [m for m in present if m in target_modules]
        if not targeted:
            continue
        out_offsets, offset = {}, 0
        for m in present:
            out_offsets[m] = offset
            offset += shapes[m][1]
        groups.append({"name": name, "modules": targeted, "in_features": shapes[present[0]][0],
                       "out_features": offset, "out_offsets": {m: out_offsets[m] for m in targeted},
                       "module_out_features": {m: shapes[m][1] for m in targeted}})
    return groups


def layout(dims: ModelDims, intermediate_size: int, max_rank: int, target_modules: list[str],
           packed: bool = False) -> dict:
    """The manifest's description of the LoRA inputs; the runtime lays adapters out from it.
    packed: the checkpoint packs q/k/v and gate/up itself (Phi-3)."""
    return {"max_rank": max_rank, "target_modules": list(target_modules), "num_layers": dims.num_layers,
            "groups": _groups(module_shapes(dims, intermediate_size), target_modules, packed)}


def layered_layout(hf_layers, max_rank: int, target_modules: list[str]) -> dict:
    """The layout of a model whose layers' projections differ in shape (Gemma 4): each layer's groups
    from its own modules (their in and out features; a module a layer lacks, as a layer reading
    another's keys lacks k_proj, takes no adapter there), in `layer_groups`."""
    per_layer = []
    for layer in hf_layers:
        shapes = {}
        for block in (layer.self_attn, layer.mlp):
            for m in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
                module = getattr(block, m, None)
                if isinstance(module, nn.Linear):
                    shapes[m] = (module.in_features, module.out_features)
        per_layer.append(_groups(shapes, target_modules))
    return {"max_rank": max_rank, "target_modules": list(target_modules), "num_layers": len(per_layer),
            "groups": [], "layer_groups": per_layer}


def graph_groups(lora_layout: dict | None) -> list[list[str]]:
    """Per layer, the names of the groups the graph takes LoRA inputs for (none without a layout)."""
    from trt_llm.schemas.graph_spec import lora_groups_at

    if not lora_layout:
        return []
    return [[g["name"] for g in lora_groups_at(lora_layout, i)] for i in range(lora_layout["num_layers"])]


def input_names(lora_layout: dict) -> list[str]:
    from trt_llm.schemas.graph_spec import lora_inputs

    return [spec.name for spec in lora_inputs(lora_layout)]
