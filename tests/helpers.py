"""Small helpers shared by the end-to-end tests."""

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from trt_llm.runtime.cache.context_cache import BLOCK_TOKENS
from trt_llm.runtime.engine_dir import EngineDir
from trt_llm.runtime.requests.runner import Runner
from trt_llm.schemas.input_file import load_input_file, parse_input_dict

PROMPTS = [
    "Hello there! Tell me a long story about a dragon who loved the sea.",
    "What is 2+2?",
    "List the planets of the solar system in order, with one fact about each.",
    "Hi",
]


def random_pictures(folder: Path, sizes: dict[str, tuple[int, int]]) -> dict[str, Path]:
    """Random RGB pictures written as files in `folder`, {name: (height, width)} -> {name: path}; the
    same pixels every run (one generator, seeded 0, in the dict's order)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for name, (height, width) in sizes.items():
        Image.fromarray((rng.random((height, width, 3)) * 255).astype(np.uint8)).save(folder / name)
    return {name: folder / name for name in sizes}


def image_request(*parts, **image_options) -> dict:
    """A user message of parts: a str is a text part, a path an image part (with image_options, e.g.
    Gemma 3's pan_and_scan)."""
    content = [{"type": "text", "text": p} if isinstance(p, str) else {"type": "image", "image": str(p), **image_options}
               for p in parts]
    return {"messages": [{"role": "user", "content": content}]}


def chat_request(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


def run_input(engine_dir, data: dict, threads: int = 1):
    """Run an input-file dict on an engine; returns the OutputFile."""
    loaded = parse_input_dict(json.loads(json.dumps(data)), source="<test>")
    assert not loaded.errors, loaded.errors
    return Runner(EngineDir.open(engine_dir), threads=threads).run(loaded, loaded.settings)


def run_file(engine, folder, requests: list[dict], max_new: int, batch_size=None, **options):
    """Greedy requests as an input file written in `folder` (media paths as given), run on a Runner with
    `options` (scheduling, prefill_chunk, context_reuse, ...); batch_size: all of them by default."""
    path = Path(folder) / "input.json"
    path.write_text(json.dumps({"batch_size": batch_size or len(requests), "temperature": 0.0,
                                "max_generate_length": max_new, "requests": requests}))
    loaded = load_input_file(path)
    return Runner(EngineDir.open(engine), threads=1, **options).run(loaded, loaded.settings)


def hf_greedy(model_dir, prompt_ids: list[int], max_new_tokens: int, logits_processor=None) -> list[int]:
    """transformers `generate`, greedy, on one request alone: the oracle."""
    model = _load(str(model_dir))
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False,
                             logits_processor=logits_processor)
    return out[0, len(prompt_ids):].tolist()


_MODELS = {}


def _load(model_dir: str):
    if model_dir not in _MODELS:
        _MODELS[model_dir] = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return _MODELS[model_dir]


def assert_adapter_rows_are_peft(model_dir, engine, adapter, text: str, new_tokens: int) -> None:
    """A batch of two rows of `text`, the first with `adapter`, the second without: the first gives
    PEFT's greedy tokens on the adapter, the second the base model's, and they differ."""
    import peft
    from transformers import AutoTokenizer

    data = {"temperature": 0.0, "max_generate_length": new_tokens, "available_lora_weights": {"a": adapter},
            "batch_size": 2, "requests": [{"messages": [{"role": "user", "content": text}], "lora_name": "a"},
                                          {"messages": [{"role": "user", "content": text}]}]}
    with_adapter, base = run_input(engine, data).responses
    ids = AutoTokenizer.from_pretrained(model_dir)(with_adapter.formatted_complete_request,
                                                   add_special_tokens=False)["input_ids"]
    tuned = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), adapter).eval()
    with torch.no_grad():
        expected = tuned.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False)[0, len(ids):]
    assert with_adapter.output_token_ids == expected.tolist()[: len(with_adapter.output_token_ids)]
    assert base.output_token_ids == hf_greedy(model_dir, ids, new_tokens)[: len(base.output_token_ids)]
    assert with_adapter.output_token_ids != base.output_token_ids


LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base_dir, out_dir, seed, rank=4, targets=LORA_MODULES, rslora=False):
    """A random PEFT adapter (LoRA B is zero when PEFT initialises it; randomise both)."""
    import peft

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(targets), use_rslora=rslora,
                             init_lora_weights=False)
    wrapped = peft.get_peft_model(model, config)
    for name, param in wrapped.named_parameters():
        if "lora_" in name:
            param.data.normal_(0, 0.3)
    wrapped.save_pretrained(out_dir)
    return str(out_dir)


