"""`perfsuite run`'s workload flags: prompt lengths, arrivals (a rate, a closed loop), each a clear error when bad."""

from __future__ import annotations

import pytest

import perfsuite.models
from perfsuite.cli import _workload, build_parser, main
from perfsuite.workload import Arrivals, PromptLengths, SyntheticPrompts


def workload_of(*argv: str):
    return _workload(build_parser().parse_args(["run", *argv]))


def test_the_flags_build_the_workload_the_fixtures_build():
    workload = workload_of("--num-requests", "5", "--prompt-len", "16:48", "--request-rate", "4", "--seed", "3")
    assert workload.prompts == SyntheticPrompts(PromptLengths("uniform", 16, 48))
    assert workload.arrivals == Arrivals(rate=4.0) and workload.seed == 3 and workload.num_requests == 5
    assert workload.arrival_times()[1] > 0, "Poisson arrivals, not all at t0"
    assert workload_of("--concurrency", "3").arrivals == Arrivals(concurrency=3)
    assert workload_of("--request-rate", "2", "--burstiness", "0.5").arrivals == Arrivals(rate=2.0, burstiness=0.5)
    assert workload_of("--prompt-len", "24").prompts == SyntheticPrompts(PromptLengths("fixed", 24, 24))
    assert workload_of().arrivals.is_offline, "unchanged by default: every request at t0"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--request-rate", "0"], "argument --request-rate: expected a number > 0"),
        (["--request-rate", "nan"], "argument --request-rate: expected a finite number"),
        (["--concurrency", "0"], "argument --concurrency"),
        (["--prompt-len", "abc"], "argument --prompt-len: expected N or LOW:HIGH"),
        (["--prompt-len", "9:3"], "argument --prompt-len: prompts needs low <= high"),
        (["--request-rate", "2", "--concurrency", "2"], "--request-rate and --concurrency are two ways to send"),
        (["--burstiness", "2"], "add --request-rate, or drop --burstiness"),
        (["--workload", "shared_prefix:groups=2,prompts=2,prefix=8", "--prompt-len", "8"],
         "--prompt-len size the default workload, which --workload replaces"),
        (["--engines", "openai-http", "--endpoint", "http://127.0.0.1:9", "--concurrency", "9"],
         "raise --batch-size to 9 or lower --concurrency"),
    ],
)  # fmt: skip
def test_bad_workload_flags_fail_while_parsing_naming_the_flag_and_the_fix(argv, named, capsys, monkeypatch):
    monkeypatch.setattr(perfsuite.models, "load_model", lambda *a, **k: pytest.fail("loaded before the check"))
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--model", "tiny-random", *argv])
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err


def test_a_workload_too_large_is_said_in_the_flags_that_size_it(capsys, monkeypatch):
    monkeypatch.setattr(perfsuite.models, "load_model", lambda *a, **k: pytest.fail("loaded before the check"))
    assert main(["run", "--model", "tiny-random", "--prompt-len", "5000", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "lower --prompt-len or --max-new-tokens" in err, err
    assert main(["run", "--model", "tiny-random", "--request-rate", "1e-9", "--num-requests", "100"]) == 2
    assert "raise --request-rate above 1e-09 req/s or lower --num-requests" in capsys.readouterr().err
