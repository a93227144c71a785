"""One side of ``pytest --perf --perf-against REF``: a long-lived process over one tree.

    python perfsuite/ab/worker_main.py --tree DIR

The controller runs this file by path, with the same Python and virtual
environment as itself. It puts ``DIR`` (and ``DIR/src``) first on
``sys.path``, so ``import perfsuite``, the engines and any engine package of
the tree come from ``DIR``: the reference commit's code for side A, the
current tree's for side B. Then it answers the messages of
``perfsuite/ab/wire.py`` (loaded by path, so nothing of the controller's
perfsuite is imported) on stdin and stdout, one JSON line each: load the
model once, tokenize, build engines by registered name, run them.

Everything else the process prints (warnings, a model's progress bars) goes
to stderr, which the controller keeps and shows when the worker fails. An
exception while serving a command is answered with ``Failed`` and the worker
takes the next one; a worker whose controller is gone (stdin closed, or the
parent process changed) exits.

Every perfsuite module the worker imports must come from the package
``perfsuite`` itself came from (the controller checks that one lies in the
side's tree). A tree that lacks a module is not completed from elsewhere: an
editable install's finder would otherwise hand side A the current tree's
module. After each message the worker looks, and answers ``Failed`` naming the
first module that came from outside.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
import traceback
from pathlib import Path

PARENT_CHECK_SECONDS = 0.5


def load_wire():
    """``wire.py`` beside this file, under a private name: the tree's own perfsuite must stay unimported."""
    spec = importlib.util.spec_from_file_location("_perfsuite_ab_wire", Path(__file__).with_name("wire.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def put_tree_first(tree: Path) -> None:
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if p and Path(p).resolve() != Path(here)]
    for folder in (tree / "src", tree):
        if folder.is_dir():
            sys.path.insert(0, str(folder))


def exit_with_parent() -> None:
    """A worker outlives no controller: stdin EOF covers an idle worker, this a busy one."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(PARENT_CHECK_SECONDS)
            if os.getppid() != parent:
                os._exit(70)

    threading.Thread(target=watch, name="perfsuite-parent-watch", daemon=True).start()


class Worker:
    def __init__(self, wire, tree: Path) -> None:
        self.wire = wire
        self.tree = tree
        self.backend = None
        self.engines: dict[str, object] = {}
        self._checked_modules: set[str] = set()

    def hello(self):
        import perfsuite

        return self.wire.Hello(
            protocol_version=self.wire.PROTOCOL_VERSION,
            tree=str(self.tree),
            perfsuite_file=str(Path(perfsuite.__file__).resolve()),
            pid=os.getpid(),
            python=sys.version.split()[0],
        )

    def foreign_module(self) -> str | None:
        """Why a perfsuite module imported so far lies outside the package ``perfsuite`` came from, or None.

        The outermost such module is named: the one the tree lacks (what it imported came along with it).
        """
        package_file = getattr(sys.modules.get("perfsuite"), "__file__", None)
        if package_file is None:
            return None  # not imported yet (or a namespace package, which the controller refuses as it says hello)
        home = Path(package_file).resolve().parent
        foreign: dict[str, Path] = {}
        for name, module in list(sys.modules.items()):
            if name in self._checked_modules or not name.startswith("perfsuite."):
                continue
            location = _location(module)
            if location is None or location.is_relative_to(home):
                self._checked_modules.add(name)
            else:
                foreign[name] = location
        if not foreign:
            return None
        name = min(foreign, key=lambda name: (name.count("."), name))
        return (
            f"{name} was imported from {foreign[name]}, not from this side's perfsuite ({home}): the tree lacks that "
            "module and another perfsuite on the path supplied it; give a REF whose tree has it"
        )

    def serve(self, message):
        handler = getattr(self, "on_" + type(message).__name__.lower(), None)
        if handler is None:
            raise ValueError(f"a worker does not take {type(message).__name__} messages")
        return handler(message)

    def on_load(self, message):
        from perfsuite.adapters import Backend
        from perfsuite.measure.timing import configure_threads, resolve_device
        from perfsuite.models import load_model

        device = resolve_device(message.device)
        if device == "cpu":
            configure_threads(message.threads)
        loaded = load_model(message.model, device=device, dtype=message.dtype)
        self.backend = Backend.from_loaded(loaded, decode_mode=message.decode_mode)
        return self.wire.Loaded(
            device=self.backend.device,
            model_bytes=_model_bytes(loaded.model),
            free_bytes=_free_bytes(self.backend.device),
            max_context=self.backend.max_context,
            eos_token_id=self.backend.eos_token_id,
            vocab_size=self.backend.vocab_size,
            special_token_ids=tuple(self.backend.special_token_ids),
        )

    def on_setthreads(self, message):
        import torch

        if message.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {message.num_threads}")
        torch.set_num_threads(message.num_threads)
        return self.wire.ThreadsSet(torch.get_num_threads())

    def on_tokenize(self, message):
        return self.wire.Tokens(tuple(int(t) for t in self._loaded().tokenize(message.text)))

    def on_build(self, message):
        from perfsuite.adapters import build_engine

        engine = build_engine(message.engine, self._loaded(), self._engine_config(message))
        self.engines[message.engine_id] = engine
        return self.wire.Built(
            engine_id=message.engine_id,
            name=engine.name,
            batch_size=engine.batch_size,
            runs_in_process=getattr(engine, "runs_in_process", True),
        )

    def on_run(self, message):
        from perfsuite.engine import Request
        from perfsuite.measure.timing import timed_run

        engine = self.engines.get(message.engine_id)
        if engine is None:
            raise KeyError(f"no engine {message.engine_id!r} was built in this worker; send Build first")
        requests = [self.wire.decode(Request, item) for item in message.requests]
        result = timed_run(engine, requests, self._loaded().device, max_concurrency=message.max_concurrency)
        return self.wire.RunDone(self.wire.encode(result))

    def _engine_config(self, build):
        """This tree's ``EngineConfig`` from ``build.config``, through the structural codec.

        An older tree's ``EngineConfig`` has fewer fields: an unset knob is not
        sent, so it gets its default there, and a set one it lacks is an error naming it.
        """
        from perfsuite.adapters import EngineConfig

        return self.wire.decode(EngineConfig, build.config)

    def _loaded(self):
        if self.backend is None:
            raise RuntimeError("no model loaded in this worker; send Load first")
        return self.backend


def _location(module) -> Path | None:
    """Where ``module`` was loaded from: its file, or a namespace package's first folder; None for neither."""
    where = getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", ())), None)
    return Path(where).resolve() if where else None


def _model_bytes(model) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in {id(t): t for t in tensors}.values())


