"""recommended.py: what a study holds reaches the script only as constants, never as code;
what no script could hold (a task autotune does not train, a value with no Python literal) is
refused; and the script builds the collator its trial measured with."""

import ast
import dataclasses
import math

import pytest

from autotune.common.errors import StudyError
from autotune.common.trial import Status, TrialResult
from autotune.outputs.script import render_script
from autotune.plan.run_info import RunInfo
from autotune.store.records import TrialRecord

# Each breaks out of a different kind of Python string, or breaks the source outright (\N).
HOSTILE = [
    'x"""+__import__("os").system("touch PWNED")+"""',
    "x'''+__import__('os').system('touch PWNED')+'''",
    "x'+__import__('os').system('touch PWNED')+'",
    'x\\N"+__import__("os").system("touch PWNED")+"\\',
]


def run_info(text: str) -> RunInfo:
    """A RunInfo whose every string field is `text`, built from the fields RunInfo has today."""
    values = {
        "study": text,
        "model": text,
        "model_config": {"model_type": "bert", "vocab_size": 64, text: text, "nested": [text]},
        "task": "causal-lm",  # a hostile task is refused outright: see below
        "seq_len": 32,
        "device": text,
        "device_name": text,
        "space": text,
        "space_notes": [text],
        "batch_mode": text,
        "effective_batch_size": None,
        "adapter": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": [text]},
        "memory_budget_bytes": 2**30,
        "headroom": 0.1,
        "noise_cv": 0.05,
        "math_change_min_gain": 1.1,
        "report_to": text,
        "data": {
            "data": text,
            "split": text,
            "text_column": text,
            "tokenizer": text,
            "seq_len": 32,
            "fingerprint": text,
            "format": text,
            "files": [text],
        },
        "trainer": {"factory": text, "search_dir": text},
        "measure_steps": 10,
        "warmup_steps": 3,
        "cores_per_trial": 2,
        "devices_per_trial": 1,
        "versions": {"torch": text, "transformers": text, "autotune": text},
        "gpu_link": text,
        "simulated": text,
        "training_fields": ("tf32", text),
    }
    return RunInfo(**{f.name: values[f.name] for f in dataclasses.fields(RunInfo)})


def trial_record(text: str) -> TrialRecord:
    result = TrialResult(
        status=Status.OK,
        samples_per_s=123.456,
        peak_memory_gib=1.5,
        device_name=text,
        training_args={"per_device_train_batch_size": 8, "optim": text, "run_name": text},
        model_kwargs={"attn_implementation": text},
    )
    return TrialRecord(number=3, params={"optim": text}, result=result)


def code_shape(source: str) -> str:
    """The script's AST with every constant blanked: what it does, not the data it holds."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            node.value = None
    return ast.dump(tree)


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_names_reach_the_script_only_as_string_constants(text):
    script = render_script(run_info(text), trial_record(text))
    tree = ast.parse(script)  # a broken script (SyntaxError) fails here
    # The same program as for a harmless name: the hostile text changed constants, never code.
    # ("x" sorts where the hostile texts do, in case a dict is written sorted.)
    assert code_shape(script) == code_shape(render_script(run_info("x"), trial_record("x")))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert "__import__" not in names and "system" not in attributes
    assert text not in (ast.get_docstring(tree) or "")
    constants = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)}
    assert {text, 123.456, 1.5, 32, 3} <= constants  # the facts are there, as data


@pytest.mark.parametrize("text", HOSTILE)
def test_a_task_autotune_does_not_train_is_refused(text):
    info = dataclasses.replace(run_info("x"), task=text)
    with pytest.raises(StudyError, match="not a task autotune trains"):
        render_script(info, trial_record("x"))


def test_values_that_are_no_python_literal_are_refused():
    record = trial_record("x")
    info = dataclasses.replace(run_info("x"), model_config={"layer_norm_eps": math.inf})
    with pytest.raises(StudyError, match="layer_norm_eps"):
        render_script(info, record)


def test_packing_is_exported_as_the_flattening_collator_its_trial_used():
    record = trial_record("x")
    params = {"attn_implementation": "flash_attention_2", "packing": True, "pad_to_multiple_of": 8}
    script = render_script(run_info("x"), dataclasses.replace(record, params=params))
    assigned = [n for n in ast.parse(script).body if isinstance(n, ast.Assign)]
    constants = {n.targets[0].id: n.value for n in assigned if isinstance(n.targets[0], ast.Name)}
    assert ast.literal_eval(constants["COLLATOR_KWARGS"]) == {
        "packing": True,
        "pad_to_multiple_of": 8,
    }
    # your_data() picks the collator by it: the flattening one, never padding kwargs it lacks.
    body = next(
        n
        for n in ast.parse(script).body
        if isinstance(n, ast.FunctionDef) and n.name == "your_data"
    )
    source = ast.get_source_segment(script, body)
    assert 'if COLLATOR_KWARGS.get("packing"):' in source
    assert "transformers.DataCollatorWithFlattening()" in source
