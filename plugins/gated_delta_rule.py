"""The gated delta rule (Qwen3.5's Gated DeltaNet linear attention) over a ragged batch: all its facets in one file.

The semantics are transformers' `torch_recurrent_gated_delta_rule` / `torch_chunk_gated_delta_rule`
(models/qwen3_5/modeling_qwen3_5.py) with use_qk_l2norm_in_kernel=True, plus ragged rows. Per v head,
with q and k l2-normalised (eps 1e-6, float32), q scaled by Dk**-0.5, and a state S [Dk, Dv]:

    S <- S * exp(g_t)                      the decay (g is a log decay, <= 0)
    S <- S + k_t (beta_t (v_t - k_t^T S))  the delta rule: write the correction of what S predicts for k_t
    o_t = q_t^T S

Inputs (shapes; Hv a multiple of Hk: q/k head h serves v heads h * Hv/Hk ... (h + 1) * Hv/Hk - 1):
    query, key     [B, S, Hk, Dk]  model dtype
    value          [B, S, Hv, Dv]  model dtype
    g              [B, S, Hv]      float (float32 in Qwen3.5), the log decay
    beta           [B, S, Hv]      float, the write strength
    past_state     [B, Hv, Dk, Dv] float32 (zeros for a new sequence: the runtime zeroes it)
    query_lengths  [B] int64 (or int32)  row b's tokens are t < query_lengths[b] (right-padded rows)
Outputs: output [B, S, Hv, Dv] in the query's dtype (zeros at padding), present_state [B, Hv, Dk, Dv]
float32, the state after exactly query_lengths[b] tokens: a padding token leaves the state untouched
(it is a token with g = 0 and beta = 0, and zero key and value, so garbage there never reaches it).

The chunked form (the ONNX body, the ONNX Runtime lowering's prefill and the TensorRT kernel's): the
sequence in chunks of C = min(S, 64) tokens (transformers' 64; a decode step is one chunk of one),
padded to whole chunks with padding tokens. Within a chunk, with G the cumulative log decay and the
UT transform's T = I + strictly_lower((beta k) k^T * exp(G_i - G_j)), the chunk's new values
u = T^-1 (beta v) and its decayed keys w = T^-1 (beta k exp(G)) are matmuls; then over the chunks in
turn v' = u - w S, o = (q exp(G)) S + tril(q k^T * exp(G_i - G_j)) v', S <- S exp(G_C) + (k exp(G_C - G))^T v'.
T^-1 (unit lower triangular) by block doubling: D_1^-1 = I and D_2b^-1 = D_b^-1 - D_b^-1 E_b D_b^-1,
where D_b is T's block diagonal in blocks of b and E_b = D_2b - D_b its lower-left blocks inside each
block of 2b (E_b D_b^-1 E_b = 0, so the series stops there); 6 levels reach 64, and a level whose
blocks are wider than the chunk is a no-op, so any C <= 64 takes the same 6 levels. Only matmuls, no
loop, and stable: every step is a triangular block inverse, where the Neumann product
(I + N)(I + N^2)(I + N^4)... of the same cost multiplies intermediate powers that grow like
binomials when the keys of a chunk are alike (benchmarks/gated_delta_rule_op.py, 64 unit keys each a
common one plus noise of 0.1 or 0.01, beta 1, no decay: float32 error relative to the inverse's
largest entry 1.7e-07 / 1.5e-08 by doubling, 3.4e+10 / 6.9e+10 by the Neumann product).

Facets (the fixed names every op file exposes for the registry in plugins/__init__.py):
 1. `gated_delta_rule` (`TORCH_OPS`): a torch custom op whose eager body is the recurrent rule token
    by token (the ground truth; `chunked` is the chunked form in torch, tested equal).
 2. `onnx_translation` + `function_protos`: a node `trt::GatedDeltaRulePlugin` (with
    `plugin_namespace`) whose model-local function (opset 18, standard ops) is the chunked form,
    the chunks in an ONNX Loop (one iteration per chunk: one for a decode step, 32 for 2,000 tokens)
    whose scan output is the chunks' outputs. All of a chunk's work is in the Loop's body (`_chunk`):
    it gathers its C tokens straight from the inputs (past S, token S - 1 again, made a padding
    token), l2-normalises them, and does the decay, the inverse, the in-chunk attention and the
    state update, so the intermediates alive at a time are one chunk's, O(B H C D), not the
    sequence's; outside the Loop only the chunk count and the output's reassembly. Heads as
    [B, Hk, r, C, *] (r = Hv / Hk): q and k stay at Hk heads and MatMul broadcasts them over their
    v heads, so nothing is expanded (Hv == Hk is a Reshape only). No If: TensorRT-RTX parses it as it is.
 3. `lower_for_onnxruntime`: ONNX Runtime has no kernel for it, so the node becomes standard ops
    written into the graph: If(S == 1) the single recurrent step, else the chunked form (the step's
    whole-sequence preparation lives in the then branch only). Measured
    (benchmarks/gated_delta_rule_op.py; Qwen3.5-0.8B's widths Hk = Hv = 16, Dk = Dv = 128; one op,
    float32, every row full; ONNX Runtime 1.32, 2 threads on 2 cores of an Intel Xeon shared with
    other jobs, so single numbers vary up to 2x between runs). Before (the chunk's intermediates
    computed for the whole sequence outside the Loop, only the recurrence inside) and after (all in
    the Loop's body), in one process, the forms interleaved; medians of 5 calls, 3 at S = 2000; ms:
                        chunked (the body)     lowered (If S == 1)
                         before     after        before     after
        B=1 S=1            1.2       1.3           0.9       0.9
        B=1 S=64          24.9      29.9          35.0      29.4
        B=1 S=512        122.9      96.9         119.3      97.9
        B=1 S=2000       449.6     299.8         426.8     315.6
        B=4 S=1           16.6      16.1          17.4      19.4
        B=4 S=64          72.8      73.1          87.7      67.7
        B=4 S=512        437.7     344.6         434.5     353.4
        B=4 S=2000      1588.6    1355.2        1604.7    1404.1
    and the lowered form's peak memory (a fresh process per measurement, the CPU arena on, one
    call; VmHWM, the process's few hundred MB of Python, torch and ONNX Runtime and the inputs
    included) and that call's time:
        B=1 S=4000       785 MB -> 534 MB      1.43 s -> 0.60 s
        B=8 S=4000      3851 MB -> 1893 MB    17.1 s -> 5.8 s
    (the same process at the smoke widths peaks at about 340 MB, so the inputs and the call took
    about 440 -> 190 MB at batch 1 and 3.5 -> 1.55 GB at batch 8, where q, k, v alone are 0.8 GB).
    The token-by-token Loop (the `recurrent` form, a Loop iteration per token) is 3-6x slower than
    the chunked form from 64 tokens on (1644 vs 314 ms at B=1 S=2000 in the after run). A decode step
    runs the single step without a Loop (the If's then branch): fastest at batch 1, level with the
    others at batch 4, where the state's 4 MB of arithmetic dominates; past one token the If's else
    branch is the chunked form (the two columns differ by the run's noise only).
 4. `register_tensorrt_plugin`: the node as a `tensorrt.plugin` plugin whose kernel is
    `gated_delta_rule_kernel` (plain torch on TensorRT's stream: the recurrent step for S == 1, the
    chunked form otherwise; its work depends on the shapes only, so it may be captured in a CUDA
    graph). TensorRT-RTX has no plugins: its parser inlines the body.
"""

