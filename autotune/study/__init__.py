"""The search: open a study for a finished plan, then the loop in named phases (propose, check,
run, tell) with its sampler and observer, and the runner that launches and supervises each trial
in a child process."""
