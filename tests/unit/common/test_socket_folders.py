"""The socket folders of processes that died are removed, those of live ones kept
(autotune.common.socket_folders): a lock that the kernel drops when its process ends."""

import fcntl
import os

from autotune.common.socket_folders import OWNER_FILE, remove_abandoned


def folder(base, name, *, lock_file=True):
    path = base / name
    path.mkdir()
    (path / "listener-1").write_text("")
    if lock_file:
        (path / OWNER_FILE).write_text("")
    return path


def test_only_folders_whose_lock_is_free_are_removed(tmp_path):
    alive = folder(tmp_path, "autotune-mp-101-a")
    dead = folder(tmp_path, "autotune-mp-102-b")
    trials = folder(tmp_path, "autotune-mp-103-c", lock_file=False)  # a trial's: its search's
    other = folder(tmp_path, "pymp-xyz")
    held = os.open(alive / OWNER_FILE, os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)  # as its live process holds it
    try:
        assert remove_abandoned(tmp_path) == [dead]
    finally:
        os.close(held)
    assert alive.exists() and trials.exists() and other.exists() and not dead.exists()


def test_a_link_in_the_temp_folder_is_not_followed(tmp_path):
    target = folder(tmp_path, "someone-elses")
    (tmp_path / "autotune-mp-104-d").symlink_to(target)
    assert remove_abandoned(tmp_path) == []
    assert (target / "listener-1").exists()
