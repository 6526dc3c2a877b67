"""Everything that runs in a child process of the search, and the `python -m` entry point of
each: a trial's worker in stages, its measurement and data, building a model, the device probe,
data preparation and the factory check. torch and transformers yes; optuna never. (A search's
worker processes, `python -m autotune.workers`, are search processes: they live on top.)"""
