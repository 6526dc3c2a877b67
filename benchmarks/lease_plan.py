"""The plan a search would make on a device, from that device's probe facts, without it.

    python benchmarks/lease_plan.py PROBE.json key=value ...

Reads the facts `python -m autotune.child.probe` wrote on a device (`benchmarks/results/*/` and
`tests/fixtures/` keep real ones) and makes the search's plan of `key=value ...` for them, as
`autotune search` would there: the space fitted to the device (and what it left out, and
why), the batch sizes each precision may take, the baseline and the memory limits. Nothing is
trained and the device is not needed, so a GPU check can be tried on a CPU before a GPU is
lent: the first H100 lease ended at its first command on a refusal this prints in a second.
Exits 2 with the refusal's message, as the search would.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from autotune.common.device import DeviceInfo
from autotune.common.errors import AutotuneError
from autotune.common.trial_settings import describe_params
from autotune.plan.overrides import load_config
from autotune.plan.plan import make_plan


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    probe, *overrides = argv
    info = DeviceInfo.from_facts(json.loads(Path(probe).read_text()))
    try:
        plan = make_plan(load_config(overrides), info)
    except AutotuneError as exc:
        print(f"refused on {info.name}: {exc}", file=sys.stderr)
        return 2
    print(f"plan on {info.name} ({probe}): {' '.join(overrides)}")
    print(
        f"  device {plan.device}, memory budget {plan.info.memory_budget_gib:.2f} GiB, "
        f"skip by estimate past {plan.estimate_limit_gib or float('inf'):.2f} GiB"
    )
    precisions = plan.space.knobs["precision"].choices if "precision" in plan.space.knobs else ()
    for precision in precisions or (None,):
        batches = plan.space.batch_candidates(precision, plan.rules)
        print(f"  batch sizes of precision={precision}: {', '.join(map(str, batches))}")
    searched = [k for k, knob in plan.space.knobs.items() if len(knob.choices) > 1]
    print(f"  knobs searched: {', '.join(searched)}")
    for note in plan.space.notes:
        print(f"  note: {note}")
    estimate = plan.estimate_gib(plan.baseline)
    shown = "n/a" if estimate is None else f"{estimate:.2f} GiB"
    print(f"  baseline: {describe_params(plan.baseline)} (estimate {shown})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
