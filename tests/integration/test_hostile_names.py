"""A model folder whose name is Python code: the scripts autotune writes must not run it."""

import html
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import autotune

pytestmark = pytest.mark.slow
TINY_CONFIG = (
    Path(autotune.__file__).parent / "model_configs" / "google--bert_uncased_L-2_H-128_A-2.json"
)
# Each breaks out of a different string the script could hold, or breaks its source (\N).
HOSTILE = {
    "triple-double": 'x"""+__import__("os").system("touch PWNED")+"""',
    "triple-single": "x'''+__import__('os').system('touch PWNED2')+'''",
    "backslash": 'x\\N"+__import__("os").system("touch PWNED3")+"\\',
}


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=600, cwd=cwd, check=False
    )


def pwned(*folders: Path) -> list[Path]:
    return [p for folder in folders for p in folder.rglob("PWNED*")]


@pytest.fixture(scope="module", params=list(HOSTILE), ids=list(HOSTILE))
def search(request, tmp_path_factory):
    """One real search on a tiny BERT kept in a folder with a hostile name."""
    root = tmp_path_factory.mktemp("hostile")
    model = root / HOSTILE[request.param]
    model.mkdir()
    shutil.copy(TINY_CONFIG, model / "config.json")
    cwd = root / "cwd"
    cwd.mkdir()
    proc = run(
        "-m",
        "autotune",
        "search",
        f"model={model}",
        "n_trials=2",
        "seq_len=32",
        "confirm_rounds=0",
        "measure_steps=2",
        "warmup_steps=1",
        f"out={root / 'reports'}",
        "study=hostile",
        cwd=cwd,
    )
    return model, root / "reports" / "hostile", cwd, proc


def test_search_runs_and_writes_its_script(search):
    model, study_dir, _, proc = search
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (study_dir / "recommended.py").is_file()
    report = (study_dir / "report.html").read_text()
    assert html.escape(str(model)) in report and str(model) not in report


def test_written_and_exported_scripts_show_help_without_running_the_name(search, tmp_path):
    model, study_dir, cwd, _ = search
    exported = run("-m", "autotune", "export", str(study_dir), "format=py", cwd=cwd)
    assert exported.returncode == 0, exported.stderr[-2000:]
    (tmp_path / "exported.py").write_text(exported.stdout)
    for script in (study_dir / "recommended.py", tmp_path / "exported.py"):
        proc = run(str(script), "--help", cwd=tmp_path)
        assert not pwned(model.parent, tmp_path), f"{script.name} ran the model's name"
        assert proc.returncode == 0, proc.stderr[-2000:]
        # It still says what it is: the model, the trial and what it measured.
        assert model.name in proc.stdout
        assert "samples/s" in proc.stdout and "study hostile" in proc.stdout


def test_exported_flags_are_only_the_flags(search):
    _, study_dir, cwd, _ = search
    flags = run("-m", "autotune", "export", str(study_dir), "format=cli", cwd=cwd)
    assert flags.returncode == 0, flags.stderr[-2000:]
    exported = run("-m", "autotune", "export", str(study_dir), "format=json", cwd=cwd)
    expected = []
    for key, value in json.loads(exported.stdout)["training_args"].items():
        expected += [f"--{key}", str(value)]  # True spelled out too (`tf32` needs it)
    # The model kwargs (the attention kernel) are a comment line, which a shell skips.
    assert flags.stdout.startswith("# not a flag of the HF example scripts")
    assert shlex.split(flags.stdout, comments=True) == expected
