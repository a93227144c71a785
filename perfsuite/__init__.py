"""perfsuite: make LLM inference batching measurable and safe to change."""

__version__ = "0.1.0"
