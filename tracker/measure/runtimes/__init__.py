"""Runtimes an attempt runs in: the `Runtime` protocol, ONNX Runtime, onnx's ReferenceEvaluator."""
