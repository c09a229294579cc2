"""Causal LMs as study subjects (GPT-2 and the LLaMA family): load a local folder or build one offline, make token
inputs, export it to ONNX (forward, or ready to decode) and verify the export against PyTorch."""
