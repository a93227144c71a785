"""Measuring: timing and the machine probe, the environment's fingerprint, metrics from timestamps, and other work on the machine."""
