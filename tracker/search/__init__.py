"""Accuracy-aware search over the registry's entries, their knobs and chains (`run_search`), within a budget."""

from tracker.search.budget import Budget, parse_budget
from tracker.search.result import SearchConfig, SearchResult
from tracker.search.run import run_search

__all__ = ["Budget", "SearchConfig", "SearchResult", "parse_budget", "run_search"]
