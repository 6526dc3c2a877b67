import subprocess
import sys


def test_the_parent_never_imports_torch_or_transformers():
    code = (
        "import sys; import autotune.cli, autotune.search.study, autotune.outputs.study_folder, autotune.search.runner; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_worker_never_imports_optuna():
    code = "import sys, autotune.child.worker; print('optuna' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_fork_server_preload_never_initialises_cuda_even_where_cuda_is_present():
    # A trial forked from a server that has initialised CUDA cannot use the GPU ("Cannot
    # re-initialize CUDA in forked subprocess"). Pretend a GPU is present and make CUDA's lazy
    # initialisation fail loudly: importing what the server preloads must not reach it.
    code = (
        "import traceback, torch, torch.cuda\n"
        "calls = []\n"
        "torch.cuda._lazy_init = lambda: calls.append(traceback.format_stack())\n"
        "torch.cuda.is_available = lambda: True\n"
        "torch.cuda.device_count = lambda: 1\n"
        "from autotune.search.runner import PRELOAD\n"
        "for name in PRELOAD: __import__(name)\n"
        "print(len(calls)); print(''.join(calls[0]) if calls else '')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[0] == "0", out.stdout
