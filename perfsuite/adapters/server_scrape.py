"""The server's ``/metrics`` read around one run: once before it, during it in a thread of its own (never in the
client's event loop, so the client's timestamps do not wait on it) as the first output arrives and every
``interval_s``, and once after it.

While the run is in flight a scrape only keeps the load gauges' lines of the page (a string filter); they are
parsed after the run, outside its timed region: ``prometheus_client``'s parser takes tens of milliseconds for a
vLLM server's page (bench/server_scrape_overhead.py), time the client's event loop would wait for the GIL.

A server whose ``/metrics`` does not answer 200 with Prometheus text, or whose page has none of vLLM's metric
names (``perfsuite.adapters.prometheus_text``), is *not exposed*: the run goes on, its ``server_metrics`` is
None, and the next runs do not ask again. A scrape that fails mid-run is skipped. Only the given endpoint is
contacted (no proxies from the environment), each read bounded by ``timeout_s``.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping

from perfsuite.adapters.prometheus_text import (
    GAUGE_NAMES,
    REQUEST_SUCCESS,
    MetricsTextError,
    Scrape,
    read_lines,
    run_server_metrics,
)
from perfsuite.engine.server_metrics import ServerMetrics

DEFAULT_INTERVAL_S = 0.5
DEFAULT_TIMEOUT_S = 2.0
# A server records a request's histograms as it finishes it, which may be just after the client read [DONE]:
# the last read waits this long at most for the run's requests to be counted.
SETTLE_S = 1.0
# Where a server counts the requests it finished: the histograms vLLM observes last, then its success counter.
FINISHED_COUNTS = (
    "vllm:e2e_request_latency_seconds_count",
    "vllm:time_to_first_token_seconds_count",
    REQUEST_SUCCESS,
)


class MetricsPage:
    """``GET {base_url}/metrics``; ``read`` is None where the page is not there or not Prometheus text."""

    def __init__(self, base_url: str, headers: Mapping[str, str], timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.url = base_url + "/metrics"
        self._headers = dict(headers)
        self._timeout_s = timeout_s
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def read(self) -> Scrape | None:
        text = self.read_text()
        try:
            return None if text is None else Scrape.parse(text)
        except MetricsTextError:
            return None

    def read_text(self) -> str | None:
        """The page as it is, None where it does not answer 200."""
        request = urllib.request.Request(self.url, headers=self._headers)
        try:
            with self._opener.open(request, timeout=self._timeout_s) as response:
                return response.read().decode("utf-8", errors="replace")
        except (OSError, urllib.error.URLError, UnicodeError):
            return None


class RunScraper:
    """The scrapes of one run: ``start`` before its timed region, ``finish`` after it."""

    def __init__(self, page: MetricsPage, model: str | None, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self._page = page
        self._model = model
        self._interval_s = interval_s
        self._first: Scrape | None = None
        self._during: list[str] = []  # the gauges' lines of each page read while in flight, parsed after the run
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by nudge and stop: the thread reads now, or ends
        self._nudged = False
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Read the page; False (nothing started) where it is not exposed."""
        first = self._page.read()
        if first is None or not first.knows_vllm():
            return False
        self._first = first
        self._thread = threading.Thread(target=self._scrape_until_stopped, name="perfsuite-metrics", daemon=True)
        self._thread.start()
        return True

    def _scrape_until_stopped(self) -> None:
        while True:
            self._wake.wait(self._interval_s)
            self._wake.clear()
            nudged, self._nudged = self._nudged, False
            if self._stop.is_set() and not nudged:
                return
            text = self._page.read_text()
            if text is not None:
                self._during.append(read_lines(text, GAUGE_NAMES))
            if self._stop.is_set():
                return

    def nudge(self) -> None:
        """Read the page now (the thread does; this returns at once): the run's first output came, so the server
        holds its requests. A run shorter than the interval still gets its reading, even where the run ends first."""
        self._nudged = True
        self._wake.set()

    @property
    def is_reading(self) -> bool:
        """Whether the thread still runs."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """End the thread's readings (a run that failed: nothing is computed)."""
        self._stop.set()
        self._wake.set()

    def finish(self, num_requests: int) -> ServerMetrics | None:
        """Stop the thread, read the page once more (until the run's requests are counted, at most ``SETTLE_S``)
        and compute the run's figures."""
        self.stop()
        if self._thread is not None:
            self._thread.join()
        deadline = time.monotonic() + SETTLE_S
        last = self._page.read()
        while last is not None and self._counted(last) < num_requests and time.monotonic() < deadline:
            time.sleep(0.05)
            last = self._page.read() or last
        assert self._first is not None, "finish follows a start that read the page"
        if last is None:  # the server stopped answering /metrics: the counters cannot be told apart from the run's
            return None
        return run_server_metrics(self._first, self._parsed_during(), last, self._model)

    def _parsed_during(self) -> list[Scrape]:
        scrapes = []
        for text in self._during:
            try:
                scrapes.append(Scrape.parse(text))
            except MetricsTextError:  # a page cut short: that reading is skipped, as one that failed
                continue
        return scrapes

    def _counted(self, last: Scrape) -> float:
        """Requests the server finished since the first read (``FINISHED_COUNTS``); all of them (infinite) where it
        counts none, so nothing waits for a count that never comes."""
        assert self._first is not None
        for name in FINISHED_COUNTS:
            first, now = self._first.total(name, self._model), last.total(name, self._model)
            if first is not None and now is not None:
                return now - first
        return float("inf")
