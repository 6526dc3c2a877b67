import os
import time

from autotune.execute import build_locks


def test_torchs_build_folder_is_found_without_importing_torch(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert build_locks.extensions_root() == tmp_path / "cache" / "torch_extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "mine"))
    assert build_locks.extensions_root() == tmp_path / "mine"


def test_locks_in_both_of_torchs_layouts_made_before_the_trial(tmp_path):
    """Under the default root torch adds a `py311_cu128`-like folder; under
    TORCH_EXTENSIONS_DIR it does not."""
    started = time.time()
    nested = tmp_path / "py311_cu128" / "cpu_adam" / "lock"
    flat = tmp_path / "shm_comm" / "lock"
    later = tmp_path / "py311_cu128" / "fused_adam" / "lock"
    for lock, age_s in ((nested, 60), (flat, 60), (later, -60)):
        lock.parent.mkdir(parents=True)
        lock.touch()
        os.utime(lock, (started - age_s, started - age_s))
    (tmp_path / "py311_cu128" / "cpu_adam" / "cpu_adam.so").touch()
    assert build_locks.locks_older_than(started, tmp_path) == sorted([nested, flat])
    assert build_locks.locks_older_than(started, tmp_path / "missing") == []
    assert build_locks.describe([]) == ""
    assert str(flat) in build_locks.describe([flat])


def test_a_lock_is_named_only_for_a_trial_that_builds_and_its_path_as_text(tmp_path):
    import dataclasses

    from tests.unit.plan.test_data_parallel import spec

    assert build_locks.builds_extensions(spec("zero2_offload"))
    assert build_locks.builds_extensions(spec("zero3"))
    assert not build_locks.builds_extensions(spec("ddp"))
    assert not build_locks.builds_extensions(dataclasses.replace(spec("single"), devices=1))
    planted = tmp_path / "\x1b[2Jcleared" / "lock"
    said = build_locks.describe([planted])
    assert "\x1b" not in said and "\\x1b[2Jcleared" in said
