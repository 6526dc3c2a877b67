import json
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
    # A package's __main__ runs its program (the CLI, a trial) when imported.
    names = [m.name for m in found if not m.name.endswith(".__main__")]
    child = [n for n in names if n.startswith("autotune.child")]
    return child if inside_child else [n for n in names if n not in child]


def test_no_module_outside_the_child_folder_imports_torch_or_transformers_when_imported():
    """The import contracts (tests/unit/test_import_contracts.py) see imports made inside
    functions too; this sees what importing every module of the search process really loads.
    """
    modules = _modules(inside_child=False)
    assert "autotune.execute.local" in modules and "autotune.cli" in modules
    assert not _imported_after(modules) & {"torch", "transformers", "datasets", "accelerate"}


def test_no_module_of_the_child_folder_imports_optuna():
    modules = _modules(inside_child=True)
    assert "autotune.child.worker" in modules
    loaded = _imported_after(modules)
    assert "torch" in loaded and "optuna" not in loaded


FAKE_H100 = """
import sys, types, torch, torch.cuda, pynvml
calls = []


def lazy_init():  # CUDA's initialisation, counted instead of run
    calls.append(1)
    torch.cuda._initialized = True


torch.cuda._lazy_init = lazy_init
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.version.cuda = "13.0"
torch._C._cuda_getDevice = lambda: 0
# bitsandbytes' CUDA ops keep a reference to it at import (transformers.trainer imports peft,
# and peft bitsandbytes): a name only, which a CPU build lacks.
torch._C._cuda_getCurrentRawStream = lambda device: 0
torch.cuda._get_device_properties = lambda index: types.SimpleNamespace(
    major=9, minor=0, name="NVIDIA H100 80GB HBM3", total_memory=85017493504, gcnArchName="")
# NVML answers as the H100's driver did (probe.json: compute_capability 9.0).
pynvml.nvmlInit = lambda: None
pynvml.nvmlDeviceGetHandleByIndex = lambda index: index
pynvml.nvmlDeviceGetCudaComputeCapability = lambda handle: (9, 0)
"""
"""A GPU as the Python side of torch sees it, on a CPU build: what asks CUDA for anything
reaches `lazy_init`. It sees Python-level initialisation only (the calls that reach the driver
return early on a CPU build); benchmarks/fork_cuda.py checks a real GPU."""


def _run(code: str, *args: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", FAKE_H100 + code, *args], capture_output=True, text=True, check=True
    )
    return out.stdout.splitlines()


def test_the_fork_server_preload_never_initialises_cuda_even_where_cuda_is_present():
    # A trial forked from a server that has initialised CUDA cannot use the GPU ("Cannot
    # re-initialize CUDA in forked subprocess"); nor can a rank forked from its worker.
    # What the server preloads (the Trainer and the worker, with the rank path, included) must
    # not reach CUDA's initialisation.
    lines = _run(
        "from autotune.execute.launchers import PRELOAD\n"
        "for name in PRELOAD: __import__(name)\n"
        "from autotune.child import cuda_free\n"
        "print(len(calls)); print(cuda_free.first_init())\n"
    )
    assert lines == ["0", "None"], lines


def test_without_cuda_free_the_trainer_import_initialises_cuda_through_torchao():
    # Why the server needs `cuda_free`, written down where a change would show: importing the
    # Trainer imports its model code, whose quantizers import torchao, which asks for the
    # device's capability at import. If this fails because nothing initialises CUDA any more,
    # cuda_free's account of the culprits is out of date; if it names another module, a new
    # culprit is there (and the test above says whether cuda_free still covers it).
    lines = _run(
        "from autotune.child import cuda_free\n"
        "torch.cuda._lazy_init = cuda_free._watched(torch.cuda._lazy_init)  # the watch alone\n"
        "import transformers\n"
        "print(len(calls))\n"
        "import transformers.trainer\n"
        "print(len(calls)); print(cuda_free.first_init())\n"
    )
    assert lines[0] == "0", lines  # transformers alone stays clear
    assert int(lines[1]) > 0, lines
    assert "transformers.trainer" in lines[2] and "torchao" in lines[2], lines


