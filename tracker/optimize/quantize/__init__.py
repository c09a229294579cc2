"""Quantization entries (int8 dynamic and static, int4) and the graph they start from."""
