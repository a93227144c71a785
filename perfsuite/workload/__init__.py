"""Seeded workloads: which prompts arrive when, asking for how many tokens.

Pure Python; a tokenizer is passed in as a function. A workload has three
independent parts, each a frozen dataclass in a module of its own:

- ``prompts``: the shipped prompt set, synthetic token ids of drawn lengths, or a
  user's JSONL file;
- ``lengths``: how many new tokens each request asks for (and how long a
  synthetic prompt is);
- ``arrivals``: offline, a Poisson or gamma process at a rate, or a fixed concurrency.

``workload.Workload`` joins them under one seed; ``Workload.from_dict`` builds one
from plain data (a sweep config's entries). ``shaped.ShapedWorkload`` serves
requests that relate to each other instead: ``shared_prefix`` groups,
``multi_turn`` conversations and ``trace`` replay (one module each). Every bad value raises ValueError
naming the field. ``profiles`` sizes the plugin's workloads; ``sweep`` expands a
TOML grid into cases.
"""

from perfsuite.workload.arrivals import Arrivals, parse_arrivals
from perfsuite.workload.lengths import (
    LENGTH_KINDS,
    PROMPT_LENGTH_KINDS,
    OutputLengths,
    PromptLengths,
    parse_output_lengths,
    parse_prompt_lengths,
)
from perfsuite.workload.multi_turn import MultiTurn
from perfsuite.workload.prompts import (
    JSONL_KEYS,
    JsonlPrompts,
    PromptLine,
    PromptSource,
    ShippedPrompts,
    SyntheticPrompts,
    Vocab,
    parse_prompts,
    shipped_prompts,
)
from perfsuite.workload.shaped import SHAPE_KINDS, ShapedWorkload, parse_shape, parse_workload_option
from perfsuite.workload.shared_prefix import SharedPrefix
from perfsuite.workload.trace import Trace
from perfsuite.workload.workload import WORKLOAD_KEYS, Workload, mixed_workload

__all__ = [
    "JSONL_KEYS",
    "LENGTH_KINDS",
    "PROMPT_LENGTH_KINDS",
    "SHAPE_KINDS",
    "WORKLOAD_KEYS",
    "Arrivals",
    "JsonlPrompts",
    "MultiTurn",
    "OutputLengths",
    "PromptLengths",
    "PromptLine",
    "PromptSource",
    "ShapedWorkload",
    "SharedPrefix",
    "ShippedPrompts",
    "SyntheticPrompts",
    "Trace",
    "Vocab",
    "Workload",
    "mixed_workload",
    "parse_arrivals",
    "parse_output_lengths",
    "parse_prompt_lengths",
    "parse_prompts",
    "parse_shape",
    "parse_workload_option",
    "shipped_prompts",
]
