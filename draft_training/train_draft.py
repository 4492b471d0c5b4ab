"""Fit an EAGLE3 draft to a base model on the CPU, from the base model's own greedy generations.

    python -m trt_llm.draft_training.train_draft --base HF_DIR --out DRAFT_DIR [--prompts N] [--gen-tokens T]
        [--extra-prompts FILE] [--epochs E] [--draft-vocab V] [--threads 2] [--data-cache FILE]
        [--init-from DRAFT_DIR]

Recipe (defaults in brackets):
 1. Data: the built-in chat prompts of draft_training/prompts.py (the first N [the 210 hand-written
    ones; up to 6,609 with two crossings of templates with topics]), then those of --extra-prompts
    (e.g. ones the base writes itself, draft_training/self_prompts.py), through the base tokenizer's chat
    template, each continued greedily for up to T [96] tokens (stopping at end of sequence) by this
    project's own cpu engine, built from the base for the purpose (transformers' greedy tokens,
    faster). One more transformers forward per sequence collects the features (`hidden_states[i]`
    for the aux ids: the hidden states entering base layers 2, L//2, L-3), the base's own next-token choice
    (argmax) and top-k [16] distribution at every position, and its last (normed) hidden state.
    --data-cache keeps all this in a file; a later run with more prompts reads it and generates only
    the new ones.
 2. Draft vocabulary: the V [8192] most frequent base choices over the training split (then the
    lowest token ids, for a BPE roughly the most frequent merges, to fill V); d2t/t2d accordingly.
 3. Model: one draft layer shaped like a base layer; embedding from the base (frozen), LM head from
    the base's LM head rows of the draft vocabulary, final norm from the base's. The midlayer starts
    as the base's last layer on its hidden half (norms, q/k/v columns of the hidden, o_proj, MLP; the
    embedding half small random) and fc as picking the deepest feature (--random-init: all random).
    --init-from DRAFT instead continues a fitted draft (its weights and its vocabulary), e.g. on more data.
    fc, the midlayer, the norm and the LM head are trained with AdamW (lr 1e-3, warm-up, cosine decay,
    batches of 4 sequences, E [8] epochs), the forward and backward passes in bf16 autocast where the CPU
    multiplies bf16 natively (AVX512-BF16 or AMX: an epoch 1.6x faster here, the same held-out accuracy;
    --precision), the weights and the optimizer in fp32.
 4. Loss: at base position t the step-0 input is (fc(features_t), embed(x_{t+1})) and the label is
    the base's choice for x_{t+2}; EAGLE3's training-time test unrolls `--ttt-steps` [3] steps, step k
    feeding the draft's own step-(k-1) hidden output (see Eagle3Draft.forward_ttt for the exact
    attention and positions) with label the base's choice for x_{t+2+k}. Per step: cross-entropy
    against the base's top-k distribution restricted to the draft vocabulary (--soft-top-k 0: against
    its argmax), plus --hidden-loss [1.0] x smooth-L1 between norm(hidden_out) and the base's own last
    normed hidden state at that position (what its LM head reads); step k weighted 0.8^k.
 5. Held-out: every 10th prompt. Each epoch prints the loss and the top-1 (top-5) accuracy of steps 0
    and 1 on the held-out prompts' generated tokens (a label outside the draft vocabulary counts as a
    miss; step 1 is fed the true step-0 token, so it is its accuracy when step 0 was right).
 6. Saved with save_draft_eagle_format (config.json + model.safetensors, the EAGLE authors' layout)
    plus train_report.json (arguments, per-epoch figures, timing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from trt_llm.draft_training.prompts import HANDWRITTEN, MAX_PROMPTS, prompt_set
from trt_llm.build.eagle.formats import load_draft, save_draft_eagle_format
from trt_llm.build.eagle.model import Eagle3Draft, count_parameters, default_aux_layer_ids


LOSS_DECAY = 0.8  # step k of the training-time test weighs 0.8^k (EAGLE3)
FP16_SAFE = 60000.0  # below fp16's largest finite value, 65,504


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------
# Data


def _eos_ids(model, tokenizer) -> set[int]:
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def chat_prompt_ids(tokenizer, prompts: list[str]) -> list[list[int]]:
    """Each prompt as one user turn through the base's chat template, ready for the assistant."""
    encoded = []
    for text in prompts:
        chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
        encoded.append(tokenizer(chat, add_special_tokens=False)["input_ids"])
    return encoded