def reuse_run(engine, folder, requests: list[dict], max_new: int, scheduling="static", batch_size=1,
              prefill_chunk=None, **settings):
    """run_file's requests on a Runner with context reuse, one a batch unless batch_size says otherwise
    (so each restores what the ones before it committed); settings: more of the file's (say
    context_cache_lookup_policy "bypass"). Returns the responses and each prompt's (token ids, image
    or clip spans (first token, tokens)). Every restore is whole blocks, short of the prompt."""
    path = folder / "input.json"
    path.write_text(json.dumps({"batch_size": batch_size, "temperature": 0.0, "max_generate_length": max_new,
                                "requests": requests, **settings}))
    loaded = load_input_file(path)
    runner = Runner(EngineDir.open(engine), threads=1, scheduling=scheduling, context_reuse=True,
                    prefill_chunk=prefill_chunk)
    formatter = runner.formatter(loaded.settings, loaded.source)
    prompts = []
    for index, slot in enumerate(loaded.requests):
        s = runner.prepare(index, slot, loaded.settings, formatter).sequence
        prompts.append((s.prompt_ids, [(first, count) for first, count, _ in s.media.spans()] if s.media else []))
    responses = runner.run(loaded, loaded.settings).responses
    assert all(r.finish_reason in ("end-of-sequence", "max-length") for r in responses), [r.error for r in responses]
    assert all(r.reused_tokens % BLOCK_TOKENS == 0 and r.reused_tokens < r.prompt_tokens for r in responses)
    return responses, prompts


def tokens_of_bypass(engine, folder, requests: list[dict], max_new: int, **settings) -> list[list[int]]:
    """Each request's tokens computed whole (context_cache_lookup_policy "bypass")."""
    responses, _ = reuse_run(engine, folder, requests, max_new, context_cache_lookup_policy="bypass", **settings)
    assert all(r.reused_tokens == 0 for r in responses)
    return [r.output_token_ids for r in responses]


def tiny_eagle_engine(tiny_model, build_engine_for, tmp_path_factory):
    """A 4-layer tiny Llama with a random EAGLE3 draft (it rarely guesses right), built for the session's
    fixtures (tests/conftest.py)."""
    from trt_llm.build.eagle.formats import save_draft_eagle_format
    from trt_llm.build.eagle.model import Eagle3Draft

    base = tiny_model("llama", num_hidden_layers=4)
    config = AutoModelForCausalLM.from_pretrained(base).config
    torch.manual_seed(0)
    draft = Eagle3Draft(Eagle3Draft.config_for_base(config, draft_vocab_size=200))
    for param in draft.parameters():
        if param.requires_grad:
            param.data.normal_(0, 0.2)
    draft.set_vocab_map(torch.randperm(config.vocab_size)[:200].sort().values)
    folder = tmp_path_factory.mktemp("draft")
    save_draft_eagle_format(draft, folder)
    return build_engine_for(base, draft={"model": str(folder), "max_draft_tree_size": 24, "max_verify_tree_size": 16})


class LiveServer:
    """uvicorn serving `app` on a free loopback port, in a thread; stopped by close()."""

    def __init__(self, app):
        import socket
        import threading
        import time

        import uvicorn

        # The socket is bound here and handed to uvicorn: a port probed, closed and bound again could be
        # taken in between by another test worker's server or client.
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.socket.close()


class Announced:
    """trt-llm-serve started with `--port 0`, in `server` (a Popen with stderr piped, text): it binds a free
    port itself and says which on stderr (`trt-llm-serve: listening on URL`), so no other test worker can
    take the port between a probe and the server's bind. Reads stderr in a thread from the start;
    `.stderr` is all of it so far (for assertion messages)."""

    def __init__(self, server):
        import queue
        import threading

        self.lines: list[str] = []
        self.heard: queue.Queue = queue.Queue()

        def read():
            for line in server.stderr:
                self.lines.append(line)
                self.heard.put(line)
            self.heard.put(None)  # stderr closed: the server exited

        self.server, self.reader = server, threading.Thread(target=read, daemon=True)
        self.reader.start()

    def url(self, timeout: float = 60) -> str:
        """The address, once the server says it listens there."""
        import queue

        while True:
            try:
                line = self.heard.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"the server did not come up in {timeout} s: {self.stderr}") from None
            assert line is not None, f"the server exited: {self.stderr}"
            if line.startswith("trt-llm-serve: listening on http://127.0.0.1:"):
                return line.split()[-1]

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout: float = 30) -> str:
        """Wait for the server to exit; all of its stderr."""
        self.server.wait(timeout=timeout)
        self.reader.join(timeout=timeout)
        return self.stderr
