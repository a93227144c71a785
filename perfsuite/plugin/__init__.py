"""perfsuite's pytest plugin.

``hooks`` (the ``pytest11`` entry point) holds the hooks and the ``perf``/``perf_*``
fixtures; ``options`` the ``--perf-*`` options; ``stash`` the one session object
``pytest_configure`` keeps in ``config.stash``; ``session`` its state;
``recorder`` the ``perf`` fixture's measurements; ``ids`` the id each test is stored under;
``terminal`` the summary table.
"""
