"""A real Ray cluster of two nodes on this machine, for the tests of `executor=ray`.

Ray rewrites 127.0.0.1 to the host's interface address and opens ports on every interface, so
the cluster lives in a network namespace of its own whose only interface is loopback: nothing
of it can be reached from outside, and nothing outside can reach it. Its nodes are two
`ray start --block` processes, a head and a second node, each with a custom resource named as
the node (`head`, `second`) and one CPU, sharing a private temporary folder. The search runs
in the namespace too (`run`, `start`).

Everything it started is stopped by pid: a node by its `ray start` process and every process
under it (`kill_node`), the cluster by every process in its namespace (`stop`). Never
`ray stop`, which kills every Ray process on the machine by name.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

PORT = 6379
ADDRESS = f"127.0.0.1:{PORT}"
RAY = str(Path(sys.executable).with_name("ray"))
START_S = 120.0
"""The most a node may take to join (a loaded machine); the cluster is up sooner."""
_names = itertools.count()


def can_make_namespaces() -> str | None:
    """Why this machine cannot hold the cluster (no `ip`, not allowed to make a namespace);
    None where it can."""
    if shutil.which("ip") is None:
        return "no `ip` command (Debian's iproute2)"
    name = f"autotune-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", name], check=True)
    return None


class RayCluster:
    def __init__(self, folder: Path) -> None:
        self.name = f"autotune-ray-{os.getpid()}-{next(_names)}"
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        # Short: Ray's sockets lie inside it, and a socket's path has at most 107 bytes.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="at-ray-", dir="/tmp"))
        self.nodes: dict[str, subprocess.Popen] = {}
        self.started = False

    # --- starting and stopping -------------------------------------------------------------

    def start(self) -> RayCluster:
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        self.started = True
        subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True)
        self._node("head", "--head", f"--port={PORT}", "--include-dashboard=false")
        self.wait_for_nodes(1)
        self._node("second", f"--address={ADDRESS}")
        self.wait_for_nodes(2)
        return self

    def _node(self, name: str, *how: str) -> None:
        command = [
            *self.inside(),
            RAY,
            "start",
            "--block",
            *how,
            "--node-ip-address=127.0.0.1",
            f"--node-name={name}",
            "--num-cpus=1",
            "--num-gpus=0",
            f"--resources={json.dumps({name: 1})}",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
        ]
        with open(self.folder / f"{name}.log", "wb") as log:  # the node keeps its own copy
            self.nodes[name] = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.environment(),
            )

    def stop(self) -> None:
        """Kill every process of the namespace (the cluster's, and anything it started), by
        pid, then the namespace itself."""
        if not self.started:
            return
        for _ in range(20):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        for node in self.nodes.values():
            with contextlib.suppress(Exception):
                node.wait(timeout=10)
        subprocess.run(["ip", "netns", "delete", self.name], check=False)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.started = False

    def kill_node(self, name: str) -> None:
        """The node `name` lost: its `ray start` process and every process under it (raylet,
        workers, a trial's actor and what it started) killed at once."""
        root = psutil.Process(self.nodes[name].pid)
        tree = [root, *root.children(recursive=True)]
        for process in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(tree, timeout=10)

    # --- inside the cluster ----------------------------------------------------------------

    def inside(self) -> list[str]:
        """The start of a command that runs in the cluster's namespace."""
        return ["ip", "netns", "exec", self.name]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("RAY_ADDRESS", None)
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        return env

    def run(self, args: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.inside(), *args],
            capture_output=True,
            text=True,
            env=self.environment(),
            **kwargs,
        )

    def start_process(self, args: list[str], log: Path) -> subprocess.Popen:
        with open(log, "wb") as out:
            return subprocess.Popen(
                [*self.inside(), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.environment(),
            )

    def python(self, code: str) -> str:
        """What `code` prints, run by this Python in the namespace; an AssertionError with its
        output where it fails."""
        done = self.run([sys.executable, "-c", code])
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def wait_for_nodes(self, count: int) -> None:
        code = (
            "import ray, time\n"
            f"ray.init(address={ADDRESS!r}, logging_level='ERROR', log_to_driver=False)\n"
            "print(sum(n['Alive'] for n in ray.nodes()))\n"
        )
        deadline = time.monotonic() + START_S
        while True:
            done = self.run([sys.executable, "-c", code])
            if done.returncode == 0 and int(done.stdout.split()[-1]) >= count:
                return
            for name, node in self.nodes.items():
                if node.poll() is not None:
                    raise AssertionError(
                        f"node {name} exited: {(self.folder / f'{name}.log').read_text()}"
                    )
            if time.monotonic() > deadline:
                raise AssertionError(f"{count} nodes did not join: {done.stdout}{done.stderr}")
            time.sleep(0.5)

    # --- what is there ---------------------------------------------------------------------

    def pids(self) -> list[int]:
        """Every process in the cluster's namespace."""
        listed = subprocess.run(
            ["ip", "netns", "pids", self.name], capture_output=True, text=True, check=False
        )
        return [int(p) for p in listed.stdout.split()]

    def node_processes(self, name: str) -> list[psutil.Process]:
        root = psutil.Process(self.nodes[name].pid)
        return [root, *root.children(recursive=True)]

    def trial_processes(self) -> list[psutil.Process]:
        """The trials' actors in the namespace, and everything under them."""
        found = []
        for pid in self.pids():
            with contextlib.suppress(psutil.NoSuchProcess):
                process = psutil.Process(pid)
                if "TrialNode" in " ".join(process.cmdline()):
                    found += [process, *process.children(recursive=True)]
        return found

    def interfaces(self) -> list[str]:
        listed = subprocess.run(
            ["ip", "-n", self.name, "-o", "link", "show"], capture_output=True, text=True
        )
        return [line.split(":")[1].strip() for line in listed.stdout.splitlines()]

    def listeners_outside(self) -> list[str]:
        """Sockets listening outside the namespace that a process of the cluster holds."""
        pids = set(self.pids())
        return [
            f"{c.laddr} (pid {c.pid})"
            for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.pid in pids
        ]
