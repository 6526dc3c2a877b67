import pytest
import torch

from autotune.child import measure
from autotune.child.data import PaddingCollator
from autotune.common.device import peak_tflops


def test_warmup_steps_are_outside_the_timed_window(monkeypatch):
    clock = iter([1.0, 3.0, 4.0, 4.5, 5.0, 5.5])  # steps 1-2 slow (warm-up), then 0.5 s each
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(clock))
    synced = []
    timer = measure.StepTimer(warmup_steps=2, synchronize=lambda: synced.append(1))
    for _ in range(6):
        timer.on_step_end(None, None, None)
    assert timer.measured_step_times_s() == [1.0, 0.5, 0.5, 0.5]
    assert len(synced) == 6  # the device is synchronised before every clock read


def test_throughput_is_what_the_timed_steps_trained_on():
    counts = measure.Counts(
        samples=128, tokens=128 * 100, padded_tokens=128 * 128, squared_lengths=128 * 100**2
    )
    stats = measure.throughput([0.5, 0.5, 0.5, 0.5], counts)
    assert stats.samples_per_s == pytest.approx(64.0)
    assert stats.tokens_per_s == pytest.approx(64.0 * 100), "real tokens only"
    assert stats.padding_share == pytest.approx(28 / 128)
    assert stats.step_time_median_ms == pytest.approx(500.0)
    assert stats.step_time_cv == 0.0
    assert stats.measured_steps == 4


def test_variation_is_reported_as_a_coefficient_of_variation():
    stats = measure.throughput([0.9, 1.1], measure.Counts(2, 2, 2, 2))
    assert stats.step_time_cv == pytest.approx(0.1414, rel=1e-3)


def test_batches_count_real_tokens_as_a_hand_count_does():
    """Three samples of 5, 2 and 9 tokens, padded to 16: 16 real tokens of 48 positions."""
    collator = PaddingCollator(task="masked-lm", pad_token_id=0, pad_to_multiple_of=8)
    batch = collator([{"input_ids": list(range(1, n + 1))} for n in (5, 2, 9)])
    counter = measure.BatchCounter()
    counter.count(batch)
    counter.count(batch)
    assert batch["input_ids"].shape == (3, 16)
    assert counter.counts == measure.Counts(
        samples=6, tokens=2 * 16, padded_tokens=2 * 48, squared_lengths=2 * (25 + 4 + 81)
    )
    synthetic = {"input_ids": torch.ones(4, 32, dtype=torch.long)}  # no mask: all real
    counter.count(synthetic)
    assert counter.counts.tokens == 32 + 128 and counter.counts.padded_tokens == 96 + 128


def test_the_timed_window_holds_the_counts_of_the_timed_steps_only():
    counter = measure.BatchCounter()
    timer = measure.StepTimer(warmup_steps=2, counter=counter)
    timer.on_train_begin(None, None, None)
    for step in range(5):  # the loop takes a step's batch before the step ends
        counter.count({"input_ids": torch.ones(step + 1, 4, dtype=torch.long)})
        timer.on_step_end(None, None, None)
    assert timer.measured_counts().samples == 3 + 4 + 5, "steps 3-5: after warm-up step 2"


def test_the_counted_loader_is_the_trainers_own_loader_otherwise():
    loader = torch.utils.data.DataLoader(
        [{"input_ids": torch.ones(3, dtype=torch.long)}] * 4, batch_size=2
    )

    class Trainer:
        def get_train_dataloader(self):
            return loader

    trainer = Trainer()
    counter = measure.count_batches(trainer)
    counted = trainer.get_train_dataloader()
    assert len(counted) == 2 and counted.batch_size == 2
    assert [b["input_ids"].shape for b in counted] == [(2, 3), (2, 3)]
    assert counter.counts == measure.Counts(4, 12, 12, 4 * 9)


def test_warmup_must_be_at_least_one_step():
    with pytest.raises(ValueError, match="warmup_steps"):
        measure.StepTimer(warmup_steps=0)


def test_compile_time_is_the_warmup_beyond_ordinary_steps(monkeypatch):
    # train begins at 0; step 1 ends at 40 (compiling), step 2 at 41, then 1 s steps.
    clock = iter([0.0, 40.0, 41.0, 42.0, 43.0, 44.0])
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(clock))
    timer = measure.StepTimer(warmup_steps=2)
    timer.on_train_begin(None, None, None)
    for _ in range(5):
        timer.on_step_end(None, None, None)
    assert timer.warmup_step_times_s() == [40.0, 1.0]
    assert timer.measured_step_times_s() == [1.0, 1.0, 1.0]
    assert measure.compile_s(timer.warmup_step_times_s(), median_step_s=1.0) == 39.0


def test_bert_large_flops_match_a_hand_count():
    import torch

    from autotune.child.models import build_model
    from autotune.common.models import resolve_model

    with torch.device("meta"):
        model = build_model(resolve_model("bert-large-uncased"), "sequence-classification")
    d, ffn, layers, seq = 1024, 4096, 24, 512
    # Per layer: Q, K, V, O (4 d^2) and the two FFN matmuls (2 d ffn); plus pooler and head.
    matmul_weights = layers * (4 * d * d + 2 * d * ffn) + d * d + d * 2
    attention = 12 * layers * d * seq  # per token: scores and weighted sum, x3 for training
    hand_per_token = 6 * matmul_weights + attention
    one_sample = measure.Counts(1, seq, seq, seq**2)
    ours_per_token = measure.training_flops(model, one_sample) / seq
    assert ours_per_token == pytest.approx(hand_per_token, rel=0.02)
    assert ours_per_token == pytest.approx(1.969e9, rel=0.01)