from __future__ import annotations

import onnx
import onnxscript
import torch
from onnx import TensorProto, helper
from onnxscript import opset18 as op
from torch import Tensor

from trt_llm.plugins.moe import _inline

DOMAIN = "trt"
OP_NAME = "GatedDeltaRulePlugin"
OP_NAMES = (OP_NAME,)
# "trt" is reserved by tensorrt.plugin, so the plugin lives in our own namespace.
PLUGIN_NAMESPACE = "trt_llm"
CHUNK = 64  # transformers' chunk_size
EPS = 1e-6  # transformers' l2norm eps (use_qk_l2norm_in_kernel)
_TRT = onnxscript.values.Opset(DOMAIN, 1)


def _register_schemas() -> None:
    """Register the node's schema so onnxscript (and the exporter) can emit it."""
    if onnx.defs.has(OP_NAME, DOMAIN):
        return
    Param = onnx.defs.OpSchema.FormalParameter
    Attr = onnx.defs.OpSchema.Attribute
    floats = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]
    onnx.defs.register_schema(onnx.defs.OpSchema(
        OP_NAME, DOMAIN, 1,
        doc="Qwen3.5's gated delta rule over ragged rows (see trt_llm.plugins.gated_delta_rule).",
        inputs=[Param("query", "T"), Param("key", "T"), Param("value", "T"), Param("g", "G"), Param("beta", "B"),
                Param("past_state", "S"), Param("query_lengths", "I")],
        outputs=[Param("output", "T"), Param("present_state", "S")],
        type_constraints=[("T", floats, "activations"), ("G", floats, "log decay"), ("B", floats, "write strength"),
                          ("S", ["tensor(float)"], "recurrent state"),
                          ("I", ["tensor(int64)", "tensor(int32)"], "lengths")],
        attributes=[Attr("plugin_namespace", onnx.defs.OpSchema.AttrType.STRING, "TensorRT plugin namespace")],
    ))


_register_schemas()


# ---------------------------------------------------------------------------------------------------
# Facet 1: the torch reference (and the chunked form in torch).


def _l2norm(x: Tensor) -> Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + EPS)


def _prepared(query, key, value, g, beta, query_lengths):
    """float32 [B, H, S, *] per v head: q normalised and scaled, k normalised, and padding tokens made
    no-ops (g = beta = 0, k = v = 0); also valid [B, S]."""
    seq, k_heads, k_dim = query.shape[1:]
    group = value.shape[2] // k_heads
    valid = torch.arange(seq, device=query.device)[None, :] < query_lengths.to(torch.long)[:, None]
    q = _l2norm(query.float()) * k_dim ** -0.5
    k = _l2norm(key.float())
    if group > 1:
        q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
    mask = valid[:, :, None]
    k = torch.where(mask[..., None], k, 0.0)
    v = torch.where(mask[..., None], value.float(), 0.0)
    g = torch.where(mask, g.float(), 0.0)
    beta = torch.where(mask, beta.float(), 0.0)
    return [x.transpose(1, 2) for x in (q, k, v, g, beta)], valid


def _finished(out: Tensor, valid: Tensor, dtype: torch.dtype) -> Tensor:
    """[B, H, S, Dv] float32 -> [B, S, H, Dv] in the model dtype, zeros at padding."""
    return torch.where(valid[:, :, None, None], out.transpose(1, 2), 0.0).to(dtype)


