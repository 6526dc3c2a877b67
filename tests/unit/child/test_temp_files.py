"""Where a trial's temporary files go."""

from pathlib import Path

import pytest


@pytest.mark.parametrize("depth", [1, 12])
def test_a_trials_temporary_files_and_sockets_live_in_folders_removed_with_it(
    tmp_path, depth, monkeypatch
):
    """Everything temporary goes in a folder of the trial's own; multiprocessing's sockets (a
    DataLoader worker hands tensors over one) too, unless that folder is too deep for an
    AF_UNIX path (107 bytes): then in a short one of the system's. Both go when it ends, and
    the process's settings are as before."""
    import multiprocessing.connection
    import multiprocessing.util
    import os
    import tempfile

    from autotune.child.temp_files import temporary_files_in
    from autotune.common.socket_folders import SOCKET_FOLDER_CHARS

    trial_dir = tmp_path.joinpath(*["deeper-folder"] * depth)
    trial_dir.mkdir(parents=True)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # conftest shares one
    before = tempfile.gettempdir(), os.environ.get("TMPDIR")
    with temporary_files_in(trial_dir):
        # torch.compile's cache where torch keeps it by default: reused by later trials.
        cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        assert cache.parent == Path(before[0]) and cache.name.startswith("torchinductor_")
        made = Path(tempfile.mkdtemp(prefix="autotune-trainer-"))
        assert made.parent.parent == trial_dir
        sockets = Path(multiprocessing.util.get_temp_dir())
        assert len(str(sockets)) <= SOCKET_FOLDER_CHARS
        assert (sockets == made.parent) == (len(str(made.parent)) <= SOCKET_FOLDER_CHARS)
        with multiprocessing.connection.Listener(family="AF_UNIX") as listener:
            assert Path(listener.address).parent == sockets  # bound: the path fits
    assert list(trial_dir.iterdir()) == [] and not sockets.exists()
    assert (tempfile.gettempdir(), os.environ.get("TMPDIR")) == before
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
