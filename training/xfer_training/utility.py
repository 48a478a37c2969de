"""The utility weights K and B the policies are trained for: the default and the named
presets. Apart from ``train`` so that what reads them (the tests of the shipped models) needs no
PyTorch."""

#: Utility weights for other goals than the default (K=1.02, B=10), by name (``--preset``).
PRESETS: dict[str, dict[str, float]] = {
    # A stream must add 0.5 % throughput to pay, and 1 % loss costs 3 %: for a site that owns
    # the path and wants it full, loss or not.
    "fill-the-pipe": {"k": 1.005, "b": 3.0},
    # A stream must add 5 % throughput to pay, and 1 % loss costs 30 %: the fewest streams that
    # keep most of the rate, backing off at the first sign of a full queue.
    "gentle": {"k": 1.05, "b": 30.0},
}
#: K and B when neither ``--preset`` nor ``--k``/``--b`` say otherwise.
DEFAULT_UTILITY = {"k": 1.02, "b": 10.0}