def cpu_engine_model(base_dir: str, batch_size: int, max_input_len: int, capacity: int, threads: int,
                     work_dir: Path):
    """This project's cpu engine for the base, built in `work_dir`, opened for the decode loop."""
    from trt_llm.build.cli import build_engine
    from trt_llm.runtime.engine_dir import EngineDir
    from trt_llm.runtime.requests.runner import Runner
    from trt_llm.schemas.build_config import MAX_BATCH_SIZE, BuildConfig

    config = BuildConfig(model=base_dir, output_dir=str(work_dir / "engine"), max_batch_size=min(batch_size, MAX_BATCH_SIZE),
                         max_input_len=max_input_len, max_kv_cache_capacity=capacity)
    return Runner(EngineDir.open(build_engine(config, progress=False)), threads, spec_decode=False).model


def generate(base_dir: str, prompt_ids: list[list[int]], gen_tokens: int, batch_size: int, threads: int,
             work_dir: Path) -> list[dict]:
    """Greedy continuations by this project's own cpu engine, built from the base in `work_dir`
    (token-identical to transformers' greedy `generate`, which is tested, and faster on a CPU: no
    padding, no Python per layer; 75 against 28 tokens/s on 2 shared cores): see continue_prompts."""
    longest = max(len(ids) for ids in prompt_ids)
    model = cpu_engine_model(base_dir, batch_size, longest, longest + gen_tokens, threads, work_dir)
    return continue_prompts(model, prompt_ids, gen_tokens, batch_size)


