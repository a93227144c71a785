"""What perfsuite keeps in its cache is written whole, and the CPU it was built for is read from the machine.

Mutants it kills: a write straight into the file (a reader, or a crash,
finds half of it); a failed write that leaves its temporary file behind or
passes silently; an instruction-set reading that returns the model name.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from perfsuite import cache_dir
from perfsuite.cache_dir import write_whole
from perfsuite.host import cpu_features, cpu_model


def test_a_file_is_written_whole_and_readable_by_others(tmp_path):
    path = tmp_path / "deeper" / "kept.bin"
    write_whole(path, b"first")
    write_whole(path, b"second")
    assert path.read_bytes() == b"second"
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    assert [p.name for p in path.parent.iterdir()] == ["kept.bin"], "no temporary file left"


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    path = tmp_path / "kept.bin"
    write_whole(path, b"old")

    def no_space(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache_dir.os, "replace", no_space)
    with pytest.raises(OSError, match="No space left"):
        write_whole(path, b"new")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["kept.bin"]


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="Linux lists the CPU in /proc/cpuinfo")
def test_the_cpu_features_are_its_instruction_set_not_its_name():
    features = cpu_features()
    assert features != cpu_model()
    listed = Path("/proc/cpuinfo").read_text()
    if "\nflags" in listed or listed.startswith("flags"):
        assert len(features.split()) > 5 and all(flag in listed for flag in features.split()[:5]), features
