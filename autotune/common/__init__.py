"""What both sides import: the search process and every child process (a trial, the device
probe, data preparation, the factory check). The trial contract, the knob catalogue, units,
errors, device facts, the model catalogue. Nothing here imports torch, transformers or optuna."""
