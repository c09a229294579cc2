"""GPT-2 as a study subject: load or build it offline, make token inputs, export it to ONNX and verify the export."""
