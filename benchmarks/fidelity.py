"""Does the search's figure hold in a long run? `autotune verify`, written as JSON.

Trains a finished study's recommended settings for `--steps` optimizer steps in a trial
process (the study's warm-up, then the rest timed; the same plain Trainer and data as its
trials), stores the comparison with the study as `autotune verify` does, and writes it with
the search's confirmed figure beside it.

    python benchmarks/fidelity.py reports/<study> [--steps 200] [--out fidelity.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from autotune import api


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study_dir", type=Path)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    verified, result = api.verify_study(args.study_dir, steps=args.steps)
    picks = result.snapshot.picks
    picked = result.snapshot.record(verified.trial)
    confirmed = picked is not None and picks.is_confirmed(picked)
    report = verified.to_json() | {
        "study": result.snapshot.info.study,
        # The figure the search printed: confirmed (median of the rounds) when it was.
        "confirmed": None
        if not confirmed
        else {
            "samples_per_s": picks.samples_per_s(picked),
            "interval": picks.confirmed.interval(picked.number),
            "rounds": picks.confirmed.rounds,
        },
        "confirmed_ratio": (
            verified.samples_per_s / picks.samples_per_s(picked)
            if confirmed and verified.samples_per_s
            else None
        ),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