def continue_prompts(model, prompt_ids: list[list[int]], gen_tokens: int, batch_size: int,
                     temperature: float = 0.0, seed: int = 0) -> list[dict]:
    """Up to `gen_tokens` more tokens for each prompt, on an engine from cpu_engine_model that fits them:
    [{'ids': LongTensor (prompt + generated, ending with the end-of-sequence token when there was one),
    'prompt_len', 'eos_end'}]. Greedy; temperature > 0 samples instead, from the full distribution (no
    top-k or top-p), prompt i with seed `seed + i` whatever the batching."""
    from trt_llm.runtime.engine.sequence import END_OF_SEQUENCE, Sequence
    from trt_llm.runtime.engine.generate import generate as engine_generate
    from trt_llm.runtime.sampling.sampler import Sampler, SamplingParams
    from trt_llm.schemas.build_config import MAX_BATCH_SIZE

    batch_size = min(batch_size, MAX_BATCH_SIZE)  # as cpu_engine_model built it
    params = SamplingParams(temperature=temperature, top_k=0, top_p=1.0)
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))  # similar lengths batch together
    results: list[dict | None] = [None] * len(prompt_ids)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        sequences = [Sequence(list(prompt_ids[i]), gen_tokens) for i in chunk]
        engine_generate(model, sequences, Sampler([params] * len(chunk), [seed + i for i in chunk]))
        for i, s in zip(chunk, sequences):
            results[i] = {"ids": torch.tensor(s.prompt_ids + s.generated, dtype=torch.long),
                          "prompt_len": len(s.prompt_ids), "eos_end": s.finish_reason == END_OF_SEQUENCE}
        if (start // batch_size) % 10 == 0:
            log(f"generated {min(start + batch_size, len(order))}/{len(order)} sequences")
    return results


def collect_features(model, sequences: list[dict], aux_ids: list[int], batch_size: int = 8, top_k: int = 16) -> None:
    """Adds 'features' [N, len(aux) * H], 'choice' [N] (the base's argmax after each position) and
    'top_ids'/'top_probs' [N, top_k] (its most likely next tokens and their probabilities) and 'final'
    [N, H] (its last hidden state after the final norm: the base's logits are lm_head(final)); the
    hidden states in fp16 where they fit (half_if_in_range)."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]["ids"]))
    for start in range(0, len(order), batch_size):
        chunk = [sequences[i] for i in order[start:start + batch_size]]
        width = max(len(s["ids"]) for s in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, s in enumerate(chunk):  # right padding: real positions are unaffected
            ids[row, :len(s["ids"])] = s["ids"]
            mask[row, :len(s["ids"])] = 1
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        features = torch.cat([out.hidden_states[i] for i in aux_ids], dim=-1)
        choice = out.logits.argmax(-1)
        top_probs, top_ids = out.logits.float().softmax(-1).topk(top_k, dim=-1)
        for row, s in enumerate(chunk):
            n = len(s["ids"])
            s["features"] = half_if_in_range(features[row, :n])
            s["choice"] = choice[row, :n].clone()
            s["top_ids"], s["top_probs"] = top_ids[row, :n].clone(), top_probs[row, :n].clone()
            s["final"] = half_if_in_range(out.hidden_states[-1][row, :n])


def half_if_in_range(hidden: torch.Tensor) -> torch.Tensor:
    """Hidden states as kept for training: fp16 (2e-4 relative error, half the memory and the cache file:
    13 GB for 8,800 SmolLM2 sequences in fp32), or fp32 where a value is beyond fp16's range (a model's
    massive activations reach 25k in SmolLM2, fp16 ends at 65,504). Batch reads either into fp32."""
    if hidden.abs().max() < FP16_SAFE:
        return hidden.half()
    return hidden.clone()


def choose_vocab(sequences: list[dict], size: int, vocab_size: int) -> torch.Tensor:
    """The target ids of the draft vocabulary, ascending: the `size` most frequent base choices."""
    if size >= vocab_size:
        return torch.arange(vocab_size)
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in sequences:
        counts += torch.bincount(s["choice"], minlength=vocab_size)
    ranked = sorted(range(vocab_size), key=lambda t: (-int(counts[t]), t))  # then the lowest ids
    return torch.tensor(sorted(ranked[:size]), dtype=torch.long)


class Batch:
    """Right-padded rows; row t of a sequence is the base position t (see the module docstring)."""

    def __init__(self, sequences: list[dict], steps: int, target_to_draft: torch.Tensor, pad_id: int,
                 soft: bool = False, generated_only: bool = False):
        rows = [len(s["ids"]) - 1 for s in sequences]  # rows t = 0 .. N-2 (x_{t+1} must exist)
        width = max(rows)
        b = len(sequences)
        feat_dim = sequences[0]["features"].shape[-1]
        self.features = torch.zeros(b, width, feat_dim)
        self.position_ids = torch.arange(width)[None].expand(b, width)
        self.key_padding = torch.zeros(b, width, dtype=torch.bool)
        self.tokens = torch.full((steps, b, width), pad_id, dtype=torch.long)
        self.labels = torch.full((steps, b, width), -100, dtype=torch.long)
        self.target = torch.full((steps, b, width), -1, dtype=torch.long)  # target ids, for accuracy
        self.generated = torch.zeros(steps, b, width, dtype=torch.bool)
        top_k = sequences[0]["top_ids"].shape[-1] if soft else 0
        self.soft_ids = torch.zeros(steps, b, width, top_k, dtype=torch.long)  # draft ids
        self.soft_probs = torch.zeros(steps, b, width, top_k)  # renormalised over the draft vocabulary
        self.final = torch.zeros(steps, b, width, sequences[0]["final"].shape[-1])  # the base's normed hidden
        for i, s in enumerate(sequences):
            n, p = len(s["ids"]), s["prompt_len"]
            last = n - 2 if s.get("eos_end") else n - 1  # the last j whose choice was (or would be) emitted
            self.features[i, :n - 1] = s["features"][:n - 1]
            self.key_padding[i, :n - 1] = True
            for k in range(steps):
                count = last - k  # rows t with t + 1 + k <= last
                if count <= 0:
                    continue
                j = torch.arange(count) + 1 + k  # the token index fed at step k; the label is choice[j]
                self.tokens[k, i, :count] = s["ids"][j]
                self.target[k, i, :count] = s["choice"][j]
                self.labels[k, i, :count] = target_to_draft[s["choice"][j]]
                self.final[k, i, :count] = s["final"][j]
                self.generated[k, i, :count] = j >= p - 1  # the label is a generated token's successor
                if soft:
                    ids = target_to_draft[s["top_ids"][j]]
                    probs = s["top_probs"][j] * (ids >= 0)
                    self.soft_ids[k, i, :count] = ids.clamp(min=0)
                    self.soft_probs[k, i, :count] = probs / probs.sum(-1, keepdim=True).clamp(min=1e-9)
        if generated_only:  # no loss where the label follows a prompt token
            self.labels[~self.generated] = -100
            self.soft_probs[~self.generated] = 0.0
            self.target_for_loss = self.target.masked_fill(~self.generated, -1)
        else:
            self.target_for_loss = self.target


def make_batches(sequences: list[dict], batch_size: int, steps: int, target_to_draft, pad_id: int,
                 shuffle: bool, rng: random.Random, soft: bool = False, generated_only: bool = False):
    """The batches of one pass, each built when it is reached: all of them at once would hold every
    feature again, padded, and the final hidden once per step (3x the cached data, which is ~9 GB for
    6,000 SmolLM2 sequences). The order is drawn when this is called."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]["ids"]))
    groups = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    if shuffle:
        for group in groups:
            rng.shuffle(group)
        rng.shuffle(groups)
    return (Batch([sequences[i] for i in group], steps, target_to_draft, pad_id, soft, generated_only)
            for group in groups)


