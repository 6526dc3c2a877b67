import subprocess
import sys


def test_the_parent_never_imports_torch_or_transformers():
    code = (
        "import sys; import autotune.cli, autotune.study, autotune.outputs, autotune.runner; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_worker_never_imports_optuna():
    code = "import sys, autotune.worker; print('optuna' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
