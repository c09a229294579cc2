"""The bottom layer: errors, names MLflow accepts, step times, memory, model I/O, signals; imports nothing of the tracker."""