# ---------------------------------------------------------------------------------------------------
# Model and training


def init_draft(base, draft_ids: torch.Tensor, aux_ids: list[int], seed: int,
               init_layer: int | None = None) -> Eagle3Draft:
    torch.manual_seed(seed)
    config = Eagle3Draft.config_for_base(base.config, draft_vocab_size=len(draft_ids), aux_layer_ids=aux_ids)
    draft = Eagle3Draft(config)
    with torch.no_grad():
        for module in draft.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, 0.02)
        draft.embed_tokens.weight.copy_(base.get_input_embeddings().weight)
        draft.lm_head.weight.copy_(base.get_output_embeddings().weight[draft_ids])
        draft.norm.weight.copy_(base.model.norm.weight)
        draft.set_vocab_map(draft_ids)
        if init_layer is not None:  # the midlayer starts as base layer `init_layer` on the hidden half
            layer, mid, h = base.model.layers[init_layer], draft.midlayer, base.config.hidden_size
            mid.hidden_norm.weight.copy_(layer.input_layernorm.weight)
            mid.post_attention_layernorm.weight.copy_(layer.post_attention_layernorm.weight)
            for name in ("q_proj", "k_proj", "v_proj"):
                getattr(mid.self_attn, name).weight[:, h:].copy_(getattr(layer.self_attn, name).weight)
            mid.self_attn.o_proj.weight.copy_(layer.self_attn.o_proj.weight)
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(mid.mlp, name).weight.copy_(getattr(layer.mlp, name).weight)
            fc = torch.zeros_like(draft.fc.weight)
            fc[:, -h:] = torch.eye(h)  # starts as the last feature (the deepest hidden state)
            draft.fc.weight.copy_(fc + 0.02 * torch.randn_like(fc))
    draft.aux_layer_ids = list(aux_ids)
    return draft


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX), where bf16 autocast pays: without,
    bf16 matmuls are emulated and slower than fp32."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def training_precision(choice: str) -> str:
    """--precision: auto is bf16 where native_bf16(), else fp32."""
    if choice == "auto":
        return "bf16" if native_bf16() else "fp32"
    return choice


def autocast(precision: str):
    """The context the training passes run in: bf16 autocast (matmuls in bf16, reductions such as
    log-softmax kept in fp32 by autocast's own rules; weights and gradients stay fp32), or nothing."""
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def run_batch(draft: Eagle3Draft, batch: Batch, steps: int):
    embeds = [draft.embed_tokens(batch.tokens[k]) for k in range(steps)]
    return draft.forward_ttt(batch.features, embeds, batch.position_ids, batch.key_padding)