def recurrent_step(state: Tensor, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
    """One token of every row and head: state [B, H, Dk, Dv], q/k [B, H, Dk], v [B, H, Dv], g/beta [B, H]."""
    state = state * g.exp()[..., None, None]
    predicted = (state * k[..., None]).sum(dim=-2)
    state = state + k[..., None] * ((v - predicted) * beta[..., None])[..., None, :]
    return (state * q[..., None]).sum(dim=-2), state


@torch.library.custom_op("trt_llm::gated_delta_rule", mutates_args=())
def gated_delta_rule(query: Tensor, key: Tensor, value: Tensor, g: Tensor, beta: Tensor, past_state: Tensor,
                     query_lengths: Tensor) -> tuple[Tensor, Tensor]:
    """The recurrent rule token by token, transformers' torch_recurrent_gated_delta_rule per row."""
    (q, k, v, g, beta), valid = _prepared(query, key, value, g, beta, query_lengths)
    state = past_state.float()
    outputs = []
    for t in range(q.shape[2]):
        o, state = recurrent_step(state, q[:, :, t], k[:, :, t], v[:, :, t], g[:, :, t], beta[:, :, t])
        outputs.append(o)
    out = torch.stack(outputs, dim=2) if outputs else v.new_zeros(v.shape)
    return _finished(out, valid, query.dtype), state.contiguous()


@gated_delta_rule.register_fake
def _gated_delta_rule_fake(query, key, value, g, beta, past_state, query_lengths):
    return value.new_empty(value.shape, dtype=query.dtype), torch.empty_like(past_state, dtype=torch.float32)


TORCH_OPS = (torch.ops.trt_llm.gated_delta_rule.default,)


def _doubling_masks(device=None) -> Tensor:
    """[6, 64, 64] bool: level l's E mask (b = 2^l): i and j in one block of 2b, i in its second half,
    j in its first."""
    i = torch.arange(CHUNK, device=device)
    levels = [(i[:, None] // (2 * b) == i[None, :] // (2 * b)) & ((i[:, None] // b) % 2 == 1) & ((i[None, :] // b) % 2 == 0)
              for b in (1, 2, 4, 8, 16, 32)]
    return torch.stack(levels)


def unit_lower_inverse(strict: Tensor) -> Tensor:
    """(I + strict)^-1 for strictly lower triangular `strict` [..., C, C], C <= 64, by block doubling."""
    size = strict.shape[-1]
    masks = _doubling_masks(strict.device)[:, :size, :size]
    inverse = torch.eye(size, dtype=strict.dtype, device=strict.device) - strict * masks[0]
    for mask in masks[1:]:
        inverse = inverse - inverse @ (strict * mask) @ inverse
    return inverse


def chunked(query: Tensor, key: Tensor, value: Tensor, g: Tensor, beta: Tensor, past_state: Tensor,
            query_lengths: Tensor) -> tuple[Tensor, Tensor]:
    """The op by the chunked form (the module docstring), the ONNX body's arithmetic in torch."""
    (q, k, v, g, beta), valid = _prepared(query, key, value, g, beta, query_lengths)
    batch, heads, seq = g.shape
    size = min(seq, CHUNK)
    chunks = -(-seq // size)
    pad = chunks * size - seq
    q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, pad)).view(batch, heads, chunks, size, -1) for x in (q, k, v))
    g, beta = (torch.nn.functional.pad(x, (0, pad)).view(batch, heads, chunks, size) for x in (g, beta))
    cum = g.cumsum(-1)
    index = torch.arange(size, device=g.device)
    causal = index[:, None] >= index[None, :]
    decay = torch.where(causal, cum[..., :, None] - cum[..., None, :], float("-inf")).exp()
    k_beta = k * beta[..., None]
    strict = (k_beta @ k.transpose(-1, -2)) * decay * (index[:, None] > index[None, :])
    inverse = unit_lower_inverse(strict)
    new_values = inverse @ (v * beta[..., None])
    decayed_keys = inverse @ (k_beta * cum.exp()[..., None])
    attention = (q @ k.transpose(-1, -2)) * decay
    q = q * cum.exp()[..., None]
    k = k * (cum[..., -1:] - cum).exp()[..., None]
    chunk_decay = cum[..., -1].exp()[..., None, None]
    state = past_state.float()
    outputs = []
    for n in range(chunks):
        corrected = new_values[:, :, n] - decayed_keys[:, :, n] @ state
        outputs.append(q[:, :, n] @ state + attention[:, :, n] @ corrected)
        state = state * chunk_decay[:, :, n] + k[:, :, n].transpose(-1, -2) @ corrected
    out = torch.stack(outputs, dim=2).view(batch, heads, chunks * size, -1)[:, :, :seq]
    return _finished(out, valid, query.dtype), state


# ---------------------------------------------------------------------------------------------------
# Facet 2: the ONNX face: our node, and the chunked form in standard ops as its function body.


def onnx_translation(query, key, value, g, beta, past_state, query_lengths) -> tuple[
        onnxscript.onnx_types.FLOAT, onnxscript.onnx_types.FLOAT]:
    # The return annotation matters: without it the exporter infers zero outputs.
    return _TRT.GatedDeltaRulePlugin(query, key, value, g, beta, past_state, query_lengths,
                                     plugin_namespace=PLUGIN_NAMESPACE, _outputs=2)


