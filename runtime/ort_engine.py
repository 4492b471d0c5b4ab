"""OrtEngine: the decoder graph on ONNX Runtime, as a named-tensor function with an in-place cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trt_llm.runtime.kv_cache import KVCache


class OrtEngine:
    def __init__(self, engine_path: Path, num_layers: int, threads: int = 0, spinning: bool = True):
        """spinning: ONNX Runtime's idle threads spin for the next run (fast back-to-back runs). Turn it
        off where two sessions alternate with host work in between (EAGLE's base and draft): the idle
        pool's spinning threads then take the cores from the session that runs."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        if not spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        options.intra_op_num_threads = threads  # 0 = ONNX Runtime's choice (all physical cores)
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self._ort = ort
        self.session = ort.InferenceSession(str(engine_path), options, providers=["CPUExecutionProvider"])
        self.num_layers = num_layers
        self._binding = self.session.io_binding()
        self._bound = None  # what the cache/logits bindings point at now

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        """A cache this engine can bind: [batch, Hkv, capacity, D] per layer, in the graph's dtype."""
        past = next(i for i in self.session.get_inputs() if i.name == "past_key_0")
        dtype = {"tensor(float)": np.float32, "tensor(float16)": np.float16}[past.type]
        return KVCache(self.num_layers, batch, past.shape[1], capacity, past.shape[3], dtype)

    def run(self, inputs_embeds: np.ndarray, position_ids: np.ndarray, past_lengths: np.ndarray,
            query_lengths: np.ndarray, logits_indices: np.ndarray, cache: KVCache,
            logits_out: np.ndarray, extra: dict[str, np.ndarray] | None = None,
            step_inputs: dict[str, np.ndarray] | None = None,
            step_outputs: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """One forward pass; writes the new tokens into `cache` and the logits into `logits_out`.

        logits_out: float32 [B, K, V], preallocated by the caller and reused across steps.
        extra: inputs that stay the same for a whole batch (the LoRA inputs), bound with the cache.
        step_inputs / step_outputs: more per-call inputs (an EAGLE tree_mask, a draft's hidden) and
        preallocated outputs (an EAGLE base's hidden_states, a draft's hidden_out).
        """
        extra = extra or {}
        binding = self._binding
        for name, array in (("inputs_embeds", inputs_embeds), ("position_ids", position_ids),
                            ("past_lengths", past_lengths), ("query_lengths", query_lengths),
                            ("logits_indices", logits_indices), *(step_inputs or {}).items()):
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name, array in (step_outputs or {}).items():
            binding.bind_output(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
        # Logits are bound every call (their width changes with each EAGLE verification); the cache
        # bindings only when the batch does: re-binding 2 x layers buffers every step would cost
        # more than the small inputs above (about 1.5 ms a verification pass on 30 layers).
        binding.bind_output("logits", "cpu", 0, logits_out.dtype, logits_out.shape, logits_out.ctypes.data)
        key = (cache.batch, cache.capacity, *(b.ctypes.data for b in (*cache.keys, *cache.values)),
               *((n, a.ctypes.data, a.shape) for n, a in extra.items()))
        if key != self._bound:
            for i, (key_buffer, value_buffer) in enumerate(cache.views()):
                # The same memory as past input and present output: the op updates it in place.
                for kind, buffer in (("key", key_buffer), ("value", value_buffer)):
                    binding.bind_input(f"past_{kind}_{i}", "cpu", 0, buffer.dtype, buffer.shape,
                                       buffer.ctypes.data)
                    binding.bind_output(f"present_{kind}_{i}", "cpu", 0, buffer.dtype, buffer.shape,
                                        buffer.ctypes.data)
            for name, array in extra.items():
                binding.bind_input(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
            self._bound = key
        self.session.run_with_iobinding(binding)
        return logits_out
