"""One pytest-xdist worker per GPU: which worker gets which device.

``pytest --perf -n auto`` starts one worker per visible GPU. The controller
gives each worker one device as xdist sets the worker up, and the worker
puts it in ``CUDA_VISIBLE_DEVICES`` in its ``pytest_configure``, before any
test or fixture has asked torch for CUDA (CUDA reads the variable once, when
it initialises). Each worker then sees its GPU as ``cuda:0``. The controller
judges the whole session from the workers' raw samples, as it does on CPU.

No torch and no pytest here: the hooks in ``hooks.py`` pass in the
environment, the device count and the worker's input from xdist.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence

WORKER_GPU_KEY = "perfsuite_gpu"  # in xdist's workerinput: what the worker's CUDA_VISIBLE_DEVICES becomes
PINNED_DEVICES = ("auto", "cuda")  # --perf-device values under which workers are pinned


class GpuAssignmentError(ValueError):
    """More workers than GPUs, or a worker that can no longer be pinned; the hooks make it a usage error."""


def visible_gpus(environ: Mapping[str, str], count_devices: Callable[[], int]) -> tuple[str, ...]:
    """The GPUs this process may use, named as ``CUDA_VISIBLE_DEVICES`` names them (indices or UUIDs).

    As CUDA reads the variable, the list ends at the first entry that names
    no device (``-1``); without the variable, every device is visible.
    """
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return tuple(str(index) for index in range(count_devices()))
    gpus = []
    for entry in (part.strip() for part in listed.split(",")):
        if not entry or entry.startswith("-"):
            break
        gpus.append(entry)
    return tuple(gpus)


def gpus_for_workers(
    enabled: bool, device: str, num_workers: int, environ: Mapping[str, str], count_devices: Callable[[], int]
) -> tuple[str, ...]:
    """The GPUs to hand xdist's ``num_workers`` workers one each; empty where workers are not pinned.

    Workers are pinned in a ``--perf`` session on ``--perf-device`` auto or
    cuda when GPUs are visible. Asking for more workers than GPUs is an
    error: two workers on one GPU would each measure the other's load.
    """
    if not enabled or num_workers < 1:
        return ()
    if device.startswith("cuda:"):
        if num_workers > 1:
            raise GpuAssignmentError(
                f"--perf-device {device} puts all {num_workers} workers on one GPU; use --perf-device cuda "
                "(or auto) to give each worker a GPU of its own"
            )
        return ()
    if device not in PINNED_DEVICES:
        return ()
    gpus = visible_gpus(environ, count_devices)
    if gpus and num_workers > len(gpus):
        raise GpuAssignmentError(
            f"-n {num_workers} asks for {num_workers} workers but {len(gpus)} GPUs are visible "
            f"(CUDA_VISIBLE_DEVICES {','.join(gpus)}): perfsuite runs one worker per GPU; "
            f"use -n {len(gpus)} or -n auto"
        )
    return gpus


class GpuAssignment:
    """Which worker holds which GPU. A worker started again after a crash takes the GPU its predecessor left."""

    def __init__(self, gpus: Sequence[str]) -> None:
        self.gpus = tuple(gpus)
        self._holders: dict[str, str] = {}  # GPU -> worker id

    def assign(self, worker_id: str) -> str:
        """The free GPU listed first, now held by ``worker_id``."""
        for gpu, holder in self._holders.items():
            if holder == worker_id:
                return gpu
        free = [gpu for gpu in self.gpus if gpu not in self._holders]
        if not free:
            held = ", ".join(f"{gpu} by {holder}" for gpu, holder in self._holders.items())
            raise GpuAssignmentError(f"worker {worker_id}: every GPU is held ({held}); one worker per GPU")
        self._holders[free[0]] = worker_id
        return free[0]

    def release(self, worker_id: str) -> None:
        """``worker_id`` is down: its GPU is free for the worker that replaces it."""
        self._holders = {gpu: holder for gpu, holder in self._holders.items() if holder != worker_id}


def pin_worker(
    workerinput: Mapping[str, object], environ: MutableMapping[str, str], cuda_initialized: Callable[[], bool]
) -> str | None:
    """Point this worker's ``CUDA_VISIBLE_DEVICES`` at the GPU the controller gave it; None when it gave none."""
    gpu = workerinput.get(WORKER_GPU_KEY)
    if gpu is None:
        return None
    if cuda_initialized():
        raise GpuAssignmentError(
            f"worker {workerinput.get('workerid')}: CUDA was initialised before perfsuite could pin the worker "
            f"to GPU {gpu} (a conftest.py or plugin used CUDA at import); move that use into a fixture"
        )
    environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    return str(gpu)
