"""Accuracy-aware search over the registry's entries, their knobs and chains (`ForwardSearch`), within a budget: a
`Strategy` the study runs (`Study.search`, `Study.run_strategy`)."""

from tracker.search.budget import Budget, parse_budget
from tracker.search.result import Proposal, SearchConfig, SearchResult, Strategy
from tracker.search.run import ForwardSearch

__all__ = ["Budget", "ForwardSearch", "Proposal", "SearchConfig", "SearchResult", "Strategy", "parse_budget"]
