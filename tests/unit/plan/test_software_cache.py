"""`autotune validate` reads optimizer and compile backend names from a per-user cache, probed
again when the installed packages change. The probe is a stand-in: no process starts."""

import json

import pytest

from autotune.plan import software_cache

GIB = 1024**3


def test_a_second_validate_reuses_the_first_probe(probes, tmp_path):
    first = software_cache.software_facts()
    second = software_cache.software_facts()
    assert len(probes) == 1
    assert second == first
    assert first.optimizer_names == ("adamw_torch", "optim_1")
    assert first.compile_backends == ("inductor",)
    cached = json.loads((tmp_path / software_cache.file_name()).read_text())
    assert cached["key"] == software_cache.installed_key()
    # Device state is never cached: search must see the memory free now.
    assert not {"free_memory_bytes", "cuda_available", "name"} & cached.keys()


def test_new_package_versions_probe_again(probes, monkeypatch):
    software_cache.software_facts()
    upgraded = {**software_cache.installed_key(), "transformers": "99.0.0"}
    monkeypatch.setattr(software_cache, "installed_key", lambda: upgraded)
    assert software_cache.software_facts().optimizer_names == ("adamw_torch", "optim_2")
    assert software_cache.software_facts().optimizer_names == ("adamw_torch", "optim_2")
    assert len(probes) == 2


@pytest.mark.parametrize("content", ["not json {", "[1, 2]", '{"schema_version": 0}'])
def test_a_damaged_or_older_cache_file_is_probed_again_and_replaced(probes, tmp_path, content):
    (tmp_path / software_cache.file_name()).write_text(content)
    assert software_cache.software_facts().optimizer_names == ("adamw_torch", "optim_1")
    assert software_cache.software_facts().optimizer_names == ("adamw_torch", "optim_1")
    assert len(probes) == 1


def test_a_cache_that_cannot_be_written_still_answers(probes, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(software_cache.CACHE_DIR_ENV, str(blocker / "cache"))
    assert software_cache.software_facts().compile_backends == ("inductor",)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"AUTOTUNE_CACHE_DIR": "/tmp/mine"}, "/tmp/mine"),
        ({"XDG_CACHE_HOME": "/xdg"}, "/xdg/autotune"),
        ({"XDG_CACHE_HOME": "relative"}, "HOME/.cache/autotune"),  # the XDG spec ignores it
        ({}, "HOME/.cache/autotune"),
    ],
)
def test_the_cache_folder_follows_the_xdg_spec(monkeypatch, tmp_path, env, expected):
    for name in ("AUTOTUNE_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert str(software_cache.cache_dir()) == expected.replace("HOME", str(tmp_path))


def test_a_search_probes_the_device_each_time_and_the_packages_once(probes):
    """Memory is probed afresh every search; what the installed packages accept (seconds of
    imports to find out) is known from the first probe for their versions."""
    first = software_cache.probe_device()
    second = software_cache.probe_device()
    assert probes[0] is None and len(probes) == 2, "both probe the device"
    assert probes[1]["bitsandbytes_error"] == "no GPU library", "the second is told the rest"
    assert second.optimizer_names == first.optimizer_names == ("adamw_torch", "optim_1")


def test_each_python_environment_keeps_its_own_cache_file(monkeypatch):
    """Two virtual environments with other packages each probed again (~30 s) when they
    shared one file, every time the other had run."""
    import sys

    mine = software_cache.file_name()
    monkeypatch.setattr(sys, "prefix", "/opt/other-venv")
    assert software_cache.file_name() != mine
    assert software_cache.file_name().startswith("software-facts-")