def batch_loss(outputs, batch: Batch, draft: Eagle3Draft | None = None, hidden_weight: float = 0.0) -> torch.Tensor:
    """Cross-entropy per step, step k weighted 0.8^k: against the base's choice where it is in the draft
    vocabulary, or (soft targets) against the base's top-k distribution restricted to the draft vocabulary;
    plus, with hidden_weight, a smooth-L1 pull of norm(hidden_out) towards the base's own normed last
    hidden state at the same position (what the base's LM head reads)."""
    total, weight = 0.0, 0.0
    for k, (logits, hidden_out) in enumerate(outputs):
        labels = batch.labels[k]
        if not (labels >= 0).any():
            continue
        if batch.soft_ids.shape[-1]:
            log_probs = logits.log_softmax(-1).gather(-1, batch.soft_ids[k])
            rows = batch.soft_probs[k].sum(-1) > 0
            loss = -(batch.soft_probs[k] * log_probs).sum(-1)[rows].mean()
        else:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
        if hidden_weight:
            rows = batch.target_for_loss[k] >= 0
            loss = loss + hidden_weight * F.smooth_l1_loss(draft.norm(hidden_out)[rows], batch.final[k][rows])
        total = total + LOSS_DECAY ** k * loss
        weight += LOSS_DECAY ** k
    return total / max(weight, 1e-9)


@torch.no_grad()
def evaluate(draft: Eagle3Draft, batches, steps: int) -> dict:
    """Held-out loss and top-1/top-5 accuracy per step over the labels that follow generated tokens (step k
    is fed the true previous tokens, so its accuracy is the one it has when steps 0..k-1 were right)."""
    draft.eval()
    hits, hits5, counts, losses = [0] * steps, [0] * steps, [0] * steps, []
    for batch in batches:
        outputs = run_batch(draft, batch, steps)
        losses.append(float(batch_loss(outputs, batch)))
        for k, (logits, _) in enumerate(outputs):
            chosen = draft.draft_to_target(logits.argmax(-1))
            where = batch.generated[k] & (batch.target[k] >= 0)
            hits[k] += int((chosen[where] == batch.target[k][where]).sum())
            top5 = draft.draft_to_target(logits.topk(min(5, logits.shape[-1]), dim=-1).indices)
            hits5[k] += int((top5[where] == batch.target[k][where][:, None]).any(-1).sum())
            counts[k] += int(where.sum())
    draft.train()
    return {"loss": sum(losses) / max(len(losses), 1),
            "top1": [h / c if c else float("nan") for h, c in zip(hits, counts)],
            "top5": [h / c if c else float("nan") for h, c in zip(hits5, counts)], "tokens": counts}


