"""The planner: the budget frontier, plans against the exact optimum, plan stability, cost estimates, the recompute
floor, the whole-step memory target and plans made on the meta device."""