@onnxscript.script(_TRT, default_opset=op)
def _prepare(query, key, value, g, beta, query_lengths):
    """The per-token tensors as float32 [B, S, Hv, *], padding tokens made no-ops; valid [B, S, 1, 1]."""
    zero = op.Constant(value_ints=[0])
    last = op.Constant(value_ints=[-1])
    seq = op.Shape(query, start=1, end=2)
    k_heads = op.Shape(query, start=2, end=3)
    v_heads = op.Shape(value, start=2, end=3)
    k_dim = op.Shape(query, start=3, end=4)
    steps = op.Range(op.Constant(value_int=0), op.Squeeze(seq, zero), op.Constant(value_int=1))
    lengths = op.Unsqueeze(op.Cast(query_lengths, to=7), op.Constant(value_ints=[1]))
    valid = op.Less(op.Unsqueeze(steps, zero), lengths)  # [B, S]
    valid3 = op.Unsqueeze(valid, op.Constant(value_ints=[2]))
    valid4 = op.Unsqueeze(valid, op.Constant(value_ints=[2, 3]))
    eps = op.Constant(value_float=1e-6)
    q = op.Cast(query, to=1)
    k = op.Cast(key, to=1)
    q = op.Mul(q, op.Reciprocal(op.Sqrt(op.Add(op.ReduceSum(op.Mul(q, q), last, keepdims=1), eps))))
    k = op.Mul(k, op.Reciprocal(op.Sqrt(op.Add(op.ReduceSum(op.Mul(k, k), last, keepdims=1), eps))))
    q = op.Div(q, op.Sqrt(op.Cast(k_dim, to=1)))
    # Each q/k head serves Hv / Hk consecutive v heads (repeat_interleave): [B, S, Hk, r, Dk] -> [B, S, Hv, Dk]
    grouped = op.Concat(op.Shape(query, start=0, end=3), op.Div(v_heads, k_heads), k_dim, axis=0)
    flat = op.Concat(op.Shape(query, start=0, end=2), v_heads, k_dim, axis=0)
    # allowzero: no dimension of ours is a placeholder (TensorRT otherwise resolves them at run time)
    q = op.Reshape(op.Expand(op.Unsqueeze(q, op.Constant(value_ints=[3])), grouped), flat, allowzero=1)
    k = op.Reshape(op.Expand(op.Unsqueeze(k, op.Constant(value_ints=[3])), grouped), flat, allowzero=1)
    nothing = op.Constant(value_float=0.0)
    k = op.Where(valid4, k, nothing)
    v = op.Where(valid4, op.Cast(value, to=1), nothing)
    g32 = op.Where(valid3, op.Cast(g, to=1), nothing)
    b32 = op.Where(valid3, op.Cast(beta, to=1), nothing)
    return q, k, v, g32, b32, valid4, seq


