"""The study folder's layout: every file and folder name in it, in one place.

OUT/STUDY/
  study.db            the Optuna storage (SQLite; another via storage=)
  search.lock         held by the search that runs the study
  search.log          what the terminal showed
  trials.csv  pareto.csv  recommended.json  recommended.py  report.html
  trials/NNNN/        one trial: spec.json, result.json, progress.json, worker.log
                      (copied from worker.pipe), result.interrupted.json (set aside),
                      tmp-*/ (its temporary files while it runs)
  confirm/            the confirmation's runs, one trial folder each
  data/FINGERPRINT/   the user's data, tokenized once
  workers/HOST-PID/   a search's worker processes: their logs and stop reasons
  inductor-cache/     torch.compile's cache, shared by the study's trials
"""

from __future__ import annotations

from pathlib import Path

STUDY_DB = "study.db"
LOCK_FILE = "search.lock"
SEARCH_LOG = "search.log"
TRIALS_CSV = "trials.csv"
PARETO_CSV = "pareto.csv"
RECOMMENDED_JSON = "recommended.json"
RECOMMENDED_PY = "recommended.py"
DEEPSPEED_JSON = "deepspeed.json"
"""The recommended trial's DeepSpeed config, where it trained under DeepSpeed."""
ACCELERATE_YAML = "accelerate_config.yaml"
"""`accelerate launch --config_file` for the recommended trial, where it trained on ranks."""
REPORT_HTML = "report.html"
OUTPUTS = (TRIALS_CSV, PARETO_CSV, RECOMMENDED_JSON, RECOMMENDED_PY, DEEPSPEED_JSON,
           ACCELERATE_YAML, REPORT_HTML)  # fmt: skip
"""What a search writes into the study folder when it ends."""

TRIALS = "trials"
SPEC_FILE = "spec.json"
RESULT_FILE = "result.json"
PROGRESS_FILE = "progress.json"
WORKER_LOG = "worker.log"
LOG_PIPE = "worker.pipe"
INTERRUPTED_RESULT = "result.interrupted.json"
"""What a worker wrote for a trial whose search died before recording it: set aside, not used."""

CONFIRM = "confirm"
"""The confirmation's runs: `confirm/rR-tNNNN/`, one folder per round and trial."""
VERIFY = "verify"
"""`autotune verify`'s runs: `verify/tNNNN/`, one folder per trial verified."""
DATA_CACHE = "data"
"""One prepared entry per fingerprint of the user's data."""
WORKERS = "workers"
COMPILE_CACHE = "inductor-cache"
TRIAL_TEMP_PREFIX = "tmp-"
"""A trial's temporary files: `trials/NNNN/tmp-*/`, removed when it ends (by the worker, or
after a kill by the search)."""


SOCKET_FOLDER_PREFIX = "autotune-mp-"


def socket_folder_prefix(pid: int) -> str:
    """The folder of a process's multiprocessing sockets under the system's temp folder,
    named by its pid: a worker's whose trial folder is too deep for an AF_UNIX path (the
    search removes it after a kill), the search's own (`socket_folders.claim`)."""
    return f"{SOCKET_FOLDER_PREFIX}{pid}-"


def trial_dir(study_dir: Path, number: int) -> Path:
    return study_dir / TRIALS / f"{number:04d}"


def study_db_url(study_dir: Path) -> str:
    """The default storage: the study folder's SQLite file."""
    return f"sqlite:///{study_dir / STUDY_DB}"


def set_aside_result(trial_dir: Path) -> None:
    """A result the search never recorded (it was interrupted) must not pass for a measurement:
    the study, not this file, says what a trial measured."""
    result = trial_dir / RESULT_FILE
    if result.exists():
        result.replace(trial_dir / INTERRUPTED_RESULT)
