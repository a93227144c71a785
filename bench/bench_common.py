"""What the bench/ scripts share: the model arguments, loading the model on its device, comma-separated choices."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perfsuite.models import LoadedModel


@dataclass(frozen=True, slots=True)
class BenchModel:
    """The loaded model, the device it is on and the CPU threads it may use (None on a GPU)."""

    loaded: LoadedModel
    device: str
    threads: int | None


def add_model_arguments(parser: argparse.ArgumentParser, model_help: str | None = None) -> None:
    """``--model``, ``--dtype``, ``--device`` and ``--threads``, as every bench script takes them."""
    from perfsuite.models import DEFAULT_MODEL

    parser.add_argument("--model", default=DEFAULT_MODEL, help=model_help)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=None)


def load_bench_model(args: argparse.Namespace) -> BenchModel:
    """The model ``add_model_arguments`` named, on its device; on a CPU, with ``--threads`` set first."""
    from perfsuite.measure.timing import configure_threads, resolve_device
    from perfsuite.models import load_model

    device = resolve_device(args.device)
    threads = configure_threads(args.threads) if device == "cpu" else None
    return BenchModel(load_model(args.model, device=device, dtype=args.dtype), device, threads)


def comma_choices(choices: Sequence[str], what: str = "workload") -> Callable[[str], tuple[str, ...]]:
    """An argparse type: a comma-separated list of at least one of ``choices``."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(item.strip() for item in text.split(",") if item.strip())
        unknown = [name for name in names if name not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown {what}(s) {unknown or text!r}; choose from {', '.join(choices)}")
        return names

    return parse


def comma_list(parse: Callable[[str], object]) -> Callable[[str], tuple]:
    """An argparse type: a comma-separated list, each item read by ``parse``."""

    def parse_list(text: str) -> tuple:
        return tuple(parse(item.strip()) for item in text.split(",") if item.strip())

    return parse_list
