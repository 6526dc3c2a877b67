import pkgutil
import subprocess
import sys

import autotune


def _imported_after(modules: list[str]) -> set[str]:
    """The top-level packages a fresh interpreter holds after importing `modules`."""
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def _modules(inside_child: bool) -> list[str]:
    found = pkgutil.walk_packages(autotune.__path__, "autotune.")
    names = [m.name for m in found if m.name != "autotune.__main__"]  # it runs the CLI
    child = [n for n in names if n.startswith("autotune.child")]
    return child if inside_child else [n for n in names if n not in child]


def test_no_module_outside_the_child_folder_imports_torch_or_transformers_when_imported():
    """The import contracts (tests/unit/test_import_contracts.py) see imports made inside
    functions too; this sees what importing every module of the search process really loads.
    """
    modules = _modules(inside_child=False)
    assert "autotune.study.runner" in modules and "autotune.cli" in modules
    assert not _imported_after(modules) & {"torch", "transformers", "datasets", "accelerate"}


def test_no_module_of_the_child_folder_imports_optuna():
    modules = _modules(inside_child=True)
    assert "autotune.child.worker" in modules
    loaded = _imported_after(modules)
    assert "torch" in loaded and "optuna" not in loaded


def test_the_fork_server_preload_never_initialises_cuda_even_where_cuda_is_present():
    # A trial forked from a server that has initialised CUDA cannot use the GPU ("Cannot
    # re-initialize CUDA in forked subprocess"). Pretend a GPU is present and make CUDA's lazy
    # initialisation fail loudly: importing what the server preloads on a GPU must not reach
    # it. This sees Python-level initialisation only: on a CPU build of torch the calls that
    # reach the driver return early (benchmarks/fork_cuda.py checks a real GPU).
    code = (
        "import traceback, torch, torch.cuda\n"
        "calls = []\n"
        "torch.cuda._lazy_init = lambda: calls.append(traceback.format_stack())\n"
        "torch.cuda.is_available = lambda: True\n"
        "torch.cuda.device_count = lambda: 1\n"
        "from autotune.study.runner import CUDA_SAFE_PRELOAD\n"
        "for name in CUDA_SAFE_PRELOAD: __import__(name)\n"
        "print(len(calls)); print(''.join(calls[0]) if calls else '')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[0] == "0", out.stdout