def test_flops_count_both_sides_of_an_encoder_decoder():
    import torch

    from autotune.child.models import build_model
    from autotune.common.models import resolve_model

    with torch.device("meta"):
        model = build_model(resolve_model("t5-small"), "seq2seq")
    blocks, width = measure.attention_layers(model.config)
    assert (blocks, width) == (6 + 2 * 6, 8 * 64)  # encoder self, decoder self + cross


@pytest.mark.parametrize(
    ("name", "precision", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "bf16+tf32", 756.0),
        ("NVIDIA H100 80GB HBM3", "tf32", 494.7),
        ("NVIDIA A100-SXM4-80GB", "fp32", 19.5),
        ("Tesla V100-SXM2-16GB", "fp16", 125.0),
        ("NVIDIA L4", "bf16", 121.0),
        ("NVIDIA L40S", "bf16", 362.0),
        ("cpu", "fp32", None),
    ],
)
def test_peak_table_is_keyed_by_nvml_name_and_precision(name, precision, tflops):
    assert peak_tflops(name, precision) == tflops


def test_eta_waits_for_a_step_after_the_first():
    assert measure.eta_s([], total_steps=10) is None
    assert measure.eta_s([40.0], total_steps=10) is None  # the first step holds the compile


def test_eta_is_steps_left_times_the_mean_step_after_the_first():
    # The first step ends at 40 s (compiling), then 1 s steps and one 5 s stall: the steps left
    # take their sum, stalls included.
    ends = [40.0, 41.0, 42.0, 47.0, 48.0]
    assert measure.eta_s(ends, total_steps=10) == pytest.approx(5 * 2.0)
    assert measure.eta_s([40.0, 42.0], total_steps=4) == pytest.approx(2 * 2.0)


def test_a_long_run_whose_pace_drifts_is_paced_by_its_last_minute():
    """A 2,000-step verify on a machine whose load rose at step 700: 0.1 s steps, then 0.3 s.
    The median of all its steps promised a third of the time left."""
    ends = [10.0]
    for step in range(1, 1000):
        ends.append(ends[-1] + (0.1 if step < 700 else 0.3))
    assert measure.eta_s(ends, total_steps=2000) == pytest.approx(1000 * 0.3)


def test_eta_is_zero_at_the_last_step():
    assert measure.eta_s([3.0, 4.0, 5.0], total_steps=3) == 0.0


def test_the_longest_batch_is_read_from_arrow_lengths_without_building_rows():
    import datasets

    rows = {"input_ids": [[1] * n for n in (3, 9, 1, 7, 9, 2)], "label": [0] * 6}
    data = datasets.Dataset.from_dict(rows)
    assert measure.longest_indices(data, 3) == [1, 4, 3]
    # The prepared data's `length` column, through a shuffle's index mapping.
    shuffled = data.add_column("length", [3, 9, 1, 7, 9, 2]).shuffle(seed=1)
    longest = measure.longest_indices(shuffled, 2)
    assert sorted(shuffled["length"][i] for i in longest) == [9, 9]
    # Lengths a transform would make, or an iterable dataset: not read (no batch replaced).
    transformed = datasets.Dataset.from_dict({"text": ["a", "b"]})
    transformed.set_transform(lambda batch: {"input_ids": [[1]] * len(batch["text"])})
    assert measure.longest_indices(transformed, 1) is None
    assert measure.longest_indices(data.to_iterable_dataset(), 1) is None


def test_the_longest_batch_stands_in_for_one_steps_batches_once_in_the_run():
    import datasets

    data = datasets.Dataset.from_dict({"input_ids": [[1] * n for n in (2, 5, 3, 4)]})
    loader = torch.utils.data.DataLoader(data, batch_size=2, collate_fn=lambda rows: rows)
    # Step 2 of a run at grad_accum 1: its batch is the longest two, in the first pass only.
    replaced = measure._LongestBatches(loader, size=2, start=1, count=1)
    lengths = [[len(row["input_ids"]) for row in batch] for _ in range(2) for batch in replaced]
    assert lengths == [[2, 5], [5, 4], [2, 5], [3, 4]]


class Control:
    should_training_stop = False


@pytest.mark.parametrize(("below", "stops"), [(40.0, True), (30.0, False)])
def test_a_trial_stops_after_its_first_timed_steps_when_even_the_fastest_is_too_slow(
    monkeypatch, below, stops
):
    """8 samples a step; timed steps of 0.5, 0.25 and 0.4 s: at most 32 samples/s."""
    clock = iter([0.0, 1.0, 1.5, 1.75, 2.15, 2.65, 3.15])
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(clock))
    counter = measure.BatchCounter()
    timer = measure.StepTimer(warmup_steps=1, counter=counter, stop_below=below, stop_after=3)
    control = Control()
    timer.on_train_begin(None, None, control)
    for _ in range(4):  # warm-up, then three timed steps
        counter.count({"input_ids": torch.ones(8, 4, dtype=torch.long)})
        timer.on_step_end(None, None, control)
    assert control.should_training_stop is stops
    assert (timer.stopped is not None) is stops
    if stops:
        assert timer.stopped == (
            "stopped after 3 timed steps: at most 32.00 samples/s, under the 40.00 of the "
            "early stop (half the fastest trial's so far)"
        )


def test_steps_slower_than_the_window_are_paced_by_the_last_one():
    # 90 s steps: the last minute holds one step end; the pace is the last step's.
    ends = [100.0, 190.0, 280.0, 400.0]
    assert measure.eta_s(ends, total_steps=6) == pytest.approx(2 * 120.0)
