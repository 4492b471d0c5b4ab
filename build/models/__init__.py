"""The build's shared decoder code: `layers.py` (the layers every family is made of), `llama.py` (the
Llama-shaped decoder graph), `hybrid.py` (the graph of attention and recurrent layers by
`layer_types`), `moe.py` (a sparse MoE block as the MoE op). The families themselves, their faces and
their own modules, are packages of `trt_llm.families`."""
