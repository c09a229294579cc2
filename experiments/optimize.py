"""Entry point `optimize`: `tracker optimize MODEL.onnx` under `mlflow run . -e optimize -P model=...`."""

from __future__ import annotations

import sys

from tracker.cli import main

if __name__ == "__main__":
    sys.exit(main(["optimize", *sys.argv[1:]]))
