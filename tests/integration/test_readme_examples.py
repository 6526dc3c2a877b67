"""The examples of the README and of the pages of docs/ it links, run as a reader would: every
shell command line (```bash blocks, the indented command lines, `$ ` lines of output blocks) and
every ```python block, verbatim, in reading order (the README, then the pages in PAGES), in one
fresh folder that holds what a clone gives at the paths they use (`examples/`, copied). Python
blocks are pasted into a file and run with `python FILE`.

What cannot run here as written is listed in NOT_VERBATIM, each with its reason and what runs
instead. The one substitution of a command's own text is the PostgreSQL server: `db-host` (and
its database) becomes a fresh database on the tests' server. Beside it, the install lines are
not run (the test environment is that install) and the `<study>` placeholder of the snippet
that reads a recommendation is the quick start's study.
"""

import contextlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest

from autotune.common.trial import Status
from autotune.store.records import OWNER_ATTR, is_recorded
from tests.conftest import postgres_database
from tests.docs_text import DOCS, README, ROOT
from tests.integration.test_workers import assert_counted_once

pytestmark = pytest.mark.slow
# The README, then the pages of docs/ in the order its "Documentation" list links them: a
# reader's order, in which the quick start's study (the README's) is there for the pages after.
PAGES = [
    README,
    *(
        DOCS / name
        for name in (
            "results.md",
            "python-api.md",
            "scaling-out.md",
            "devices.md",
            "own-data.md",
            "llm.md",
            "estimate.md",
            "search-spaces.md",
            "settings.md",
            "trust.md",
            "search.md",
            "benchmarks.md",
            "developing.md",
        )
    ),
]
# The pages of docs/ not read for examples: their code is the package's, for its developers.
DESIGN_NOTES = {
    "architecture.md": "its indented block is the package's folder tree",
    "twin.md": "the twin's model and calibration; its search from the CLI is estimate.md's",
}
QUICK_START_STUDY = "google--bert_uncased_L-2_H-128_A-2-cpu-s64"
DASHBOARD_URL = "http://127.0.0.1:8080"  # optuna-dashboard's default host and port
POSTGRES = "{postgres}"  # in NotVerbatim.new: a fresh database on the tests' server


@dataclass(frozen=True, kw_only=True, slots=True)
class Example:
    kind: str
    """One of: shell (one command line), python (a whole block)."""
    text: str
    file: str
    """The page it is on, relative to the repository: README.md, docs/NAME.md."""
    line: int
    """The line of that page it starts on."""

    @property
    def where(self) -> str:
        return f"{self.file} line {self.line}"


@dataclass(frozen=True, kw_only=True, slots=True)
class NotVerbatim:
    reason: str
    """Why the example's text cannot run here as it is."""
    old: str | None = None
    """Run with this part replaced by `new`; None: not run here."""
    new: str = ""


