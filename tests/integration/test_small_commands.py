"""The small commands answer without importing torch or transformers (seconds of imports on a
busy machine), and a setting typed as a `--flag` gets told how to write it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune import cli
from autotune.plan import software_cache

CPU_SPACE = str(Path(__file__).parents[2] / "search_spaces" / "cpu.yaml")
HEAVY = ("torch", "transformers")


@pytest.fixture
def no_heavy_imports(tmp_path):
    """An environment in which importing torch or transformers, in any process, fails loudly
    and leaves a note: stand-in packages ahead of the real ones on PYTHONPATH."""
    stand_ins = tmp_path / "stand-ins"
    notes = tmp_path / "imported"
    for name in HEAVY:
        (stand_ins / name).mkdir(parents=True)
        (stand_ins / name / "__init__.py").write_text(
            f"with open({str(notes)!r}, 'a') as f:\n    f.write('{name}\\n')\n"
            f"raise ImportError('{name} imported by a small command')\n"
        )
    env = {**os.environ, "PYTHONPATH": str(stand_ins), software_cache.CACHE_DIR_ENV: str(tmp_path)}
    return env, notes


def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=300, check=False
    )


@pytest.mark.parametrize(
    "args",
    [
        ["-c", "import autotune.cli"],
        ["-m", "autotune", "--help"],
        ["-m", "autotune", "models"],
        ["-m", "autotune", "spaces"],
    ],
)
def test_small_commands_import_neither_torch_nor_transformers(no_heavy_imports, args):
    env, notes = no_heavy_imports
    proc = run(*args, env=env)
    assert proc.returncode == 0, proc.stderr
    assert not notes.exists(), f"imported: {notes.read_text()}"


def test_models_lists_every_catalogue_model_with_its_parameter_count(no_heavy_imports):
    env, _ = no_heavy_imports
    proc = run("-m", "autotune", "models", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "bert-large-uncased" in proc.stdout
    assert "335.1M" in proc.stdout  # bert-large with its classification head
    assert "TinyLlama/TinyLlama-1.1B-Chat-v1.0" in proc.stdout


def test_validate_probes_once_then_answers_from_the_cache(no_heavy_imports, tmp_path):
    env, notes = no_heavy_imports
    real = {**env, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    first = run("-m", "autotune", "validate", CPU_SPACE, env=real)
    assert first.returncode == 0, first.stderr
    assert (tmp_path / software_cache.file_name()).is_file()

    again = run("-m", "autotune", "validate", CPU_SPACE, env=env)
    assert again.returncode == 0, again.stderr
    assert f"{CPU_SPACE}: ok" in again.stdout
    assert not notes.exists(), f"imported: {notes.read_text()}"

    # The cached names still catch a misspelt optimizer.
    bad = tmp_path / "bad.yaml"
    bad.write_text("knobs:\n  optim: {choices: [adamw_torch, adamw_torhc]}\n")
    refused = run("-m", "autotune", "validate", str(bad), env=env)
    assert refused.returncode == 2
    assert "adamw_torhc" in refused.stderr
    assert not notes.exists(), f"imported: {notes.read_text()}"


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (["search", "--model", "x"], "use model=x, not --model x"),
        (["search", "--model=x", "seq_len=32"], "use model=x, not --model=x"),
        (
            ["search", "model=x", "--seq-len", "128", "--quiet"],
            "use seq_len=128 quiet=true, not --seq-len 128 --quiet",
        ),
        (["export", "reports/s", "--format", "py"], "use format=py, not --format py"),
        (["report", "reports/s", "--study=s"], "use study=s, not --study=s"),
    ],
)
def test_a_setting_written_as_a_flag_names_the_fix(capsys, args, hint):
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"error: settings are key=value: {hint}" in " ".join(err.split())


def test_an_unknown_flag_that_is_no_setting_keeps_the_usual_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["search", "model=x", "--warp-drive"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --warp-drive" in capsys.readouterr().err
