"""Policy training in the twin (SB3), rewards, the safety shield, heuristics, evaluation, export."""