@onnxscript.script(_TRT, default_opset=op)
def _chunk(n, state, query, key, value, g, beta, query_lengths, size, mask1, mask2, mask4, mask8, mask16, mask32):
    """Chunk n (tokens n*C ... n*C + C - 1, C = `size` [1]) of the raw inputs against the state
    [B, Hv, Dk, Dv], everything of the chunk computed here, in the Loop's body, so that the
    intermediates are one chunk's (O(B H C D)), never the sequence's: its output [B, C, Hv, Dv] in the
    query's dtype (zeros at padding) and the next state. Heads as [B, Hk, r, C, *] (r = Hv / Hk): q/k
    stay at Hk heads ([B, Hk, 1, C, Dk]) and MatMul broadcasts them over r, so nothing is expanded.
    mask<b>: the doubling's level masks [64, 64] (Constants beside the function: a script cannot
    compute them)."""
    zero = op.Constant(value_ints=[0])
    one = op.Constant(value_ints=[1])
    last = op.Constant(value_ints=[-1])
    nothing = op.Constant(value_float=0.0)
    seq = op.Shape(query, start=1, end=2)
    batch = op.Shape(query, start=0, end=1)
    k_heads = op.Shape(query, start=2, end=3)
    v_heads = op.Shape(value, start=2, end=3)
    k_dim = op.Shape(query, start=3, end=4)
    v_dim = op.Shape(value, start=3, end=4)
    group = op.Div(v_heads, k_heads)
    width = op.Squeeze(size, zero)
    index = op.Range(op.Constant(value_int=0), width, op.Constant(value_int=1))  # [C]
    steps = op.Add(op.Mul(n, width), index)  # the chunk's tokens; past S in the last chunk
    # Past S the gather reads token S - 1 again, made a padding token by `valid` (t < S >= length).
    tokens = op.Min(steps, op.Sub(seq, one))
    lengths = op.Unsqueeze(op.Cast(query_lengths, to=7), one)
    valid = op.Less(op.Unsqueeze(steps, zero), lengths)  # [B, C]
    valid3 = op.Unsqueeze(valid, op.Constant(value_ints=[2]))
    valid4 = op.Unsqueeze(valid, op.Constant(value_ints=[2, 3]))
    eps = op.Constant(value_float=1e-6)
    q = op.Cast(op.Gather(query, tokens, axis=1), to=1)  # [B, C, Hk, Dk]
    k = op.Cast(op.Gather(key, tokens, axis=1), to=1)
    q = op.Mul(q, op.Reciprocal(op.Sqrt(op.Add(op.ReduceSum(op.Mul(q, q), last, keepdims=1), eps))))
    k = op.Mul(k, op.Reciprocal(op.Sqrt(op.Add(op.ReduceSum(op.Mul(k, k), last, keepdims=1), eps))))
    q = op.Div(q, op.Sqrt(op.Cast(k_dim, to=1)))
    k = op.Where(valid4, k, nothing)
    v = op.Where(valid4, op.Cast(op.Gather(value, tokens, axis=1), to=1), nothing)  # [B, C, Hv, Dv]
    gc = op.Where(valid3, op.Cast(op.Gather(g, tokens, axis=1), to=1), nothing)  # [B, C, Hv]
    bc = op.Where(valid3, op.Cast(op.Gather(beta, tokens, axis=1), to=1), nothing)
    # Heads first: [B, C, Hk, 1, D] / [B, C, Hk, r, D] (a Reshape) -> [B, Hk, 1 or r, C, D] (one Transpose)
    q = op.Transpose(op.Unsqueeze(q, op.Constant(value_ints=[3])), perm=[0, 2, 3, 1, 4])
    k = op.Transpose(op.Unsqueeze(k, op.Constant(value_ints=[3])), perm=[0, 2, 3, 1, 4])
    v = op.Transpose(op.Reshape(v, op.Concat(batch, size, k_heads, group, v_dim, axis=0), allowzero=1),
                     perm=[0, 2, 3, 1, 4])
    gc = op.Transpose(op.Reshape(gc, op.Concat(batch, size, k_heads, group, axis=0), allowzero=1), perm=[0, 2, 3, 1])
    bc = op.Transpose(op.Reshape(bc, op.Concat(batch, size, k_heads, group, axis=0), allowzero=1), perm=[0, 2, 3, 1])
    beta_i = op.Unsqueeze(bc, last)  # [B, Hk, r, C, 1]
    cum = op.CumSum(gc, op.Constant(value_int=-1))  # [B, Hk, r, C]
    cum_i = op.Unsqueeze(cum, last)  # [B, Hk, r, C, 1]
    cum_j = op.Unsqueeze(cum, op.Constant(value_ints=[-2]))  # [B, Hk, r, 1, C]
    rows = op.Unsqueeze(index, one)
    cols = op.Unsqueeze(index, zero)
    causal = op.GreaterOrEqual(rows, cols)
    strictly = op.Cast(op.Greater(rows, cols), to=1)
    # exp(G_i - G_j) where i >= j, else 0 (the exponent zeroed first: above the diagonal it may overflow)
    decay = op.Mul(op.Exp(op.Where(causal, op.Sub(cum_i, cum_j), nothing)), op.Cast(causal, to=1))
    k_t = op.Transpose(k, perm=[0, 1, 2, 4, 3])  # [B, Hk, 1, Dk, C]
    # (beta k) k^T = beta_i (k k^T): one product per q/k head, broadcast over its v heads
    strict = op.Mul(op.Mul(op.MatMul(k, k_t), op.Mul(beta_i, decay)), strictly)
    # (I + strict)^-1 by block doubling (the module docstring); level b's mask sliced to the chunk
    ends = op.Concat(size, size, axis=0)
    starts = op.Constant(value_ints=[0, 0])
    eye = op.Cast(op.Equal(rows, cols), to=1)
    inverse = op.Sub(eye, op.Mul(strict, op.Slice(mask1, starts, ends)))
    e = op.Mul(strict, op.Slice(mask2, starts, ends))
    inverse = op.Sub(inverse, op.MatMul(op.MatMul(inverse, e), inverse))
    e = op.Mul(strict, op.Slice(mask4, starts, ends))
    inverse = op.Sub(inverse, op.MatMul(op.MatMul(inverse, e), inverse))
    e = op.Mul(strict, op.Slice(mask8, starts, ends))
    inverse = op.Sub(inverse, op.MatMul(op.MatMul(inverse, e), inverse))
    e = op.Mul(strict, op.Slice(mask16, starts, ends))
    inverse = op.Sub(inverse, op.MatMul(op.MatMul(inverse, e), inverse))
    e = op.Mul(strict, op.Slice(mask32, starts, ends))
    inverse = op.Sub(inverse, op.MatMul(op.MatMul(inverse, e), inverse))
    grown = op.Exp(cum_i)
    new_values = op.MatMul(inverse, op.Mul(v, beta_i))  # u [B, Hk, r, C, Dv]
    decayed_keys = op.MatMul(inverse, op.Mul(k, op.Mul(beta_i, grown)))  # w [B, Hk, r, C, Dk]
    attention = op.Mul(op.MatMul(q, k_t), decay)  # [B, Hk, r, C, C]
    end = op.Slice(cum_i, last, op.Constant(value_ints=[9223372036854775807]), op.Constant(value_ints=[3]))
    keys_t = op.Transpose(op.Mul(k, op.Exp(op.Sub(end, cum_i))), perm=[0, 1, 2, 4, 3])  # [B, Hk, r, Dk, C]
    state5 = op.Reshape(state, op.Concat(batch, k_heads, group, k_dim, v_dim, axis=0), allowzero=1)
    corrected = op.Sub(new_values, op.MatMul(decayed_keys, state5))
    out = op.Add(op.MatMul(op.Mul(q, grown), state5), op.MatMul(attention, corrected))
    state5 = op.Add(op.Mul(state5, op.Exp(end)), op.MatMul(keys_t, corrected))
    # [B, Hk, r, C, Dv] -> [B, C, Hv, Dv], zeros at padding, in the query's dtype
    out = op.Reshape(op.Transpose(out, perm=[0, 3, 1, 2, 4]), op.Concat(batch, size, v_heads, v_dim, axis=0),
                     allowzero=1)
    out = op.CastLike(op.Where(valid4, out, nothing), query)
    return op.Reshape(state5, op.Shape(state), allowzero=1), out


