"""kvsp benchmarks: each case is measured beside its baseline in the same run; results are JSON."""
