"""Attention rewrites: onnxscript's fusions (`fusion`: attention_fused) and attention with a past as
GroupQueryAttention on one KV buffer (`shared_kv`, with `rotary_gqa` for LLaMA-family graphs)."""
