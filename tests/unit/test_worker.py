import math

from autotune.trial import Status
from autotune.worker import verdict


def test_a_full_run_with_a_finite_loss_is_ok():
    assert verdict(10, 10, 0.69) == (Status.OK, "")


def test_fewer_measured_steps_than_planned_is_never_ok():
    assert verdict(0, 10, 0.69) == (Status.ERROR, "only 0 of 10 measured steps ran")
    assert verdict(9, 10, 0.69)[0] is Status.ERROR


def test_a_nan_or_infinite_loss_is_nan_loss():
    assert verdict(10, 10, math.nan) == (Status.NAN_LOSS, "training loss is nan")
    assert verdict(10, 10, math.inf)[0] is Status.NAN_LOSS
