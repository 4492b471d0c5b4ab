"""One cold chat request on a peer engine, in this fresh process: what a user's script does to get the
first token, timed from this process's start.

    python cold_run.py {llamacpp,genai} MODEL_PATH RESULT.json --threads T --capacity C --message TEXT

It imports the library, loads the model, applies the model's own chat template to the one user
message, generates one token (greedy) and writes {to_first_token_ms, before_run_ms, load_ms,
prompt_tokens, token, text, finish_reason, vmhwm_mb} to RESULT.json. Times count from the process's
start as trt-llm's profiler counts them (runtime/engine/profiler.py process_started: the start time in
/proc/self/stat), so trt-llm-run's `startup.to_first_token_ms` and these are on the same clock. The
script imports only the standard library and the engine's package, nothing of the benchmark, so the
process's peak RSS is the engine's own.
"""

import argparse
import json
import os
import sys
import time


def process_started() -> float:
    """This process's start on time.perf_counter's clock: the same reading as profiler.process_started."""
    with open("/proc/self/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    ticks = int(fields[19])  # field 22 of the whole line: starttime, in clock ticks since boot
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    now = time.perf_counter()
    return now - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))


def vmhwm_mb() -> float:
    """Peak RSS of this process (VmHWM: its own, not inherited across exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def llamacpp(path: str, threads: int, capacity: int, messages: list[dict]) -> dict:
    """llama-cpp-python as its README shows a chat: Llama(...) then create_chat_completion, which applies
    the GGUF's own chat template (tokenizer.chat_template)."""
    from llama_cpp import Llama

    loading = time.perf_counter()
    llm = Llama(model_path=path, n_ctx=capacity, n_threads=threads, n_threads_batch=threads, verbose=False)
    loaded = time.perf_counter()
    out = llm.create_chat_completion(messages=messages, max_tokens=1, temperature=0.0, top_k=1, top_p=1.0,
                                     min_p=0.0, repeat_penalty=1.0)
    first = time.perf_counter()
    # The binding returns text, not the sampled id ("" when it is the end of the turn: finish "stop").
    choice = out["choices"][0]
    return dict(first=first, load_s=loaded - loading, prompt_tokens=out["usage"]["prompt_tokens"], token=None,
                text=choice["message"]["content"] or "", finish_reason=choice["finish_reason"])


def genai(path: str, threads: int, capacity: int, messages: list[dict]) -> dict:
    """ONNX Runtime GenAI as its chat example does: Model, Tokenizer.apply_chat_template, encode,
    Generator; threads come from the folder's genai_config.json (peers/genai.py writes them)."""
    import onnxruntime_genai as og

    loading = time.perf_counter()
    model = og.Model(path)
    tokenizer = og.Tokenizer(model)
    loaded = time.perf_counter()
    prompt = tokenizer.apply_chat_template(json.dumps(messages), add_generation_prompt=True)
    ids = tokenizer.encode(prompt)
    params = og.GeneratorParams(model)
    # The same context as the other engines are set up for; one token is generated.
    params.set_search_options(do_sample=False, max_length=capacity)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)  # the prefill
    generator.generate_next_token()
    token = int(generator.get_next_tokens()[0])
    first = time.perf_counter()
    return dict(first=first, load_s=loaded - loading, prompt_tokens=len(ids), token=token,
                text=tokenizer.decode([token]), finish_reason=None)


ENGINES = {"llamacpp": llamacpp, "genai": genai}


def main() -> int:
    started = process_started()
    entered = time.perf_counter()
    parser = argparse.ArgumentParser()
    parser.add_argument("engine", choices=sorted(ENGINES))
    parser.add_argument("path")
    parser.add_argument("result")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--capacity", type=int, required=True)
    parser.add_argument("--message", required=True)
    args = parser.parse_args()
    done = ENGINES[args.engine](args.path, args.threads, args.capacity, [{"role": "user", "content": args.message}])
    result = {"to_first_token_ms": (done.pop("first") - started) * 1000, "before_run_ms": (entered - started) * 1000,
              "load_ms": done.pop("load_s") * 1000, **done, "vmhwm_mb": vmhwm_mb()}
    with open(args.result, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
