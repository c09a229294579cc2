"""Generation with a KV cache: prefill, decode, their speed-ups and rooflines, the token check."""
