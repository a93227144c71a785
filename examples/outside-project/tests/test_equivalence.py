"""Our engine computes what unbatched greedy decoding computes, token for token (tiny-random, float64)."""

from perfsuite.testing import equivalence_test

test_outside_engine_equals_unbatched_greedy_decoding = equivalence_test("outside")
