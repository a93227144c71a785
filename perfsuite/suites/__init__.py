"""The shipped perf suite: throughput, latency, capacity and sweep tests over the registered engines.

Run it from any project with perfsuite installed::

    pytest --pyargs perfsuite.suites --perf --perf-engines my-engine

Its ``conftest.py`` parametrizes the tests from ``--perf-profile``, ``--perf-engines`` and
``--perf-config``. Their results and baselines are stored under package-relative ids
(``perfsuite/suites/test_throughput.py::test_throughput[...]``, ``perfsuite.plugin.ids``),
in the running project's ``reports/`` and ``baselines/``, wherever perfsuite is installed.
"""
