"""The Llama-shaped decoders (pre-norm attention and an MLP, maybe q/k norms, sliding layers, soft-caps,
LongRoPE, experts): one graph, build/models/llama.py, reads what each config says; what a config does
not say is a flag here."""

from trt_llm.families.face import Family

DECODER = "trt_llm.build.models.llama"

FAMILIES = (
    Family("llama", "LlamaForCausalLM", DECODER),
    Family("qwen2", "Qwen2ForCausalLM", DECODER),
    Family("qwen3", "Qwen3ForCausalLM", DECODER, qk_norm=True),
    Family("mistral", "MistralForCausalLM", DECODER),
    Family("ministral", "MinistralForCausalLM", DECODER),
    Family("phi3", "Phi3ForCausalLM", DECODER),
    Family("gemma2", "Gemma2ForCausalLM", DECODER, gemma=True),
    Family("gemma3_text", "Gemma3ForCausalLM", DECODER, qk_norm=True, gemma=True),
    Family("qwen3_moe", "Qwen3MoeForCausalLM", DECODER, qk_norm=True, checks="trt_llm.build.config_checks:moe_layers"),
)