def _mask_tensor(block: int) -> onnx.TensorProto:
    """Level `block`'s E mask [64, 64] as a float32 constant."""
    level = (1, 2, 4, 8, 16, 32).index(block)
    values = _doubling_masks()[level].float()
    return helper.make_tensor(f"doubling_{block}", TensorProto.FLOAT, values.shape, values.flatten().tolist())


@onnxscript.script(_TRT, default_opset=op)
def _chunk_count(query):
    """C = min(S, 64) [1] and the number of chunks N = ceil(S / C) as a scalar (the Loop's trip count)."""
    seq = op.Shape(query, start=1, end=2)
    size = op.Min(seq, op.Constant(value_ints=[64]))
    chunks = op.Div(op.Sub(op.Add(seq, size), op.Constant(value_ints=[1])), size)
    return size, op.Squeeze(chunks, op.Constant(value_ints=[0]))


@onnxscript.script(_TRT, default_opset=op)
def _finish(chunk_outputs, query):
    """The chunks' outputs [N, B, C, H, Dv] -> [B, S, H, Dv] (the last chunk's padding cut)."""
    out = op.Transpose(chunk_outputs, perm=[1, 0, 2, 3, 4])  # [B, N, C, H, Dv]
    padded = op.Mul(op.Shape(out, start=1, end=2), op.Shape(out, start=2, end=3))
    shape = op.Concat(op.Shape(out, start=0, end=1), padded, op.Shape(out, start=3), axis=0)
    seq = op.Shape(query, start=1, end=2)
    return op.Slice(op.Reshape(out, shape, allowzero=1), op.Constant(value_ints=[0]), seq, op.Constant(value_ints=[1]))


@onnxscript.script(_TRT, default_opset=op)
def _single_step(q, k, v, g, beta, valid, past_state, query):
    """S == 1: the recurrent step on [B, 1, H, *] tensors, no loop; output [B, 1, H, Dv] and the state."""
    one = op.Constant(value_ints=[1])
    q = op.Unsqueeze(op.Squeeze(q, one), op.Constant(value_ints=[-1]))  # [B, H, Dk, 1]
    k = op.Unsqueeze(op.Squeeze(k, one), op.Constant(value_ints=[-1]))
    v = op.Unsqueeze(op.Squeeze(v, one), op.Constant(value_ints=[-2]))  # [B, H, 1, Dv]
    g = op.Unsqueeze(op.Squeeze(g, one), op.Constant(value_ints=[-1, -2]))  # [B, H, 1, 1]
    beta = op.Unsqueeze(op.Squeeze(beta, one), op.Constant(value_ints=[-1, -2]))
    state = op.Mul(past_state, op.Exp(g))
    predicted = op.ReduceSum(op.Mul(state, k), op.Constant(value_ints=[-2]), keepdims=1)  # [B, H, 1, Dv]
    state = op.Add(state, op.Mul(k, op.Mul(op.Sub(v, predicted), beta)))
    out = op.ReduceSum(op.Mul(state, q), op.Constant(value_ints=[-2]), keepdims=1)  # [B, H, 1, Dv]
    out = op.Where(valid, op.Transpose(out, perm=[0, 2, 1, 3]), op.Constant(value_float=0.0))
    return op.CastLike(out, query), state


INPUTS = ["query", "key", "value", "g", "beta", "past_state", "query_lengths"]
OUTPUTS = ["output", "present_state"]
_PREPARED = ("q", "k", "v", "g", "beta", "valid", "seq")


def _value(name: str, elem_type: int | None = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    """A subgraph's float32 state [B, H, Dk, Dv], or (None) a value whose type is inferred (the query's dtype)."""
    if elem_type is None:
        return onnx.ValueInfoProto(name=name)
    return helper.make_tensor_value_info(name, elem_type, [None] * 4)


def _constant(name: str, tensor: onnx.TensorProto) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=tensor, name=name)


def _ints(name: str, values: list[int]) -> onnx.NodeProto:
    return _constant(name, helper.make_tensor(name, TensorProto.INT64, [len(values)], values))


