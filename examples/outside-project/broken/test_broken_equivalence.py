"""The same one-line check on the variant with a batching bug: it must fail (run it by hand: `pytest broken`)."""

from perfsuite.testing import equivalence_test

test_broken_engine_equals_unbatched_greedy_decoding = equivalence_test("outside-broken")
