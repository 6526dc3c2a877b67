"""The search: open a study for a finished plan, then the loop in named phases (propose, check,
run, tell) with its sampler and observer; each trial runs through an executor (`execute/`)."""
