"""The shipped perf suite: throughput, latency, capacity and sweep tests over the registered engines.

Its ``conftest.py`` parametrizes the tests from ``--perf-profile``, ``--perf-engines`` and
``--perf-config``. ``make perf`` runs it as ``pytest --pyargs perfsuite.suites --perf``.
"""