# Keyed by a piece of text found in exactly one example (checked below).
NOT_VERBATIM = {
    "pip install torch==2.13.0 && pip install .\n": NotVerbatim(
        reason="the installs are the test environment's own (CI runs them before the tests); "
        "the search on the next line runs verbatim",
    ),
    "autotune search model=bert-large-uncased seq_len=512": NotVerbatim(
        reason="a GPU host's search: bert-large at seq_len 512 trains about a minute per step on "
        "2 CPU cores (test_workers.py runs the `workers=auto` path on CPU)",
    ),
    'open("reports/<study>/recommended.json")': NotVerbatim(
        reason="`<study>` is a placeholder: the quick start's study, above it in the README",
        old="<study>",
        new=QUICK_START_STUDY,
    ),
    'from_pretrained("my-model"': NotVerbatim(
        reason="a fragment showing a factory's signature (`my-model`, `...`); "
        "examples/classifier_trainer.py is the complete one, run by the command after it",
    ),
    "autotune search model=bert-large-uncased\n": NotVerbatim(
        reason="a GPU host's search, one worker per GPU (bert-large, seq_len 512)",
    ),
    "autotune search model=bert-large-uncased devices=0,1": NotVerbatim(
        reason="needs two GPUs (test_workers.py checks it is refused on CPU)",
    ),
    "autotune search model=bert-large-uncased workers=1": NotVerbatim(
        reason="needs several GPUs, a trial on all of them (test_devices_per_trial.py plans "
        "it on four stand-in GPUs; test_ranks.py trains each strategy on two CPU ranks)",
    ),
    "autotune search model=bert-large-uncased devices_per_trial=4": NotVerbatim(
        reason="needs four GPUs (test_devices_per_trial.py plans it on four stand-in GPUs)",
    ),
    "autotune search model=bert-large-uncased storage=postgresql://": NotVerbatim(
        reason="a GPU host's bert-large search on db-host; test_workers.py runs this command on "
        "the tests' PostgreSQL server with the tiny model and fake trials",
    ),
    "autotune worker storage=postgresql://autotune@db-host/autotune": NotVerbatim(
        reason="joins the bert-large study of the command above, which cannot run here; "
        "test_workers.py runs it against that command on the tests' server",
    ),
    "optuna-dashboard postgresql+psycopg://autotune@db-host/autotune": NotVerbatim(
        reason="db-host: the tests' PostgreSQL server instead (the one substitution of a "
        "command's text), a fresh database holding a `bert-large` study",
        old="postgresql+psycopg://autotune@db-host/autotune",
        new=POSTGRES,
    ),
    "autotune search model=meta-llama/Llama-3.1-8B peft=lora": NotVerbatim(
        reason="a GPU host's LoRA search of an 8B model; the tiny Llama's search above it on "
        "the same page runs verbatim (test_lora.py runs Llama and Qwen2 ones)",
    ),
    "executor=ray ray_address=auto model=": NotVerbatim(
        reason="a GPU cluster's search of an 8B model; test_ray.py runs `executor=ray` searches "
        "on a real two-node Ray cluster (loopback, CPU) with the tiny model",
    ),
    "executor=ray model=meta-llama/Llama-3.1-8B seq_len=4096 devices_per_trial=16": NotVerbatim(
        reason="needs two 8-GPU nodes; test_ray.py trains a trial across two nodes of a real "
        "Ray cluster (one CPU rank on each, gloo)",
    ),
    'pip install ".[test]" && python -m pytest': NotVerbatim(
        reason="the test suite itself",
    ),
}


def examples() -> list[Example]:
    """The shell command lines and python blocks of every page, in reading order."""
    return [example for path in PAGES for example in page_examples(path)]


def page_examples(path: Path) -> list[Example]:
    """A page's shell command lines and python blocks, in its order."""
    examples = []
    fence = None  # the info string of the open ``` block; None outside one
    block: list[str] = []
    file = path.relative_to(ROOT).as_posix()
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            if fence is None:
                fence, block, start = line[3:].strip(), [], number + 1
            else:
                if fence == "python":
                    examples.append(
                        Example(kind="python", text="\n".join(block) + "\n", file=file, line=start)
                    )
                fence = None
        elif fence is None:
            # An indented code block: four spaces, after a blank line (list items indent two).
            if line.startswith("    ") and not lines[number - 2].strip():
                examples.append(Example(kind="shell", text=line.strip(), file=file, line=number))
        elif fence == "bash" and line.strip():
            examples.append(Example(kind="shell", text=line, file=file, line=number))
        elif fence == "" and line.startswith("$ "):  # a command above its output
            text = line.removeprefix("$ ")
            examples.append(Example(kind="shell", text=text, file=file, line=number))
        else:
            block.append(line)
    return examples


def listed(example: Example) -> NotVerbatim | None:
    # A shell line gets a "\n" so that a key can name a line that others begin with.
    text = example.text + ("\n" if example.kind == "shell" else "")
    found = [entry for needle, entry in NOT_VERBATIM.items() if needle in text]
    assert len(found) <= 1, example
    return found[0] if found else None


def test_every_example_not_run_verbatim_is_listed_once_with_its_reason():
    found = examples()
    for needle, entry in NOT_VERBATIM.items():
        matches = [e for e in found if needle in e.text + ("\n" if e.kind == "shell" else "")]
        assert len(matches) == 1, f"{needle!r} names {len(matches)} examples, not 1"
        assert entry.old is None or entry.old in matches[0].text, (needle, entry.old)
    verbatim = [e for e in found if listed(e) is None]
    assert [e.kind for e in verbatim].count("python") == 2, "the Python API's, docs/llm.md's"
    assert len(verbatim) >= 6, verbatim


