"""A full disk, for real: a study folder on a small tmpfs, filled up, then `autotune report`.

Mounting a tmpfs needs root (CI runs as root); elsewhere the test is skipped, and in CI that
skip is a failure, as it would hide one."""

import contextlib
import errno
import os
import subprocess
import sys

import optuna
import pytest

from tests.unit.outputs.test_study_folder import OUTPUTS, add_trials

TMPFS_BYTES = 16 * 1024**2  # the study's outputs take ~5 MiB (report.html embeds plotly.js)


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs, unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mount)]
    made = subprocess.run(command, capture_output=True, text=True) if os.geteuid() == 0 else None
    if made is None or made.returncode != 0:
        why = "not root" if made is None else made.stderr.strip()
        reason = f"a full disk needs a tmpfs of its own, and mounting one failed: {why}"
        if os.environ.get("CI"):
            pytest.fail(reason)  # CI runs as root: a skip there would hide a failure
        pytest.skip(reason)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(folder):
    """Write a file into `folder` until its file system has no byte left."""
    with open(folder / "filler", "wb", buffering=0) as f:
        for chunk in (1024**2, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * chunk)
    with pytest.raises(OSError) as full:
        (folder / "probe").write_bytes(b"\0" * 4096)
    assert full.value.errno == errno.ENOSPC


def report(study_dir):
    return subprocess.run(
        [sys.executable, "-m", "autotune", "report", str(study_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def a_study(study_dir, n_trials):
    study_dir.mkdir(exist_ok=True)
    storage = f"sqlite:///{study_dir / 'study.db'}"
    study = optuna.create_study(
        study_name="s", storage=storage, load_if_exists=True, directions=["maximize", "minimize"]
    )
    add_trials(study, n_trials)


def says_no_space_for(result, path):
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    message = result.stderr.strip()
    assert f"cannot write {path}: No space left on device (it needs " in message
    assert " bytes free" in message


def test_a_full_disk_keeps_every_good_output_and_says_the_path_and_the_space(small_disk):
    study_dir = small_disk / "s"
    a_study(study_dir, 2)
    first = report(study_dir)
    assert first.returncode == 0, first.stderr
    good = {name: (study_dir / name).read_bytes() for name in OUTPUTS}
    a_study(study_dir, 30)  # every output grows: an output rewritten in place needs more room

    fill(small_disk)
    says_no_space_for(report(study_dir), study_dir / "trials.csv")
    assert {name: (study_dir / name).read_bytes() for name in OUTPUTS} == good
    assert not [p.name for p in study_dir.iterdir() if p.name.endswith(".tmp")]


def test_a_first_report_on_a_full_disk_leaves_no_empty_output(small_disk):
    study_dir = small_disk / "s"
    a_study(study_dir, 2)

    fill(small_disk)
    says_no_space_for(report(study_dir), study_dir / "trials.csv")
    assert sorted(p.name for p in study_dir.iterdir()) == ["study.db"]


def test_a_search_whose_outputs_meet_a_full_disk_says_its_trials_are_kept(small_disk, capsys):
    """Room for the trials and the study, not for the report (~5 MiB): the trials ran, so not
    exit 2 ("a mistake, nothing run") but 73, and how to write the outputs later."""
    from autotune import cli
    from tests.conftest import TINY_MODEL, fake_executor

    with open(small_disk / "filler", "wb") as f:
        f.write(b"\0" * (TMPFS_BYTES - 2 * 1024**2))
    out = small_disk / "out"
    argv = [
        "search",
        f"model={TINY_MODEL}",
        "seq_len=32",
        "n_trials=2",
        "confirm_rounds=0",
        f"out={out}",
        "study=s",
    ]
    assert cli.main(argv, executor=fake_executor("ok")) == 73
    err = " ".join(capsys.readouterr().err.split())
    assert "No space left on device" in err and "Traceback" not in err
    assert (
        f"The study's 2 trials are kept in its storage: `autotune report {out / 's'}` "
        "writes its outputs once it can" in err
    )
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{out / 's' / 'study.db'}")
    assert len(study.trials) == 2