def train(draft: Eagle3Draft, train_seqs, held_seqs, args, target_to_draft, pad_id: int) -> list[dict]:
    rng = random.Random(args.seed)
    steps = args.ttt_steps
    precision = args.precision  # resolved by main: fp32 or bf16
    soft = args.soft_top_k > 0
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    per_epoch = math.ceil(len(train_seqs) / args.batch_size)
    total = max(per_epoch * args.epochs, 1)
    warmup = min(max(total // 20, 1), 50)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min(1.0, (i + 1) / warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(i / total, 1.0)))))
    history = []
    draft.train()
    for epoch in range(1, args.epochs + 1):
        start = time.time()
        batches = make_batches(train_seqs, args.batch_size, steps, target_to_draft, pad_id, True, rng, soft,
                               args.generated_only)
        running, count = 0.0, 0
        for batch in batches:
            with autocast(precision):
                loss = batch_loss(run_batch(draft, batch, steps), batch, draft, args.hidden_loss)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            running += loss.item()
            count += 1
        record = {"epoch": epoch, "train_loss": running / max(count, 1), "seconds": time.time() - start,
                  "precision": precision}
        if held_seqs:  # in fp32, as the engine runs the draft
            result = evaluate(draft, make_batches(held_seqs, args.batch_size, steps, target_to_draft, pad_id, False,
                                                  rng, soft), steps)
            record.update(held_loss=result["loss"], held_top1=result["top1"], held_top5=result["top5"],
                          held_tokens=result["tokens"])
            accuracies = "  ".join(f"step{k} top1 {a:.3f} (top5 {b:.3f})"
                                   for k, (a, b) in enumerate(zip(result["top1"][:2], result["top5"][:2])))
            log(f"epoch {epoch:3d}  train loss {record['train_loss']:.3f}  held-out loss {result['loss']:.3f}  "
                f"{accuracies}  ({record['seconds']:.1f}s)")
        else:
            log(f"epoch {epoch:3d}  train loss {record['train_loss']:.3f}  ({record['seconds']:.1f}s)")
        history.append(record)
    return history


def load_or_make_data(args, base, tokenizer, prompts: list[str], aux_ids: list[int], t0: float) -> list[dict]:
    """The generations and features for `prompts`, from --data-cache where it has them: a cache made for
    the first m of these prompts (same base, --gen-tokens and features) is extended with the rest only."""
    def key(prompt_list):
        return json.dumps({"base": str(Path(args.base).expanduser().resolve()), "prompts": prompt_list,
                           "gen_tokens": args.gen_tokens, "aux": aux_ids})

    sequences: list[dict] = []
    have = 0
    if args.data_cache and Path(args.data_cache).is_file():
        cached = torch.load(args.data_cache, weights_only=True)
        count = len(cached["sequences"])
        if count <= len(prompts) and cached.get("key") == key(prompts[:count]):
            sequences, have = cached["sequences"], count
            log(f"read {have} sequences from {args.data_cache}")
        else:
            log(f"{args.data_cache} was made for other data: not used")
    stale = bool(sequences) and ("final" not in sequences[0]  # a cache from before these features existed
                                 or sequences[0]["top_ids"].shape[-1] < args.soft_top_k)
    new: list[dict] = []
    if len(sequences) < len(prompts):
        todo = prompts[len(sequences):]
        with tempfile.TemporaryDirectory(prefix="train-draft-") as work_dir:
            new = generate(args.base, chat_prompt_ids(tokenizer, todo), args.gen_tokens, args.gen_batch_size,
                           args.threads, Path(work_dir))
        log(f"generated {sum(len(s['ids']) - s['prompt_len'] for s in new)} tokens for {len(todo)} prompts "
            f"({time.time() - t0:.0f}s)")
    if stale or new:
        collect_features(base, sequences + new if stale else new, aux_ids, top_k=max(args.soft_top_k, 1))
        log(f"collected features ({time.time() - t0:.0f}s)")
    sequences = sequences + new
    if args.data_cache and (stale or len(sequences) > have):
        torch.save({"key": key(prompts), "sequences": sequences}, args.data_cache)
    return sequences


def read_extra_prompts(path: str | None) -> list[str]:
    """--extra-prompts: a JSON list of non-empty strings (none without the option)."""
    if not path:
        return []
    prompts = json.loads(Path(path).read_text())
    if not isinstance(prompts, list) or not all(isinstance(p, str) and p.strip() for p in prompts):
        raise SystemExit(f"--extra-prompts {path}: expected a JSON list of non-empty strings")
    return prompts


# ---------------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trt_llm.draft_training.train_draft", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the base model: a local Hugging Face folder")
    parser.add_argument("--out", required=True, help="the draft folder to write (EAGLE authors' layout)")
    parser.add_argument("--prompts", type=int, default=len(HANDWRITTEN),
                        help=f"how many built-in prompts (<= {MAX_PROMPTS}; beyond the {len(HANDWRITTEN)} hand-written ones, "
                             "templates crossed with topics)")
    parser.add_argument("--extra-prompts", help="a JSON list of more chat prompts, after the built-in ones "
                        "(e.g. written by the base itself: python -m trt_llm.draft_training.self_prompts)")
    parser.add_argument("--gen-tokens", type=int, default=96, help="greedy tokens generated per prompt")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--draft-vocab", type=int, default=8192, help="draft vocabulary size (capped at the base's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ttt-steps", type=int, default=3, help="training-time-test steps unrolled (1 = none)")
    parser.add_argument("--batch-size", type=int, default=4, help="sequences per optimizer step")
    parser.add_argument("--gen-batch-size", type=int, default=16, help="sequences per generation batch")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                        help="training passes in bf16 autocast or fp32 (auto: bf16 where the CPU has native bf16)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--soft-top-k", type=int, default=16,
                        help="distil the base's top-k next-token distribution (0: its argmax only)")
    parser.add_argument("--hidden-loss", type=float, default=1.0,
                        help="weight of the pull towards the base's last hidden state (0: off)")
    parser.add_argument("--generated-only", action="store_true",
                        help="train only on labels that follow generated tokens (not on the prompts)")
    parser.add_argument("--init-layer", type=int, default=-1,
                        help="start the midlayer from this base layer's weights (default: the last one)")
    parser.add_argument("--random-init", action="store_true", help="start the midlayer from random weights")
    parser.add_argument("--freeze-head", action="store_true", help="keep the LM head and norm at the base's")
    parser.add_argument("--init-from", help="go on fitting this draft folder (its weights and vocabulary: "
                        "--draft-vocab, --init-layer and --random-init do not apply)")
    parser.add_argument("--data-cache", help="a file keeping the generations and features between runs")
    args = parser.parse_args(argv)
    if not 1 <= args.prompts <= MAX_PROMPTS:
        parser.error(f"--prompts must be 1..{MAX_PROMPTS}")
    if args.ttt_steps < 1 or args.epochs < 1 or args.gen_tokens < 1:
        parser.error("--ttt-steps, --epochs and --gen-tokens must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    args.precision = training_precision(args.precision)  # once: the report's args show what ran
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.time()
    tokenizer = AutoTokenizer.from_pretrained(args.base)
    base = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32).eval()
    layers = base.config.num_hidden_layers
    aux_ids = default_aux_layer_ids(layers)
    prompts = prompt_set(args.prompts) + read_extra_prompts(args.extra_prompts)
    log(f"base {args.base}: {layers} layers, hidden {base.config.hidden_size}, vocab {base.config.vocab_size}; "
        f"features = hidden states entering layers {aux_ids}")

    sequences = load_or_make_data(args, base, tokenizer, prompts, aux_ids, t0)
    eos = _eos_ids(base, tokenizer)
    for s in sequences:  # (caches written before eos_end existed)
        s.setdefault("eos_end", int(s["ids"][-1]) in eos and len(s["ids"]) > s["prompt_len"])
    generated = sum(len(s["ids"]) - s["prompt_len"] for s in sequences)

    held_idx = set(range(9, len(sequences), 10)) if len(sequences) >= 10 else set()
    train_seqs = [s for i, s in enumerate(sequences) if i not in held_idx]
    held_seqs = [s for i, s in enumerate(sequences) if i in held_idx]
    vocab_size = base.config.vocab_size
    if args.init_from:  # go on fitting a draft: its weights and its vocabulary
        draft = load_draft(args.init_from, base.config, base.get_input_embeddings().weight,
                           base_lm_head=base.get_output_embeddings().weight)
        if draft.aux_layer_ids != aux_ids:
            raise SystemExit(f"--init-from {args.init_from}: the draft reads layers {draft.aux_layer_ids}, "
                             f"the training features are {aux_ids}")
        draft_ids = draft.draft_to_target(torch.arange(draft.dims.draft_vocab_size))
    else:
        draft_ids = choose_vocab(train_seqs, min(args.draft_vocab, vocab_size), vocab_size)
        draft = init_draft(base, draft_ids, aux_ids, args.seed, None if args.random_init else args.init_layer)
    if args.freeze_head:  # a fresh or a continued draft alike
        draft.lm_head.weight.requires_grad_(False)
        draft.norm.weight.requires_grad_(False)
    target_to_draft = torch.full((vocab_size,), -100, dtype=torch.long)
    target_to_draft[draft_ids] = torch.arange(len(draft_ids))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    log(f"draft: {count_parameters(draft) / 1e6:.1f}M trainable parameters, draft vocab {len(draft_ids)}; "
        f"{len(train_seqs)} training / {len(held_seqs)} held-out sequences, {args.ttt_steps} TTT steps, "
        f"{args.precision} training passes")
    history = train(draft, train_seqs, held_seqs, args, target_to_draft, pad_id)

    out = save_draft_eagle_format(draft, args.out)
    report = {
        "base": str(args.base), "prompts": len(prompts), "generated_tokens": generated,
        "aux_layer_ids": aux_ids, "draft_vocab_size": len(draft_ids), "args": vars(args),
        "history": history, "seconds": time.time() - t0,
    }
    (out / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    final = history[-1]
    if "held_top1" in final:
        log(f"held-out top-1: step0 {final['held_top1'][0]:.3f}" +
            (f", step1 {final['held_top1'][1]:.3f}" if len(final["held_top1"]) > 1 else ""))
    log(f"wrote {out} ({time.time() - t0:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
