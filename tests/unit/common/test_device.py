from __future__ import annotations

import pytest

from tests.unit.stand_ins import machine

GIB = 2**30


def test_the_default_cpu_budget_keeps_room_for_the_search_and_the_machine():
    # 0.5 GiB for the search, 0.75 GiB per fork server, 10% of the 24 GiB for the machine.
    name, one = machine(22).memory_for("cpu", workers=1)
    assert (name, one / GIB) == ("cpu", pytest.approx(22 - 0.5 - 0.75 - 2.4))
    two = machine(22).memory_for("cpu", workers=2)[1]
    assert two / GIB == pytest.approx((22 - 0.5 - 2 * 0.75 - 2.4) / 2)
    assert machine(22, cuda=True).memory_for("cuda", [0])[1] == 80 * GIB
