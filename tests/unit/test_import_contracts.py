"""The house's import rules (`[tool.importlinter]` in pyproject.toml), checked with import-linter,
which reads every import, those inside functions included (through grimp)."""

from pathlib import Path

import pytest
from importlinter import configuration
from importlinter.application import use_cases
from importlinter.configuration import settings

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

CIRCLES = "No import circles: the modules of each folder, and the folders, import one way"
LAYERS = "The search process's stages import downwards only"
COMMON = "Both sides' folder imports no other folder, and neither torch nor optuna"
CHILD = "A child process imports only what both sides share, and never optuna"
NO_CHILD_CODE = "The search process never imports child code: it starts it by module name"
NO_TORCH = "The search process never imports torch, transformers, datasets or accelerate"
EXECUTOR = "The trial executors' protocol imports only what both sides share"
SEAM = "The search and its outputs run trials through the executors' protocol alone"


def broken_contracts(added: tuple[str, str] | None = None) -> set[str]:
    """The contracts the package breaks, with one more import (importer, imported) if given."""
    configuration.configure()
    builder = settings.GRAPH_BUILDER

    class WithOneMore:
        def build(self, *args, **kwargs):
            graph = builder.build(*args, **kwargs)
            if added is not None:
                importer, imported = added
                graph.add_import(
                    importer=importer,
                    imported=imported,
                    line_number=1,
                    line_contents=f"import {imported}",
                )
            return graph

    settings.configure(GRAPH_BUILDER=WithOneMore())
    try:
        use_cases._register_built_in_contract_types()
        report = use_cases.create_report(
            use_cases.read_user_options(str(PYPROJECT)), cache_dir=None
        )
    finally:
        settings.configure(GRAPH_BUILDER=builder)
    names = {contract.name for contract, _ in report.get_contracts_and_checks()}
    assert names == {CIRCLES, LAYERS, COMMON, CHILD, NO_CHILD_CODE, NO_TORCH, EXECUTOR, SEAM}
    return {
        contract.name for contract, check in report.get_contracts_and_checks() if not check.kept
    }


def test_the_package_keeps_every_import_contract():
    assert broken_contracts() == set()


@pytest.mark.parametrize(
    ("importer", "imported", "broken"),
    [
        # The plan reaching up into the search loop (which imports the plan): a circle.
        ("autotune.plan.plan", "autotune.study.loop", {CIRCLES, LAYERS}),
        # Two modules of one folder importing each other.
        ("autotune.plan.estimate", "autotune.plan.plan", {CIRCLES}),
        ("autotune.store.records", "autotune.outputs.snapshot", {CIRCLES, LAYERS}),
        # Both sides import the knob catalogue: torch there reaches the search process too.
        ("autotune.common.knobs", "torch", {COMMON, NO_TORCH}),
        # The trial contract on optuna's side: a circle, and a child process would import it.
        # (the executors' protocol reads the trial contract: it would reach optuna's side too)
        (
            "autotune.common.trial",
            "autotune.store.records",
            {CIRCLES, COMMON, CHILD, LAYERS, EXECUTOR},
        ),
        ("autotune.child.worker", "optuna", {CHILD}),
        ("autotune.child.measure", "autotune.plan.estimate", {CHILD}),
        ("autotune.outputs.view", "autotune.child.data", {NO_CHILD_CODE, NO_TORCH}),
        ("autotune.store.records", "transformers", {NO_TORCH}),
        # The executors under the loop: one reaching up to it is a circle and against the layers.
        ("autotune.execute.local", "autotune.study.loop", {CIRCLES, LAYERS}),
        # The protocol an executor elsewhere implements knows nothing of the search's stages.
        ("autotune.execute.base", "autotune.plan.plan", {EXECUTOR}),
        # The loop or the confirmation building this host's executor (or reading its files)
        # instead of submitting to the one it is given.
        ("autotune.study.loop", "autotune.execute.local", {SEAM}),
        ("autotune.outputs.confirm", "autotune.execute.launchers", {SEAM}),
        ("autotune.study.launch", "autotune.execute.ray_executor", {SEAM}),
        ("autotune.outputs.confirm", "ray", {SEAM}),
    ],
)
def test_one_import_against_the_house_breaks_its_contract(importer, imported, broken):
    assert broken_contracts((importer, imported)) == broken
