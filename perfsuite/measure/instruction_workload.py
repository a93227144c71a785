"""What the instruction lane runs: an engine over the fake runner, and a fixed offline workload.

Shared by the lane's parent (``perfsuite.measure.instructions``) and the
process it runs under Valgrind (``perfsuite.measure.instructions_child``),
so both build the same engine and the same requests from one description.
Pure Python, no torch: the lane counts host instructions, and the fake
runner (``perfsuite.engine.fake_runner``) does no tensor work.

Every request arrives at time 0 and ignores EOS, so the number of engine
steps is a function of the workload alone, never of the machine's speed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from perfsuite.engine.engine import inflight_engine, paged_engine, static_engine
from perfsuite.engine.fake_runner import FakeRunner
from perfsuite.engine.names import INFLIGHT, OWN_ENGINES, PAGED, PAGED_PREFIX, STATIC
from perfsuite.engine.types import Request, SamplingParams


@dataclass(frozen=True, slots=True)
class InstructionWorkload:
    """An engine and the requests it serves while its instructions are counted.

    ``engine``: one of perfsuite's engines (``static``, ``inflight``,
    ``paged``, ``paged-prefix``), or a user's engine as ``"module:function"``:
    ``function(runner, workload)`` returns an engine, built over ``runner``
    (a ``FakeRunner``), whose ``run(requests)`` serves every request. The
    module is imported in the measured process, from the test's rootdir.
    """

    engine: str = INFLIGHT
    num_requests: int = 16
    prompt_len: int = 24
    max_new_tokens: int = 24
    batch_size: int = 8
    max_seq_len: int = 128
    vocab_size: int = 97

    def __post_init__(self) -> None:
        for name in ("num_requests", "prompt_len", "max_new_tokens", "batch_size", "max_seq_len", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"InstructionWorkload.{name} must be a positive int, got {value!r}")
        if self.prompt_len + self.max_new_tokens > self.max_seq_len:
            raise ValueError(
                f"InstructionWorkload: prompt_len + max_new_tokens ({self.prompt_len + self.max_new_tokens}) "
                f"exceeds max_seq_len ({self.max_seq_len}); raise max_seq_len or shorten the requests"
            )
        if self.engine not in OWN_ENGINES and not _is_import_path(self.engine):
            raise ValueError(
                f"InstructionWorkload.engine {self.engine!r}: name one of {', '.join(OWN_ENGINES)}, "
                "or a user's engine factory as 'module:function' (function(runner, workload) -> engine)"
            )

    @property
    def label(self) -> str:
        return (
            f"{self.engine} x{self.num_requests} requests, {self.prompt_len}+{self.max_new_tokens} tokens, "
            f"batch {self.batch_size}"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InstructionWorkload:
        return cls(**data)


def _is_import_path(engine: str) -> bool:
    module, colon, function = engine.partition(":")
    return bool(colon) and all(part.isidentifier() for part in (*module.split("."), function))


def requests_of(workload: InstructionWorkload) -> list[Request]:
    """Distinct prompts, all arriving at once; EOS ignored, so each request makes exactly ``max_new_tokens``."""
    params = SamplingParams(workload.max_new_tokens, ignore_eos=True)
    return [
        Request(
            f"r{index}",
            tuple((index * 31 + position * 7 + 1) % workload.vocab_size for position in range(workload.prompt_len)),
            params,
        )
        for index in range(workload.num_requests)
    ]


def engine_of(workload: InstructionWorkload, runner: FakeRunner) -> Any:
    """The workload's engine over ``runner``: perfsuite's by name, or the user's factory imported by its path."""
    if workload.engine in OWN_ENGINES:
        return _own_engine(workload, runner)
    module_name, _, function_name = workload.engine.partition(":")
    factory: Callable[[FakeRunner, InstructionWorkload], Any] = getattr(
        importlib.import_module(module_name), function_name
    )
    return factory(runner, workload)


def _own_engine(workload: InstructionWorkload, runner: FakeRunner) -> Any:
    batch, length = workload.batch_size, workload.max_seq_len
    if workload.engine == STATIC:
        return static_engine(runner, batch_size=batch, max_seq_len=length, eos_token_id=None)
    if workload.engine == INFLIGHT:
        return inflight_engine(runner, decode_batch_size=batch, max_seq_len=length, eos_token_id=None)
    assert workload.engine in (PAGED, PAGED_PREFIX), workload.engine
    prefix = workload.engine == PAGED_PREFIX
    return paged_engine(
        runner, decode_batch_size=batch, max_seq_len=length, eos_token_id=None, enable_prefix_caching=prefix
    )
