"""Each command's settings: closed, frozen, and text where text is expected."""

from __future__ import annotations

from autotune.plan.overrides import load_config


def test_numbers_given_for_string_keys_stay_strings():
    assert load_config(["model=gpt2", "study=2024"]).study == "2024"


def test_cluster_settings_are_for_executor_ray_and_a_factory_is_not_for_a_cluster():
    import pytest

    from autotune.common.errors import ConfigError

    config = load_config(["model=gpt2", "executor=ray", "nodes_per_trial=2", "cpus_per_trial=4"])
    assert (config.executor, config.ray_address, config.nodes_per_trial) == ("ray", "auto", 2)
    with pytest.raises(ConfigError) as refused:
        load_config(["model=gpt2", "nodes_per_trial=2", "cpus_per_trial=4"])
    assert "nodes_per_trial=2 and cpus_per_trial=4: for executor=ray" in str(refused.value)
    with pytest.raises(ConfigError) as refused:
        load_config(["model=gpt2", "executor=ray", "trainer=train.py:make"])
    assert "trainer= with executor=ray: a factory's file lies on this host" in str(refused.value)
    with pytest.raises(ConfigError) as refused:
        load_config(["model=gpt2", "executor=slurm", "cpus_per_trial=0"])
    assert "executor" in str(refused.value) and "cpus_per_trial" in str(refused.value)


def test_twin_settings_are_for_executor_twin_and_name_a_gpu():
    import pytest

    from autotune.common.errors import ConfigError

    config = load_config(["model=gpt2", "executor=twin", "gpu=H100", "gpu_count=8"])
    assert (config.executor, config.gpu, config.gpu_count) == ("twin", "H100", 8)
    for settings, problem in (
        (["gpu=H100", "gpu_count=2"], "gpu=H100 and gpu_count=2: for executor=twin"),
        (["executor=twin"], "executor=twin needs gpu=NAME"),
        (["executor=twin", "gpu=H100", "device=cpu"], "executor=twin with device=cpu"),
        (["executor=twin", "gpu=H100", "trainer=t.py:make"], "trainer= with executor=twin"),
    ):
        with pytest.raises(ConfigError) as refused:
            load_config(["model=gpt2", *settings])
        assert problem in str(refused.value)


def test_a_seed_numpy_cannot_take_and_an_infinite_gain_are_refused_at_the_start():
    import pytest

    from autotune.common.errors import ConfigError

    assert load_config(["model=gpt2", f"seed={2**31 - 1}"]).seed == 2**31 - 1
    for setting, problem in (
        ("seed=-1", "seed=-1: expected greater than or equal to 0"),
        (f"seed={2**32}", f"seed={2**32}: expected less than {2**31}"),
        ("min_gain_per_minute=.inf", "min_gain_per_minute=inf: expected a finite number"),
        ("min_gain_per_minute=nan", "min_gain_per_minute=nan: expected a finite number"),
    ):
        with pytest.raises(ConfigError) as refused:
            load_config(["model=gpt2", setting])
        assert problem in str(refused.value), setting