def _loop(prefix: str, trips: str, state: str, outputs: list[str], body_nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """A Loop of `trips` iterations carrying `state`; the body's nodes read `{prefix}n` (the iteration)
    and `{prefix}state_in` and make `{prefix}state_out` and the scan output `{prefix}out`."""
    # Only a trip count (no condition input, the body's cond_out a constant): TensorRT's parser then
    # sizes the scan output by the trip count alone
    body_nodes = [*body_nodes, helper.make_node("Constant", [], [f"{prefix}cond_out"], name=f"{prefix}cond",
                                                value=helper.make_tensor(f"{prefix}true", TensorProto.BOOL, [], [True]))]
    body = helper.make_graph(
        body_nodes, f"{prefix}body",
        [helper.make_tensor_value_info(f"{prefix}n", TensorProto.INT64, []),
         helper.make_tensor_value_info(f"{prefix}cond_in", TensorProto.BOOL, []), _value(f"{prefix}state_in")],
        [helper.make_tensor_value_info(f"{prefix}cond_out", TensorProto.BOOL, []), _value(f"{prefix}state_out"),
         _value(f"{prefix}out", None)])
    return [helper.make_node("Loop", [trips, "", state], outputs, name=f"{prefix}loop", body=body)]


def _prepare_nodes() -> list[onnx.NodeProto]:
    """INPUTS -> the prepared tensors `prepared/q` ... `prepared/seq` (`_prepare`)."""
    return _inline(_prepare.to_function_proto(), ["query", "key", "value", "g", "beta", "query_lengths"],
                   [f"prepared/{n}" for n in _PREPARED], "prepare/")


def _chunked_nodes(outputs: list[str]) -> list[onnx.NodeProto]:
    """The chunked form from the op's inputs to `outputs` (output, present_state): all of a chunk's
    work in the Loop's body (`_chunk`), so only one chunk's intermediates are alive at a time."""
    p = "chunked/"
    masks = [_constant(f"{p}mask{b}", _mask_tensor(b)) for b in (1, 2, 4, 8, 16, 32)]
    count = _inline(_chunk_count.to_function_proto(), ["query"], [f"{p}size", f"{p}chunks"], f"{p}count/")
    step = _inline(_chunk.to_function_proto(),
                   [f"{p}n", f"{p}state_in", "query", "key", "value", "g", "beta", "query_lengths", f"{p}size",
                    *(m.output[0] for m in masks)],
                   [f"{p}state_out", f"{p}out"], f"{p}step/")
    finish = _inline(_finish.to_function_proto(), [f"{p}chunk_outputs", "query"], [outputs[0]], f"{p}finish/")
    return [*masks, *count, *_loop(p, f"{p}chunks", "past_state", [outputs[1], f"{p}chunk_outputs"], step), *finish]


def _single_step_nodes(outputs: list[str]) -> list[onnx.NodeProto]:
    """S == 1: the recurrent step from the op's inputs to `outputs`."""
    return [*_prepare_nodes(),
            *_inline(_single_step.to_function_proto(),
                     [f"prepared/{n}" for n in ("q", "k", "v", "g", "beta", "valid")] + ["past_state", "query"],
                     outputs, "step/")]


def _recurrent_nodes(outputs: list[str]) -> list[onnx.NodeProto]:
    """The token-by-token form: the recurrent step in a Loop over S."""
    p = "recurrent/"
    body = [_ints(f"{p}first", [0]), helper.make_node("Unsqueeze", [f"{p}n", f"{p}first"], [f"{p}t"])]
    for name in ("q", "k", "v", "g", "beta", "valid"):  # token t of every prepared tensor: [B, 1, H, *]
        body.append(helper.make_node("Gather", [f"prepared/{name}", f"{p}t"], [f"{p}{name}_t"], axis=1))
    body += _inline(_single_step.to_function_proto(),
                    [f"{p}{n}_t" for n in ("q", "k", "v", "g", "beta", "valid")] + [f"{p}state_in", "query"],
                    [f"{p}out", f"{p}state_out"], f"{p}step/")
    return [
        *_prepare_nodes(), _ints(f"{p}axis0", [0]), _ints(f"{p}axis2", [2]),
        helper.make_node("Squeeze", ["prepared/seq", f"{p}axis0"], [f"{p}steps"]),
        *_loop(p, f"{p}steps", "past_state", [outputs[1], f"{p}outputs"], body),
        # the tokens' outputs [S, B, 1, H, Dv] -> [B, S, H, Dv]
        helper.make_node("Squeeze", [f"{p}outputs", f"{p}axis2"], [f"{p}squeezed"]),
        helper.make_node("Transpose", [f"{p}squeezed"], [outputs[0]], perm=[1, 0, 2, 3]),
    ]


def _branch(name: str, nodes: list[onnx.NodeProto], outputs: list[str]) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [_value(outputs[0], None), _value(outputs[1])])


def _decode_or_chunked_nodes() -> list[onnx.NodeProto]:
    """If(S == 1) the single step, else the chunked form (the ONNX Runtime lowering)."""
    step_out, chunked_out = ["step/output", "step/present_state"], ["chunked/output", "chunked/present_state"]
    return [
        _ints("decode/one", [1]),
        helper.make_node("Shape", ["query"], ["decode/seq"], name="decode/seq", start=1, end=2),
        helper.make_node("Equal", ["decode/seq", "decode/one"], ["decode/is_step"], name="decode/is_step"),
        helper.make_node("If", ["decode/is_step"], OUTPUTS, name="decode/if",
                         then_branch=_branch("step", _single_step_nodes(step_out), step_out),
                         else_branch=_branch("chunked", _chunked_nodes(chunked_out), chunked_out)),
    ]


def _function(nodes: list[onnx.NodeProto]) -> onnx.FunctionProto:
    return helper.make_function(DOMAIN, OP_NAME, INPUTS, OUTPUTS, nodes,
                                [helper.make_opsetid("", 18)], attributes=["plugin_namespace"])


def function_protos() -> list[onnx.FunctionProto]:
    """The node's body: the chunked form for any S, no If (one flat function: TensorRT-RTX's parser
    rejects a function that calls another)."""
    return [_function(_chunked_nodes(OUTPUTS))]


