"""perfsuite's pytest plugin: the hooks and fixtures (``hooks``, the pytest11 entry point), the ``--perf-*`` options, the session's state and the ``perf`` fixture's recorder."""
