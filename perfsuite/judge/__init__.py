"""Judging a run: statistics, the baselines it is compared with, the run's identity, and the typed results."""
