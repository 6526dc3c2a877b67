"""Everything that runs in a child process of the search, and every `python -m` entry point that
starts one: a trial's worker in stages, its measurement and data, building a model, the device
probe, data preparation and the factory check. torch and transformers yes; optuna never."""