def test_every_page_of_the_docs_is_read_in_the_order_the_readme_lists_it():
    docs = {path.name for path in DOCS.glob("*.md")}
    assert docs == {path.name for path in PAGES[1:]} | set(DESIGN_NOTES), "a page not read"
    listed_pages = README.read_text().split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    order = re.findall(r"\]\(docs/([\w-]+\.md)\)", listed_pages)
    assert [name for name in order if name not in DESIGN_NOTES] == [p.name for p in PAGES[1:]]


def test_the_readme_and_docs_examples_run_verbatim_in_reading_order(tmp_path, request):
    clone = tmp_path / "clone"
    clone.mkdir()
    # A copy, not a link: nothing an example writes (a factory's __pycache__) reaches the repo.
    shutil.copytree(
        ROOT / "examples", clone / "examples", ignore=shutil.ignore_patterns("__pycache__")
    )
    # The commands the pages name, from the environment running the tests.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    ran, not_run, unavailable = [], [], []
    with contextlib.ExitStack() as cleanup:
        for example in examples():
            entry, text = listed(example), example.text
            if entry is not None and entry.old is None:
                not_run.append(f"{example.where}: {text.strip()[:60]}: {entry.reason}")
                continue
            if entry is not None and entry.new == POSTGRES:
                try:
                    server = request.getfixturevalue("postgres_server_url")
                except pytest.skip.Exception as skip:  # no server outside CI: the rest runs
                    unavailable.append(f"{example.where}: {skip}")
                    continue
                url = cleanup.enter_context(postgres_database(server))
                # The study the several-hosts commands (not run here) would have made.
                optuna.create_study(
                    storage=url, study_name="bert-large", directions=["maximize", "minimize"]
                )
                text = text.replace(entry.old, url)
            elif entry is not None:
                text = text.replace(entry.old, entry.new)
            started = time.monotonic()
            if example.kind == "python":
                run_python_block(example, text, clone, env)
            elif text.startswith("optuna-dashboard "):
                run_dashboard(example, text, clone, env)
            else:
                run_command(example, text, clone, env)
            ran.append(
                f"{time.monotonic() - started:6.1f} s  {example.where}: "
                f"{text.strip().splitlines()[0][:90]}"
            )
    print("\n".join(["", "ran:", *ran, "not run here:", *not_run]))
    if unavailable:
        pytest.skip(f"the rest ran; without a PostgreSQL server not: {unavailable}")


def run_command(example: Example, command: str, cwd: Path, env: dict) -> None:
    proc = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,  # under the other test process's load an example took past 600 s
        check=False,
    )
    expect_success(example, command, proc)
    argv = shlex.split(command.split("&&")[-1])
    if argv[:2] == ["autotune", "search"]:
        study_dir = study_folder(cwd, argv, proc.stdout)
        assert (study_dir / "recommended.json").is_file(), failure(example, command, proc)
        if "workers=2" in argv:
            check_two_workers(study_dir, proc)
    elif argv[:2] == ["autotune", "estimate"]:
        assert "largest batch that fits:" in proc.stdout, failure(example, command, proc)
    elif argv[:2] == ["autotune", "verify"]:
        check_verification(cwd / argv[2], proc)


def run_python_block(example: Example, code: str, cwd: Path, env: dict) -> None:
    script = cwd / f"{Path(example.file).stem}_line_{example.line}.py"
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, script.name],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,  # under the other test process's load an example took past 600 s
        check=False,
    )
    expect_success(example, f"python {script.name}", proc)
    if "autotune.search(" in code:
        study_dir = study_folder(cwd, ["out=reports", "study=api"], proc.stdout)
        assert (study_dir / "recommended.json").is_file(), failure(example, script.name, proc)
        # It prints a real TrainingArguments built from the recommended trial's kwargs, and
        # the search's own lines, as on the terminal.
        recommended = json.loads((study_dir / "recommended.json").read_text())
        batch = recommended["training_args"]["per_device_train_batch_size"]
        assert f"per_device_train_batch_size={batch}," in proc.stdout, failure(example, "", proc)
        assert "trial 0 started:" in proc.stdout, failure(example, script.name, proc)


