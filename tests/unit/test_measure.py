import pytest

from autotune import measure


def test_warmup_steps_are_outside_the_timed_window(monkeypatch):
    clock = iter([1.0, 3.0, 4.0, 4.5, 5.0, 5.5])  # steps 1-2 slow (warm-up), then 0.5 s each
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(clock))
    synced = []
    timer = measure.StepTimer(warmup_steps=2, synchronize=lambda: synced.append(1))
    for _ in range(6):
        timer.on_step_end(None, None, None)
    assert timer.measured_step_times_s() == [1.0, 0.5, 0.5, 0.5]
    assert len(synced) == 6  # the device is synchronised before every clock read


def test_throughput_counts_samples_per_optimizer_step():
    stats = measure.throughput([0.5, 0.5, 0.5, 0.5], samples_per_step=32, seq_len=128)
    assert stats.samples_per_s == pytest.approx(64.0)
    assert stats.tokens_per_s == pytest.approx(64.0 * 128)
    assert stats.step_time_median_ms == pytest.approx(500.0)
    assert stats.step_time_cv == 0.0
    assert stats.measured_steps == 4


def test_variation_is_reported_as_a_coefficient_of_variation():
    stats = measure.throughput([0.9, 1.1], samples_per_step=1, seq_len=1)
    assert stats.step_time_cv == pytest.approx(0.1414, rel=1e-3)


def test_warmup_must_be_at_least_one_step():
    with pytest.raises(ValueError, match="warmup_steps"):
        measure.StepTimer(warmup_steps=0)
