"""Settings -> a finished `SearchPlan`: the config, device facts (from the probe subprocess), the
space fitted to them, the estimate, the workers' slots and the memory budget. The first stage of
the search process; it imports no torch."""
