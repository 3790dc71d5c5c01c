"""code.gen / code.debug: determinism, splits, and conformance of every generated task.

Conformance runs candidates in the real sandbox against each task's hidden tests (the task's
own expected values, compared here): the reference passes; ``pass``, ``return None``, a
constant and a lookup table of the visible examples fail.
"""

from __future__ import annotations

import ast
import re

import pytest

from rlvr.sandbox import Job, Limits, Sandbox, choose, plaindata
from rlvr.tasks import check_disjoint, generate_tasks
from rlvr.tasks.base import DOMAINS as REGISTRY
from rlvr.tasks.base import seeded_rng
from rlvr.tasks.code_funcs import LEVELS, mutate, sample_func

DOMAINS = ("code.gen", "code.debug")


def code_of(reference: str) -> str:
    return reference.split("```python\n", 1)[1].rsplit("```", 1)[0]


def visible_cases(task) -> dict[str, object]:
    """repr(args) -> output for every example the prompt shows."""
    text, name = task.prompt[0]["content"], task.spec.payload["entry_point"]
    cases = {}
    for call, out in re.findall(rf"^{name}\((.*)\) == (.*)$", text, re.MULTILINE):
        cases[repr(tuple(ast.literal_eval(f"({call},)")))] = ast.literal_eval(out)
    for call, out in re.findall(rf"{name}\((.*)\) returned .*, expected (.*)\. Fix it\.", text):
        cases[repr(tuple(ast.literal_eval(f"({call},)")))] = ast.literal_eval(out)
    return cases


def hacks(task) -> dict[str, str]:
    name = task.spec.payload["entry_point"]
    table = visible_cases(task)
    assert table, "every code task shows at least one example"
    first = next(iter(table.values()))
    out = {
        "pass": f"def {name}(*args):\n    pass\n",
        "none": f"def {name}(*args):\n    return None\n",
        "constant": f"def {name}(*args):\n    return {first!r}\n",
        "lookup": f"TABLE = {table!r}\ndef {name}(*args):\n    return TABLE.get(repr(args), {first!r})\n",
    }
    if task.domain == "code.debug":  # handing back the buggy function unchanged
        out["unchanged"] = task.prompt[0]["content"].split("```python\n", 1)[1].split("```", 1)[0]
    return out


@pytest.mark.parametrize("domain", DOMAINS)
def test_generation_is_deterministic_versioned_and_split(domain):
    a = generate_tasks(domain, "train", 40, seed=3)
    b = generate_tasks(domain, "train", 40, seed=3)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in b]
    assert all(t.id.startswith(f"{domain}/{REGISTRY.get(domain).version}/train/") for t in a)
    assert {t.level for t in a} == {1, 2, 3, 4}
    ev = generate_tasks(domain, "eval", 40, seed=3)
    check_disjoint(generate_tasks(domain, "train", 400, seed=3), ev)
    for t in a + ev:
        p = t.spec.payload
        assert t.spec.kind == "code" and p["entry_point"] in t.reference
        assert len(plaindata.decode(p["inputs"])) == len(plaindata.decode(p["expected"])) == 8


def test_code_debug_training_never_shows_an_eval_code_gen_solution():
    # A code.debug reference is the correct function: a code.gen solution. Train tasks reveal only
    # train code.gen keys, and the disjointness check sees a task that would reveal an eval one.
    from rlvr.tasks.base import overlap, split_of
    from rlvr.types import Task

    train = generate_tasks("code.debug", "train", 300, seed=0)
    assert all(d == "code.gen" and split_of(d, k) == "train" for t in train for d, k in t.reveals)
    gen_eval = generate_tasks("code.gen", "eval", 300, seed=0)
    assert overlap(train, gen_eval) == []
    domain, rng = REGISTRY.get("code.debug"), seeded_rng("leak")
    eval_keys = {t.key for t in gen_eval}
    for _ in range(5000):  # drawn without the split rule: some fix is an eval code.gen solution
        p = domain.sample(1, rng)
        if p.reveals[0][1] in eval_keys:
            break
    else:
        raise AssertionError("no code.debug problem revealing an eval code.gen key was found")
    leaky = Task(id="code.debug/v2/train/1/999999", domain="code.debug", level=1,
                 prompt=({"role": "user", "content": p.prompt},), spec=p.spec, key=p.key,
                 reference=p.reference, reveals=p.reveals)
    assert overlap(train + [leaky], gen_eval) == [p.reveals[0]]
    with pytest.raises(ValueError, match="in both train and eval"):
        check_disjoint([leaky], gen_eval)


def test_prompts_are_pinned():
    # Bump the domain version when a generator change alters tasks.
    t = generate_tasks("code.gen", "train", 1, seed=0)[0]
    assert t.prompt[0]["content"].startswith("Write a Python function ")
    assert t.reference.startswith("```python\ndef ")
    assert generate_tasks("code.gen", "train", 1, seed=0)[0].key == t.key


def test_hidden_inputs_differ_from_the_visible_examples():
    for t in generate_tasks("code.gen", "train", 60, seed=1):
        hidden = {repr(tuple(a)) for a in plaindata.decode(t.spec.payload["inputs"])}
        assert not hidden & set(visible_cases(t))


def test_debug_shows_a_real_failing_case():
    for level in LEVELS:
        for i in range(20):
            rng = seeded_rng("debug-test", level, i)
            func = sample_func(level, rng)
            buggy = mutate(func, rng)
            if buggy is None:
                continue
            assert buggy.body != func.body
            assert any(buggy.fn(*a) != func.fn(*a) for a in func.inputs(rng, 30))
    for t in generate_tasks("code.debug", "train", 40, seed=2):
        ((_, want),) = visible_cases(t).items()
        shown = t.prompt[0]["content"]
        assert "returned" in shown and f"expected {want!r}" in shown


@pytest.fixture(scope="module")
def sb():
    if not choose("auto").strict:
        pytest.skip("no strict sandbox backend here")
    with Sandbox(workers=2) as box:
        yield box


@pytest.mark.parametrize("domain", DOMAINS)
@pytest.mark.parametrize("seed", [0, 7])
def test_conformance_reference_passes_and_hacks_fail(sb, domain, seed):
    tasks = generate_tasks(domain, "train", 12, seed=seed) + generate_tasks(domain, "eval", 12, seed=seed)
    jobs, labels = [], []
    for t in tasks:
        p = t.spec.payload
        inputs = plaindata.decode(p["inputs"])
        for label, program in {"reference": code_of(t.reference), **hacks(t)}.items():
            jobs.append(Job.io(program, p["entry_point"], inputs, limits=Limits(wall_s=5)))
            labels.append((t, label))
    for (t, label), r in zip(labels, sb.map(jobs)):
        expected = plaindata.decode(t.spec.payload["expected"])
        right = r.compare(expected)
        if label == "reference":
            assert right == len(expected), (t.id, r.outputs, r.stderr)
        else:
            assert right < len(expected), (t.id, label)