def test_tritons_device_check_is_answered_without_initialising_cuda():
    # The next culprit, on an H200 (torch 2.11, torchao 0.18), once the capability was
    # answered: torchao's mx_formats kernels ask `has_triton()` at import, and torch reads the
    # device's properties for it through dynamo's device interface. A CPU build has no Triton
    # package: it is pretended here, as the GPU is.
    triton = (
        "import torch._dynamo.device_interface, torch._inductor.config  # before the pretence\n"
        "torch.utils._triton.has_triton_package = lambda: True\n"
    )
    ask = "print(torch.utils._triton.has_triton()); print(len(calls))\n"
    bare = _run(triton + ask)
    assert bare[0] == "True" and int(bare[1]) > 0, bare  # torch's own answer starts CUDA
    quiet = _run("from autotune.child import cuda_free\ncuda_free.install()\n" + triton + ask)
    assert quiet == ["True", "0"], quiet


CULPRIT = """
import torch
torch.cuda.get_device_properties(0)  # asks CUDA itself: initialises it
"""


def test_a_rank_is_never_forked_from_a_worker_that_initialised_cuda(tmp_path):
    # The guard before the ranks' fork: a worker that holds a CUDA context (here made by an
    # import, as torchao's once was) forks no rank; the trial ends `error`, naming the import.
    (tmp_path / "culprit_module.py").write_text(CULPRIT)
    lines = _run(
        "sys.path.insert(0, sys.argv[1])\n"
        "from pathlib import Path\n"
        "from autotune.child import cuda_free, ranks\n"
        "from autotune.common.trial import TrialSpec\n"
        "cuda_free.install()\n"
        "import culprit_module\n"
        "spec = TrialSpec(trial_number=0, model_name='m', model_config={}, task='causal-lm',\n"
        "    seq_len=8, device='cuda', params={'strategy': 'ddp'}, warmup_steps=1,\n"
        "    measure_steps=1, seed=0, devices=1)\n"
        "forked = []\n"
        "result = ranks.run(spec, Path(sys.argv[1]), lambda rank: forked.append(rank))\n"
        "print(result.status.value); print(len(forked)); print(result.reason)\n",
        str(tmp_path),
    )
    assert lines[:2] == ["error", "0"], lines
    assert "importing" in lines[2] and "culprit_module" in lines[2], lines


BAD_FORK = """
import json, sys
from pathlib import Path
import torch
from autotune.child import cuda_free, worker
from autotune.common.trial import TrialSpec, spec_to_dict

folder = Path(sys.argv[1])
spec = TrialSpec(trial_number=0, model_name="m", model_config={}, task="causal-lm", seq_len=8,
                 device="cuda", params={}, warmup_steps=1, measure_steps=1, seed=0)
(folder / "spec.json").write_text(json.dumps(spec_to_dict(spec)))
cuda_free._first_init = "importing some_module (its line)"  # what the server recorded
torch.cuda._is_in_bad_fork = lambda: True  # forked from a server that initialised CUDA
worker.main([str(folder / "spec.json"), str(folder / "result.json")])
"""


def test_a_trial_forked_from_a_server_that_initialised_cuda_starts_again_cold(tmp_path):
    # Should an import initialise CUDA in the fork server after all, its forks cannot use the
    # GPU: the worker says what to blame and becomes a fresh interpreter, which can. (On this
    # CPU the fresh one then fails to reach a GPU, and says so in its result.)
    out = subprocess.run(
        [sys.executable, "-c", BAD_FORK, str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    said = "the fork server initialised CUDA (importing some_module (its line)); the trial"
    assert said in out.stdout
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "error"
    assert result["imports_s"] > 0  # imported again, by the fresh interpreter
