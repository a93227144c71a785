"""Perf measurements on a Ray cluster (``--perf-ray``): the typed messages, the actor, and the controller's pool.

``wire`` is pure (the standard library, ``perfsuite.codec`` and the typed
records it carries); ``actor`` runs on a node and imports torch lazily;
``pool`` is the controller's end and imports Ray lazily, so nothing here
needs Ray until a session asks for it.
"""
