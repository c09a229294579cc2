"""Timing: latency statistics, the interleaved speed-up and its verdict, CPU load."""
