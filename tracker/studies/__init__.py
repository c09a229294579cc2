"""The studies the project ships, each a thin user of `Study` and the registry in `tracker.optimize`.

`experiments/` holds their command lines (the MLproject entry points); these modules hold what they do.
"""
