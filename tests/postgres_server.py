"""A throwaway PostgreSQL cluster for the tests of `storage=postgresql://...`.

CI (.ci/run) starts one before the test command and exports its URL; the tests' fixture
(tests/conftest.py) starts one itself when no URL is given. Standard library only: CI runs it
before the test dependencies are installed.

    python tests/postgres_server.py bin         # where initdb, pg_ctl, createdb are; or exit 1
    python tests/postgres_server.py start DIR   # a cluster in the empty folder DIR; prints its URL
    python tests/postgres_server.py stop DIR    # stop it and remove DIR

initdb refuses to run as root, so as root the server runs as the `postgres` user (which the
OS package creates) and DIR is handed to that user. Trust authentication, listening on
127.0.0.1 only, on a free port, with its socket in DIR: nothing outside DIR is touched.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

USER = "autotune"  # the cluster's superuser, and the name of the database made for the tests
RUN_AS = "postgres"  # the OS user the server runs as when started by root


class Unavailable(Exception):
    """No cluster can be started here; the message says why."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    root: Path
    """Holds the data folder, the server log and the socket; removed by `stop`."""
    port: int
    url: str
    """`postgresql://autotune@127.0.0.1:PORT/autotune` (libpq's form, which autotune accepts)."""


def bin_dir() -> Path:
    """The folder holding initdb, pg_ctl and createdb: on PATH, else the newest Debian/Ubuntu
    install."""
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version, reverse=True)
    for initdb in (shutil.which("initdb"), *debian, "/usr/local/bin/initdb"):
        # Resolved: a link such as /usr/local/bin/initdb leads to the folder with createdb too.
        folder = Path(initdb).resolve().parent if initdb else None
        if folder and all((folder / p).is_file() for p in ("initdb", "pg_ctl", "createdb")):
            return folder
    raise Unavailable(
        "PostgreSQL is not installed (no initdb, pg_ctl and createdb): apt-get install postgresql"
    )


def _version(initdb: str) -> tuple[int, ...]:
    name = Path(initdb).parents[1].name  # /usr/lib/postgresql/15/bin/initdb -> 15
    return tuple(int(p) for p in name.split(".") if p.isdigit())


def start(root: Path | None = None) -> Cluster:
    """A running cluster with an empty database `autotune`, in ROOT (a new temp folder when
    None)."""
    folder = bin_dir()
    root = Path(tempfile.mkdtemp(prefix="autotune-pg-")) if root is None else root
    try:
        if os.geteuid() == 0:
            _hand_over(root)
        root.chmod(0o700)
        port = _free_port()
        # A throwaway cluster needs no durability: no disk flushes (--no-sync, fsync=off).
        # initdb is most of the start: 0.8 s of about 0.9 s on this project's 2-core box.
        _run(
            folder / "initdb",
            "-D",
            root / "data",
            "-A",
            "trust",
            "-U",
            USER,
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
            "--no-instructions",
        )
        log = root / "server.log"
        options = (
            f"-p {port} -k {shlex.quote(str(root))} -c listen_addresses=127.0.0.1 -c fsync=off"
        )
        _run(
            folder / "pg_ctl",
            "-D",
            root / "data",
            "-l",
            log,
            "-w",
            "-t",
            "60",
            "-o",
            options,
            "start",
            log=log,
        )
        # createdb is a client: it needs no particular OS user.
        _run(
            folder / "createdb",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-U",
            USER,
            USER,
            as_server=False,
        )
    except Unavailable:
        stop(root)  # what initdb left, and a server that did start
        raise
    return Cluster(root=root, port=port, url=f"postgresql://{USER}@127.0.0.1:{port}/{USER}")


def _hand_over(root: Path) -> None:
    """Make ROOT the server user's: initdb refuses to run as root."""
    try:
        owner = pwd.getpwnam(RUN_AS)
    except KeyError:
        raise Unavailable(
            f"running as root, and there is no {RUN_AS!r} user to run the server "
            "as (the postgresql OS package creates it)"
        ) from None
    os.chown(root, owner.pw_uid, owner.pw_gid)


def stop(root: Path) -> None:
    """Stop the cluster in ROOT (if it runs) and remove ROOT. No checkpoint: it is thrown away."""
    if (root / "data" / "postmaster.pid").exists():
        _run(bin_dir() / "pg_ctl", "-D", root / "data", "-m", "immediate", "-w", "stop")
    shutil.rmtree(root, ignore_errors=True)


def _free_port() -> int:
    """A port free a moment ago (the server takes it a second later; a clash makes start fail
    with the server log saying so)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(program: Path, *args: str | Path, as_server: bool = True, log: Path | None = None) -> None:
    argv = [str(program), *map(str, args)]
    if as_server and os.geteuid() == 0:
        argv = ["runuser", "-u", RUN_AS, "--", *argv]
    # cwd=/: the server's user may not be allowed into the caller's working directory.
    proc = subprocess.run(argv, capture_output=True, text=True, cwd="/", check=False)
    if proc.returncode != 0:
        output = (proc.stderr or proc.stdout).strip()[-2000:]
        if log is not None and log.is_file():  # why a server did not start
            output += f"\n{log}:\n{log.read_text(errors='replace')[-2000:]}"
        raise Unavailable(f"{program.name} failed (exit {proc.returncode}): {output}")


def main(argv: list[str]) -> int:
    match argv:
        case ["bin"]:
            print(bin_dir())
        case ["start", root]:
            print(start(Path(root)).url)
        case ["stop", root]:
            stop(Path(root))
        case _:
            print(__doc__, file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Unavailable as exc:
        print(f"postgres_server: {exc}", file=sys.stderr)
        sys.exit(1)
