"""Measuring one model: loading, feeds, running and timing it, its speed-up, output checks and graph stats."""