def _free_bytes(device: str) -> int | None:
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--tree":
        print("usage: worker_main.py --tree DIR", file=sys.stderr)
        return 2
    tree = Path(argv[1]).resolve()
    wire = load_wire()
    # The protocol owns the real stdout; anything else written to fd 1 (a C library, a print) goes to stderr.
    protocol_out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    exit_with_parent()
    put_tree_first(tree)
    worker = Worker(wire, tree)
    try:
        hello = worker.hello()
    except Exception as error:
        hello = _failed(wire, error)
    hello = _unless_foreign(wire, worker, hello)
    wire.write_message(protocol_out, hello)
    if isinstance(hello, wire.Failed):
        return 3
    for line in sys.stdin:
        try:
            message = wire.loads_message(line)
            if isinstance(message, wire.Shutdown):
                return 0
            reply = worker.serve(message)
        except Exception as error:
            reply = _failed(wire, error)
        wire.write_message(protocol_out, _unless_foreign(wire, worker, reply))
    return 0  # stdin closed: the controller is gone


def _unless_foreign(wire, worker: Worker, reply):
    """``reply``, or ``Failed`` (no traceback) when a perfsuite module came from outside the side's tree: whatever
    the message did ran, in part, someone else's code, and any error it raised follows from that."""
    foreign = worker.foreign_module()
    return reply if foreign is None else wire.Failed("ImportError", foreign, "")


def _failed(wire, error: BaseException):
    return wire.Failed(type(error).__name__, str(error), traceback.format_exc())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
