"""trt-llm-serve: the OpenAI-compatible server (app.py), its in-flight batching engine (engine.py),
the request bodies (protocol.py) and their conversion to the input file's requests (convert.py)."""