def forms() -> dict[str, onnx.FunctionProto]:
    """Every standard-op form of the node, a function of its signature each (the benchmark times them):
    `chunked` (the body), `recurrent` (token by token), `lowered` (ONNX Runtime's: If S == 1)."""
    return {"chunked": function_protos()[0], "recurrent": _function(_recurrent_nodes(OUTPUTS)),
            "lowered": _function(_decode_or_chunked_nodes())}


# ---------------------------------------------------------------------------------------------------
# Facet 3: the ONNX Runtime CPU lowering: the node's standard ops written into the graph.

LOWERED_FORM = "lowered"  # chosen by measurement: the module docstring's table


def lower_for_onnxruntime(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every GatedDeltaRule node of `model` replaced by the LOWERED_FORM's nodes, in place."""
    nodes = model.graph.node
    if not any(n.domain == DOMAIN and n.op_type == OP_NAME for n in nodes):
        return model
    form = forms()[LOWERED_FORM]
    new_nodes = []
    for index, node in enumerate(nodes):
        if node.domain == DOMAIN and node.op_type == OP_NAME:
            new_nodes += _inline(form, list(node.input), list(node.output), f"{node.name or index}/")
        else:
            new_nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(new_nodes)
    if not any(n.domain == DOMAIN for n in model.graph.node):
        kept = [f for f in model.functions if not (f.domain == DOMAIN and f.name == OP_NAME)]
        del model.functions[:]
        model.functions.extend(kept)
    return model


# ---------------------------------------------------------------------------------------------------
# Facet 4: the TensorRT plugin, through `tensorrt.plugin` (TensorRT 10.7+ "quickly deployable plugins").
# Registered on demand by the TensorRT backend: importing this module never imports tensorrt. The
# parser matches a node to a plugin by op type and the node's `plugin_namespace` attribute.
# TensorRT-RTX has no plugins: its parser inlines the body at every call.

TENSORRT_PLUGIN_NAMESPACE = PLUGIN_NAMESPACE
TENSORRT_PLUGIN_IDS = (f"{TENSORRT_PLUGIN_NAMESPACE}::{OP_NAME}",)
_tensorrt_registered = False


def gated_delta_rule_kernel(query: Tensor, key: Tensor, value: Tensor, g: Tensor, beta: Tensor, past_state: Tensor,
                            query_lengths: Tensor, out: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """The plugin's kernel: the op of facet 1 on tensors of any one device, in plain torch, reading
    nothing back to the host (its work depends on the shapes only, so it can be captured in a CUDA
    graph): the recurrent step for a decode step (S == 1), the chunked form for more tokens. With
    `out` (output, present_state) the results are written there."""
    if query.shape[1] == 1:
        (q, k, v, g32, b32), valid = _prepared(query, key, value, g, beta, query_lengths)
        o, state = recurrent_step(past_state.float(), q[:, :, 0], k[:, :, 0], v[:, :, 0], g32[:, :, 0], b32[:, :, 0])
        output = _finished(o[:, :, None], valid, query.dtype)
    else:
        output, state = chunked(query, key, value, g, beta, past_state, query_lengths)
    if out is None:
        return output, state
    out[0].copy_(output)
    out[1].copy_(state)
    return out


def register_tensorrt_plugin() -> tuple[str, ...]:
    """Register the node with TensorRT (once per process); returns its plugin id.

    Needed before parsing a graph and before deserializing an engine built with it: the kernel is
    the Python function below (a JIT plugin), which TensorRT calls on its stream."""
    global _tensorrt_registered
    if _tensorrt_registered:
        return TENSORRT_PLUGIN_IDS
    import inspect

    import tensorrt.plugin as trtp

    from trt_llm.plugins.attention import _tensorrt_as_torch

    def describe(*tensors, **attributes):
        # tensorrt.plugin passes the tensor descriptors by position (and the attributes, none, by name).
        query, value, past_state = tensors[0], tensors[2], tensors[5]
        output = value.like()  # [B, S, Hv, Dv] in the query's dtype
        output.dtype = query.dtype
        return output, past_state.like()

    def run(*args, stream):
        # The tensors and the outputs by position, the stream by name: the kernel on the plugin's
        # device buffers, on TensorRT's stream (the views made inside the stream context).
        tensors, outputs = args[:len(INPUTS)], args[-1]
        with torch.cuda.stream(torch.cuda.ExternalStream(stream)), torch.no_grad():
            gated_delta_rule_kernel(*(_tensorrt_as_torch(t) for t in tensors),
                                    out=tuple(_tensorrt_as_torch(t) for t in outputs))

    # tensorrt.plugin reads the names and annotations of these functions' parameters from their signatures.
    def signature(kind, extra, returns=inspect.Signature.empty):
        parameters = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=a)
                      for n, a in [*((n, kind) for n in INPUTS), *extra]]
        return inspect.Signature(parameters, return_annotation=returns)

    describe.__signature__ = signature(trtp.TensorDesc, [], tuple[trtp.TensorDesc, trtp.TensorDesc])
    run.__signature__ = signature(trtp.Tensor, [("outputs", tuple[trtp.Tensor]), ("stream", int)])
    trtp.register(TENSORRT_PLUGIN_IDS[0])(describe)
    trtp.impl(TENSORRT_PLUGIN_IDS[0])(run)
    _tensorrt_registered = True
    return TENSORRT_PLUGIN_IDS
