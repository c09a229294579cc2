"""Output checks against the baseline, judged by task."""
