"""ONNX Runtime's session-time graph optimizations switched off or on: the same model file, other settings.

These measure what ORT does when it loads a model. `ort_opt_enabled` sets ORT's default level
(ORT_ENABLE_ALL) explicitly, so against a default-settings baseline it is an A/A comparison: it shows the
noise floor of the speed-up on that model.
"""

from __future__ import annotations

from tracker.optimize.entry import session_entry

DISABLED = session_entry("ort_opt_disabled", "ORT's session graph optimizations off (ORT_DISABLE_ALL)",
                         "ORT graph optimizations off (ORT_DISABLE_ALL)", graph_optimization_level="disable")
ENABLED = session_entry("ort_opt_enabled", "ORT's session graph optimizations on (ORT_ENABLE_ALL, the default)",
                        "ORT graph optimizations on (ORT_ENABLE_ALL)", graph_optimization_level="all")