def run_dashboard(example: Example, command: str, cwd: Path, env: dict) -> None:
    """Started as written, it serves at its default address until stopped: the page answers,
    and its API lists the study the storage URL holds."""
    with socket.socket() as probe:
        taken = probe.connect_ex(("127.0.0.1", 8080)) == 0
    assert not taken, f"{example.where}: port 8080, where `{command}` serves, is taken"
    log = cwd / f"dashboard_{Path(example.file).stem}_line_{example.line}.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            shlex.split(command), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, f"`{command}` exited:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"`{command}`: no answer in 60 s"
            try:
                with urllib.request.urlopen(DASHBOARD_URL, timeout=5) as page:  # redirects too
                    status = page.status
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.3)
        assert status == 200, f"`{command}`: HTTP {status}"
        with urllib.request.urlopen(f"{DASHBOARD_URL}/api/studies", timeout=10) as answer:
            served = [s["study_name"] for s in json.load(answer)["study_summaries"]]
        expected = "bert-large" if "postgresql" in command else command.split("/")[-2]
        assert served == [expected], f"`{command}` serves {served}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def study_folder(cwd: Path, argv: list[str], stdout: str) -> Path:
    """The study folder of a search: `out=` and `study=` as given, else the name it printed."""
    settings = dict(a.split("=", 1) for a in argv if "=" in a)
    if "study" not in settings:
        header = re.search(r"^study (\S+): ", stdout, re.M)
        assert header, stdout[-3000:]
        settings["study"] = header.group(1)
    return cwd / settings.get("out", "reports") / settings["study"]


def check_two_workers(study_dir: Path, proc: subprocess.CompletedProcess) -> None:
    """The CPU command for two workers (docs/scaling-out.md): each on a core of its own, both
    running the study's real trials, every trial counted once."""
    assert "2 workers on this study: cores 0, cores 1" in proc.stdout, proc.stdout[-3000:]
    study = optuna.load_study(
        study_name=study_dir.name, storage=f"sqlite:///{study_dir / 'study.db'}"
    )
    records = assert_counted_once(study, 6)
    ok = [r for r in records if r.status is Status.OK]
    assert len(ok) >= 4, [(r.status, r.result.reason) for r in records]
    assert {r.result.cpu_threads for r in ok} == {1}, "each trial trained on its worker's core"
    owners = {t.user_attrs[OWNER_ATTR]["pid"] for t in study.trials if is_recorded(t)}
    assert len(owners) == 2, "both workers ran trials"


def check_verification(study_dir: Path, proc: subprocess.CompletedProcess) -> None:
    """`autotune verify`: a real 200-step run of the recommended trial, its ratios stored with
    the study and shown in recommended.json, the report and the terminal."""
    recommended = json.loads((study_dir / "recommended.json").read_text())
    verified = recommended["verification"]
    assert (verified["trial"], verified["steps"], verified["status"]) == (
        recommended["trial"],
        200,
        "ok",
    ), verified
    # Compared with the confirmed median where the trial was confirmed, else its measurement.
    confirmation = recommended.get("confirmation") or {"trials": {}}
    confirmed = confirmation["trials"].get(str(recommended["trial"]))
    searched = (
        confirmed["median_samples_per_s"] if confirmed else recommended["metrics"]["samples_per_s"]
    )
    assert verified["searched_samples_per_s"] == searched
    assert verified["searched_rounds"] == (confirmation["rounds"] if confirmed else 0)
    assert f"trial {verified['trial']} started: " in proc.stdout, "its progress is shown"
    ratio = verified["samples_per_s"] / verified["searched_samples_per_s"]
    assert verified["samples_per_s_ratio"] == pytest.approx(ratio)
    assert verified["fragmentation"] is None  # CPU: no allocator cache to weigh
    assert f"verified: trial {verified['trial']} over 200 steps: " in proc.stdout, proc.stdout
    assert "recommended: verified" in (study_dir / "report.html").read_text()


def expect_success(example: Example, command: str, proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, failure(example, command, proc)


def failure(example: Example, command: str, proc: subprocess.CompletedProcess) -> str:
    return (
        f"{example.where}: `{command}` exited {proc.returncode}\n"
        f"--- stdout (tail) ---\n{proc.stdout[-1500:]}\n"
        f"--- stderr (tail) ---\n{proc.stderr[-3000:]}"
    )
