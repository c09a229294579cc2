"""Graph fusions: one pattern per module, each a `fuse_*(model) -> FusionResult` function."""
