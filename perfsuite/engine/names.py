"""Every engine's name, written once.

The registry (``perfsuite.adapters.registry``) maps each to what builds it,
the engines carry theirs, and the options, fixtures and report group them
by these tuples. Third-party engines bring their own names (entry points,
``register_engine``) and are in none of the groups.
"""

from __future__ import annotations

STATIC = "static"
INFLIGHT = "inflight"
PAGED = "paged"
PAGED_PREFIX = "paged-prefix"  # the paged engine with prefix caching: a kind of its own, so paged runs stay comparable
HF_STATIC = "hf-static"
HF_CB = "hf-cb"
OPENAI_HTTP = "openai-http"
VLLM = "vllm"

OWN_ENGINES = (STATIC, INFLIGHT, PAGED, PAGED_PREFIX)  # perfsuite's own, over its model runner
PAGED_ENGINES = (PAGED, PAGED_PREFIX)  # the engines with a KV block pool
SERVER_ENGINES = (OPENAI_HTTP,)  # clients of a server in another process
DEFAULT_ENGINES = (STATIC, INFLIGHT)  # what --perf-engines measures unless told
