"""Side-by-side benchmark of trt-llm against its peers (benchmarks/decode_speed.py is the command).

    prompts.py       prompts of an exact token length, the same ids for every engine
    artifacts.py     build once, cache, time the build (its own process) and its peak RSS
    peers/           one module per engine: how to prepare its artifact, and a Runner for it
    gguf_convert.py  HF Llama directory -> F32 GGUF for llama.cpp
    worker.py        one engine in its own process (so its peak RSS is its own), driven over a pipe
    measure.py       thread pinning, read bandwidth, weight bytes, other processes' CPU
    report.py        rows, ratios, token check -> Markdown, JSON and PNG plots
"""
