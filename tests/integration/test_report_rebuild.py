"""A report rebuilt in another process is the same, byte for byte."""

import json
import os
import subprocess
import sys

IMPORTANCES_IN_A_FRESH_PROCESS = """
import json
from autotune.records import TrialRecord
from autotune.report.data import _importances
from autotune.trial import Status, TrialResult
# 'zeta' and 'alpha' always move together: their importances tie (but for the last bits).
outcomes = [(8, 100.0, 4.0), (16, 180.0, 3.0), (32, 250.0, 5.0), (16, 150.0, 8.0),
            (8, 120.0, 2.0), (32, 260.0, 6.0)]
records = [
    TrialRecord(number=i, params={"zeta": b, "alpha": b * 2, "precision": ("fp32", "bf16")[i % 2]},
                result=TrialResult(status=Status.OK, samples_per_s=s, peak_memory_gib=m))
    for i, (b, s, m) in enumerate(outcomes)
]
print(json.dumps({k: list(v) for k, v in _importances(records, 10.0).items()}))
"""


def test_importance_order_is_the_same_in_every_process():
    """A report rebuilt from storage must be byte-identical, whatever the hash seed."""
    orders = set()
    for seed in range(4):
        out = subprocess.run(
            [sys.executable, "-c", IMPORTANCES_IN_A_FRESH_PROCESS], capture_output=True,
            text=True, check=True, env={**os.environ, "PYTHONHASHSEED": str(seed)},
        )  # fmt: skip
        orders.add(out.stdout.strip().splitlines()[-1])
    assert len(orders) == 1, orders
    ranked = json.loads(orders.pop())["samples_per_s"]
    assert ranked.index("alpha") == ranked.index("zeta") - 1  # a tie, broken by name
