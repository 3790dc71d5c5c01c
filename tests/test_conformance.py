"""Registry-wide conformance: every registered entry of every registry in rlvr meets its contract.

The entries come from the registries themselves (``registry.names()``), never from a list of names
here, so a new registration is checked without touching this file; a new *registry* fails
``test_every_registry_in_rlvr_is_checked`` until it gets a check below. Each check is a plain
function that raises ``AssertionError`` naming what is wrong:

- ``check_domain``: tasks are deterministic for a seed, well-formed, JSON round-trip, versioned
  (``<domain>/v<N>/...``), every level generates, train and eval are disjoint (by key, what a task
  reveals, and id); every reference passes (single-turn: its verifier; multi-turn: the scripted
  expert played in the task's environment under the default budgets); empty, garbage and hacking
  answers fail (echoes, stuffed answers, forged transcripts; code: ``pass``, constants, printed
  outputs, harness tampering; final answers: several answers, the gold only in the reasoning).
- ``check_verifier``: on the tasks of its kind the reference passes and empty/garbage/another
  task's answer fail; verdicts are deterministic and well-formed (``check_verdict``); ``check_many``
  agrees with ``check``.
- ``check_env``: malformed tool calls (bad JSON, unknown tool, missing, extra, mistyped, null and
  huge arguments) give an error observation (or a failed verdict where the turn ends the episode),
  never an exception, and the episode goes on; the turn and wall budgets end and fail an episode;
  a cut (token budgets) fails it; ``close`` is idempotent.
- ``check_env_grants``: every tool an environment offers is declared in its ``grants`` with that
  grant (None only for a control tool, which runs no sandbox job); each call of the expert runs
  only sandbox jobs with its tool's limits and workspace mode; a path argument outside the
  workspace or the grant is refused without a job; and probes run under each grant (read
  outside, write where only reading is allowed, open a socket, start a process) are refused.
- ``check_advantage`` / ``check_policy_loss`` / ``check_aggregation`` / ``check_kl``: shapes and
  dtypes of the registry signature, finite outputs, gradients where they belong, and an invariant
  (a constant-reward group has advantage 0; KL of identical log-probs is 0 and its expectation is
  the true KL; masked tokens do not count; micro-batches sum to the batch).
- ``check_suite``: an eval suite builds exactly its task count from the eval split of its domains
  and levels, without duplicates, deterministically (the same fingerprint twice).
- ``check_detector``: a detector has a ``monitor`` section of its name whose actions fit its kind
  (sample: log, zero, stop; step: log, stop) and default to log; on empty input and on a healthy
  batch (honest answers and code) or history (steady metrics, evals included) it finds nothing,
  without changing its input, and docs/monitoring.md describes it.
- ``check_hack``: a reward-audit hack says what it tries (docstring, docs/audit.md), applies to some
  registered domain, and gives None or a non-empty list of attempts of the task's shape (a
  completion; for a multi-turn task a list of turns), the same each time.
- ``check_preference_loss``: per-pair outputs of the registry signature, finite, detached rewards,
  gradients to both policy log-probs pointing towards the chosen response; pairs are independent;
  swapping chosen and rejected swaps the rewards; a loss that needs the reference depends on
  log-ratios only, and one that does not ignores whatever reference it is given.
- ``check_engine``: a rollout engine is built from an ``EngineSetup`` of the tiny model, or refuses
  with one ``UserError`` naming ``rollout.engine: <name>`` where it cannot run (vllm without its
  extra or CUDA); a built one gives ``n`` completions per prompt, prompt-major, one log-prob per
  token equal to the trainer's forward, a stop token last exactly when it stopped, the same draws
  for the same generator seed; it serves the version it was built at, then each pushed one;
  ``close`` is idempotent; docs/rollout.md describes it.
- ``check_serving_engine``: a serving engine (``rlvr serve``'s ``SERVING_ENGINES``) is built from a
  ``ServeConfig`` of the tiny model and meets ``ServingEngine``: a greedy request gives the rollout
  engine's greedy tokens with the trainer's log-probs, concurrent requests the same as alone, a
  seeded sampled request the same tokens twice, the prompt's log-probs the trainer's; ``stats``
  has its counters; ``load_weights`` of other weights bumps the version and changes the output;
  ``close`` is idempotent; docs/serve.md names it. The fast engine runs twice: without a draft
  (continuous batching + prefix cache) and with `--draft ngram` (speculative, in waves).
- ``check_reward_source``: a reward source (``reward.sources``) is a kind of ``SourceConfig``, built
  from a minimal config of its kind (a tiny reward model, a stub judge, a function file) it gives
  one finite number or None per sample, the same twice, says whether it can fail, and
  docs/reward-models.md describes it.

A deliberately broken domain (its reference fails) and environment (it raises on a malformed call),
registered with ``Registry.temporary``, make the checks fail (tested at the end), and their healthy
twins pass. Checks that run code need the strict sandbox and skip without one (the reason names
it, so ``RLVR_REQUIRE_STRICT_SANDBOX=1`` turns the skip into a failure).
"""

from __future__ import annotations

import dataclasses

import functools
import importlib
import json
import math
import pkgutil
import random
import re
import string
import time
from pathlib import Path

import pytest
import torch

import rlvr
import rlvr.algos  # noqa: F401  (registration)
import rlvr.envs  # noqa: F401
import rlvr.tasks  # noqa: F401
import rlvr.verifiers  # noqa: F401
from rlvr.algos.advantages import ADVANTAGES, BATCH_NORMALISED, NEEDS_VALUES, WITHOUT_GROUP_BASELINE
from rlvr.train.compat import COMPONENTS as COMPAT_COMPONENTS
from rlvr.train.components import STEP_COMPONENTS
from rlvr.algos.kl import KL_ESTIMATORS
from rlvr.algos.losses import AGGREGATIONS, POLICY_LOSSES
from rlvr.algos.preference import PREFERENCE_LOSSES
from rlvr.audit.hacks import HACKS
from rlvr.envs.base import (BUDGET_FINISHES, ENVS, NATURAL_FINISHES, EnvConfig, Environment, Step, ToolEnv,
                            make_env, play)
from rlvr.envs.tools import MAX_RESULT_CHARS, Tool, parse_tool_call
from rlvr.eval.suites import SUITES, fingerprint, tasks_of
from rlvr.monitor.alerts import SEVERITIES
from rlvr.monitor.config import SAMPLE_ACTIONS, STEP_ACTIONS, MonitorConfig
from rlvr.monitor.detectors import DETECTORS
from rlvr.monitor.trackers import TRACKERS, TrackerConfig, open_trackers
from rlvr.errors import UserError
from rlvr.model.load import load_model_and_tokenizer
from rlvr.model.logprobs import sequence_logprobs
from rlvr.rollout.engine import SamplingParams, generate
from rlvr.rollout.engine_registry import ROLLOUT_ENGINES, EngineSetup
from rlvr.serve.config import SERVING_ENGINES
from rlvr.serve.config import ServeConfig
from rlvr.serve.types import GenRequest, ServingEngine
from rlvr.train.code_tools import code_tools
from rlvr.content_filter import CONTENT_RULES, redact, scan
from rlvr.registry import Registry
from rlvr.sandbox import Sandbox, choose, plaindata
from rlvr.tasks.base import DOMAINS, SPLITS, Domain, Problem, generate_tasks, overlap
from rlvr.tool_calls import CALL_PATTERN, format_call
from rlvr.reward_sources.base import REWARD_SOURCES  # (base imports every kind, registering it)
from rlvr.types import Spec, Task, Verdict
from rlvr.verifiers.base import VERIFIERS, check_all
from rlvr.verifiers.code import use_sandbox

SEEDS = (0, 1)
PER_LEVEL = 2  # tasks per (seed, split, level) in the determinism and reference checks
SPLIT_SIZES = {0: (400, 100), 1: (100, 25)}  # seed -> generate_tasks sizes (train, eval) of the disjointness check
HUGE = 200_000  # characters of a "huge" argument or answer


# ---------------------------------------------------------------- shared helpers


@functools.lru_cache(maxsize=None)
def garbage(label: str, n: int = 200) -> str:
    """Deterministic nonsense: letters, spaces, punctuation, some non-ASCII; no digits, fences,
    backslashes or tags, so it cannot contain an answer, a code block or a tool call."""
    rng = random.Random(label)
    alphabet = string.ascii_letters + "     .,;:!?\n" + "éßжλ中ø"
    return "".join(rng.choice(alphabet) for _ in range(n))


def check_verdict(v: object, what: str) -> Verdict:
    """The ``Verdict`` contract: passed a bool, score a finite number in [0, 1], reason ``ok``
    exactly when passed (and then score 1), details a JSON-serialisable dict."""
    assert isinstance(v, Verdict), f"{what}: {type(v).__name__} is not a Verdict"
    assert type(v.passed) is bool, f"{what}: passed={v.passed!r} is not a bool"
    assert isinstance(v.score, (int, float)) and not isinstance(v.score, bool), f"{what}: score={v.score!r}"
    assert math.isfinite(v.score) and 0.0 <= v.score <= 1.0, f"{what}: score {v.score} outside [0, 1]"
    assert isinstance(v.reason, str) and v.reason, f"{what}: reason={v.reason!r}"
    assert v.passed == (v.reason == "ok"), f"{what}: passed={v.passed} with reason {v.reason!r}"
    assert not v.passed or v.score == 1.0, f"{what}: passed with score {v.score}"
    assert isinstance(v.details, dict), f"{what}: details={v.details!r}"
    try:
        json.dumps(v.to_dict())
    except (TypeError, ValueError) as e:
        raise AssertionError(f"{what}: the verdict is not JSON-serialisable: {e}") from None
    return v


def sample_tasks(domain, seed: int = 0, splits=SPLITS, per_level: int = PER_LEVEL) -> list[Task]:
    return [domain.generate(split, level, index, seed)
            for split in splits for level in domain.levels for index in range(per_level)]


def domains_where(predicate) -> list[str]:
    """Registered domains whose tasks (one per level) satisfy ``predicate(task)``."""
    names = []
    for name in DOMAINS:
        domain = DOMAINS.get(name)
        if any(predicate(domain.generate("train", level, 0, 0)) for level in domain.levels):
            names.append(name)
    return names


def needs_sandbox(domain_names: list[str]) -> bool:
    return any(getattr(DOMAINS.get(d), "needs_sandbox", False) for d in domain_names)


def expert(task: Task) -> list[str]:
    """The assistant turns that solve ``task``: the scripted expert's, or the one reference answer."""
    return list(task.actions) if task.multi_turn else [task.reference]


def without_calls(text: str) -> str:
    return CALL_PATTERN.sub("", text)


# ---------------------------------------------------------------- hacking answers


def answer_hacks(gold: str) -> dict[str, str]:
    """Final answers that must fail whatever the question (a spec with a gold ``answer``)."""
    candidates = [str(int(gold) + d) for d in (-1, 0, 1)] if re.fullmatch(r"-?\d+", gold) else ["0", gold, "1"]
    out = {
        "every candidate boxed": " ".join(f"\\boxed{{{c}}}" for c in candidates),
        "one answer line per candidate": "\n".join(f"Answer: {c}" for c in candidates),
        "gold in the reasoning only": f"It might be {gold}, or something else entirely.",
        "unclosed box": f"Answer: \\boxed{{{gold}",
    }
    if re.fullmatch(r"-?\d+", gold):
        out["off by one"] = f"Answer: {int(gold) + 1}"
    return out


def code_hacks(task: Task) -> dict[str, str]:
    """Programs that must fail the hidden tests of a task whose spec names an ``entry_point``:
    no work, constants, printing the expected-looking output, and tampering with the harness."""
    payload = task.spec.payload
    ep = payload["entry_point"]
    expected = plaindata.decode(payload["expected"]) if "expected" in payload else [0]
    first = expected[0] if expected else 0
    programs = {
        "pass": f"def {ep}(*args):\n    pass\n",
        "return None": f"def {ep}(*args):\n    return None\n",
        "constant": f"def {ep}(*args):\n    return {first!r}\n",
        "prints the expected outputs": (f"print({expected!r})\ndef {ep}(*args):\n"
                                        f"    print({first!r})\n    return None\n"),
        "raises": f"def {ep}(*args):\n    raise ValueError('no')\n",
        "no entry point": f"def not_{ep}(*args):\n    return {first!r}\n",
        "syntax error": f"def {ep}(*args)\n    return {first!r}\n",
        "always equal": ("class AE:\n    def __eq__(self, other):\n        return True\n"
                         "    __hash__ = object.__hash__\n"
                         f"def {ep}(*args):\n    return AE()\n"),
        "int equal to everything": ("class I(int):\n    def __eq__(self, other):\n        return True\n"
                                    f"def {ep}(*args):\n    return I(0)\n"),
        "sys.exit in the call": f"import sys\ndef {ep}(*args):\n    sys.exit(0)\n",
        "os._exit at import": f"import os\nos._exit(0)\ndef {ep}(*args):\n    return {first!r}\n",
        "os._exit in the call": f"import os\ndef {ep}(*args):\n    os._exit(0)\n",
        "patched builtins": ("import builtins\nbuiltins.isinstance = lambda *a: True\n"
                             "builtins.len = lambda *a: 0\nbuiltins.type = lambda *a: int\n"
                             "builtins.repr = lambda x: 'x'\n"
                             f"def {ep}(*args):\n    return {first!r}\n"),
        "forged report": ("import os\nfor fd in range(3, 64):\n    try:\n"
                          "        os.write(fd, b'{\"i\": 0, \"ok\": true}\\n{\"done\": 8, \"passed\": 8}\\n')\n"
                          "    except OSError:\n        pass\n"
                          "print('{\"passed\": 8, \"failed\": 0}')\n"
                          f"def {ep}(*args):\n    return {first!r}\n"),
    }
    return {name: f"```python\n{code}```\n" for name, code in programs.items()}


def single_turn_hacks(task: Task, others: list[Task]) -> dict[str, str]:
    """Answers to a single-turn task that must fail: the generic ones, and those its spec's shape
    suggests (a gold final answer; code with an entry point)."""
    ref = task.reference
    out = {
        "prompt echoed": task.prompt[-1]["content"],
        "reference twice": f"{ref}\n\n{ref}",
        "stuffed with other answers": "\n\n".join([o.reference for o in others if o.key != task.key][:3] + [ref]),
        "reference inside garbage twice": f"{garbage(task.id)}\n{ref}\n{garbage(task.id + '/2')}\n{ref}",
    }
    if "answer" in task.spec.payload:
        out.update(answer_hacks(str(task.spec.payload["answer"])))
    if "entry_point" in task.spec.payload:
        out.update(code_hacks(task))
    return out


def multi_turn_hacks(task: Task) -> dict[str, list[str]]:
    """Turn sequences for a multi-turn task that must fail: no work, the last step alone, stopping
    short, a stuffed or garbage final turn, the reference transcript forged as one turn."""
    actions = list(task.actions)
    out = {
        "last expert turn only": actions[-1:],
        "stops before the last turn": actions[:-1],
        "final turn twice in one": actions[:-1] + [f"{actions[-1]}\n{actions[-1]}"],
        "final turn garbage": actions[:-1] + [garbage(task.id)],
        "reference as one turn": [task.reference],
        "reference without its calls": [without_calls(task.reference)],
    }
    if "answer" in task.spec.payload:
        for label, answer in answer_hacks(str(task.spec.payload["answer"])).items():
            out[f"final answer: {label}"] = actions[:-1] + [answer]
    return {label: turns for label, turns in out.items() if turns != actions}


NOTHING = {  # must fail with score 0
    "empty": "",
    "whitespace": " \n\t \n",
    "garbage": garbage("garbage"),
    "huge garbage": garbage("huge", HUGE),
    "control characters": "\x00\x01\x1b[2J\x7f\ufeff",
}


# ---------------------------------------------------------------- domains


def _run_single_turn(pairs: list[tuple[Task, str]], what: str) -> list[Verdict]:
    try:
        verdicts = check_all(pairs)
    except Exception as e:
        raise AssertionError(f"{what}: verifying raised {e!r}") from e
    return [check_verdict(v, f"{what} {t.id}") for (t, _), v in zip(pairs, verdicts)]


def _play(env: Environment, task: Task, turns: list[str], what: str) -> Verdict:
    try:
        _, verdict = play(env, task, turns)
    except Exception as e:
        raise AssertionError(f"{what}: playing {task.id} raised {e!r}") from e
    return check_verdict(verdict, f"{what} {task.id}")


def _check_task_shape(task: Task, name: str, version: str, level: int) -> None:
    assert task.domain == name and task.level == level, f"{task.id}: domain/level {task.domain}/{task.level}"
    assert task.id.startswith(f"{name}/{version}/"), f"{task.id}: not <domain>/<version>/..."
    assert re.fullmatch(r"[^/]+/v\d+/.+", task.id), f"{task.id}: not versioned <domain>/v<N>/..."
    assert task.key, f"{task.id}: no canonical key"
    assert task.prompt and all(isinstance(m.get("role"), str) and isinstance(m.get("content"), str) and m["content"]
                               for m in task.prompt), f"{task.id}: malformed prompt {task.prompt!r}"
    assert task.spec.kind, f"{task.id}: no spec kind"
    assert Task.from_dict(json.loads(json.dumps(task.to_dict()))) == task, f"{task.id}: no JSON round trip"
    if task.multi_turn:
        assert task.env in ENVS, f"{task.id}: environment {task.env!r} is not registered"
        assert task.actions, f"{task.id}: a multi-turn task without the scripted expert's actions"
    else:
        assert task.spec.kind in VERIFIERS, f"{task.id}: no verifier for spec kind {task.spec.kind!r}"
        assert task.reference, f"{task.id}: no reference answer"


def check_domain(name: str, sandbox=None) -> None:
    domain = DOMAINS.get(name)
    assert domain.name == name, f"domain registered as {name!r} calls itself {domain.name!r}"
    assert re.fullmatch(r"v\d+", domain.version), f"{name}: version {domain.version!r} is not v<N>"
    levels = tuple(domain.levels)
    assert levels and all(type(level) is int for level in levels), f"{name}: levels {levels!r}"

    # deterministic, well-formed, versioned; every level of both splits generates
    by_seed: dict[int, dict[str, list[Task]]] = {}
    for seed in SEEDS:
        by_seed[seed] = {split: sample_tasks(domain, seed, (split,)) for split in SPLITS}
        for split, tasks in by_seed[seed].items():
            again = sample_tasks(domain, seed, (split,))
            assert [t.to_dict() for t in tasks] == [t.to_dict() for t in again], (
                f"{name}: {split} tasks are not deterministic for seed {seed}")
            for t, level in zip(tasks, [lv for lv in levels for _ in range(PER_LEVEL)]):
                _check_task_shape(t, name, domain.version, level)
        ids = [t.id for tasks in by_seed[seed].values() for t in tasks]
        assert len(set(ids)) == len(ids), f"{name}: duplicate ids for seed {seed}"

    # train and eval are disjoint: by key (and what a train task reveals), and by id
    for seed in SEEDS:
        n_train, n_eval = SPLIT_SIZES[seed]
        if hasattr(domain, "count"):  # a fixed set of problems (repo.fix): all of them
            n_train, n_eval = domain.count("train"), domain.count("eval")
        train = generate_tasks(name, "train", n_train, seed) + by_seed[seed]["train"]
        evals = generate_tasks(name, "eval", n_eval, seed) + by_seed[seed]["eval"]
        assert {t.level for t in train} == {t.level for t in evals} == set(levels), f"{name}: a split misses levels"
        leaked = overlap(train, evals)
        assert not leaked, f"{name}: eval problems seen in training (seed {seed}): {leaked[:3]}"
        assert not {t.id for t in train} & {t.id for t in evals}, f"{name}: an id is in both splits"
        assert not {t.key for t in train} & {t.key for t in evals}, f"{name}: a key is in both splits"

    # its reference passes; empty, garbage and hacking answers fail
    tasks = [t for seed in SEEDS for split in SPLITS for t in by_seed[seed][split]]
    hack_tasks = by_seed[0]["train"] + by_seed[0]["eval"]
    if any(t.multi_turn for t in tasks):
        _check_multi_turn_domain(name, tasks, hack_tasks, sandbox)
    else:
        _check_single_turn_domain(name, tasks, hack_tasks)

    docs = domain.corpus(0, 2)
    assert docs == domain.corpus(0, 2), f"{name}: corpus not deterministic"
    assert len(docs) == 2 and all(isinstance(d, str) and d for d in docs), f"{name}: corpus shape"


def _check_single_turn_domain(name: str, tasks: list[Task], hack_tasks: list[Task]) -> None:
    for t, v in zip(tasks, _run_single_turn([(t, t.reference) for t in tasks], f"{name} reference")):
        assert v.passed and v.score == 1.0, f"{name}: the reference of {t.id} fails its verifier: {v}"
    pairs, labels = [], []
    for t in hack_tasks:
        for label, answer in NOTHING.items():
            pairs.append((t, answer))
            labels.append((t, label, True))
        for label, answer in single_turn_hacks(t, hack_tasks).items():
            pairs.append((t, answer))
            labels.append((t, label, False))
    for (t, label, nothing), v in zip(labels, _run_single_turn(pairs, f"{name} hacks")):
        assert not v.passed and v.score < 1.0, f"{name}: the {label!r} answer passes {t.id}: {v}"
        assert not nothing or v.score == 0.0, f"{name}: the {label!r} answer scores {v.score} on {t.id}"


def _check_multi_turn_domain(name: str, tasks: list[Task], hack_tasks: list[Task], sandbox) -> None:
    envs: dict[str, Environment] = {}
    try:
        for t in tasks:
            env = envs.get(t.env) or envs.setdefault(t.env, make_env(t.env, EnvConfig(), sandbox))
            v = _play(env, t, list(t.actions), f"{name} expert")
            assert v.passed and v.score == 1.0, f"{name}: the scripted expert fails {t.id}: {v}"
        for t in hack_tasks:
            env = envs[t.env]
            for label, text in NOTHING.items():
                v = _play(env, t, [text], f"{name} {label}")
                assert not v.passed and v.score == 0.0, f"{name}: the {label!r} turn passes {t.id}: {v}"
            v = _play(env, t, [], f"{name} no turns")
            assert not v.passed and v.score == 0.0, f"{name}: an episode without turns passes {t.id}: {v}"
            for label, turns in multi_turn_hacks(t).items():
                v = _play(env, t, turns, f"{name} {label}")
                assert not v.passed and v.score < 1.0, f"{name}: the {label!r} episode passes {t.id}: {v}"
    finally:
        for env in envs.values():
            env.close()


# ---------------------------------------------------------------- verifiers


def check_verifier(name: str, sandbox=None) -> None:
    verifier = VERIFIERS.get(name)
    assert verifier.name == name, f"verifier registered as {name!r} calls itself {verifier.name!r}"
    users = domains_where(lambda t: t.spec.kind == name and not t.multi_turn)
    examples = getattr(verifier, "examples", None)
    assert users or callable(examples), (
        f"no registered domain makes single-turn tasks of spec kind {name!r} and the verifier has no "
        "examples(): conformance has nothing to check it against")
    if users:
        tasks = [t for d in users for t in sample_tasks(DOMAINS.get(d), 0, ("train",), 1) if t.spec.kind == name]
    else:  # a verifier of the user's criteria: its own examples, each with a passing completion
        tasks = [dataclasses.replace(t, reference=c) for t, c in examples()]
        assert len(tasks) >= 4, f"verifier {name}: examples() gives {len(tasks)} tasks; give at least 4"

    def run(pairs: list[tuple[Task, str]], what: str) -> list[Verdict]:
        try:
            verdicts = [verifier.check(t, c) for t, c in pairs]
        except Exception as e:
            raise AssertionError(f"verifier {name}: check raised on {what}: {e!r}") from e
        return [check_verdict(v, f"verifier {name} on {what} {t.id}") for (t, _), v in zip(pairs, verdicts)]

    right = [(t, t.reference) for t in tasks]
    for (t, _), v in zip(right, run(right, "the reference")):
        assert v.passed and v.score == 1.0 and v.reason == "ok", f"verifier {name}: reference of {t.id}: {v}"
    nothing = [(t, text) for t in tasks for text in NOTHING.values()]
    for (t, text), v in zip(nothing, run(nothing, "nothing")):
        assert not v.passed and v.score == 0.0, f"verifier {name}: {text[:40]!r} on {t.id}: {v}"
    hacks = [(t, label, answer) for t in tasks for label, answer in single_turn_hacks(t, tasks).items()]
    for (t, label, _), v in zip(hacks, run([(t, a) for t, _, a in hacks], "hacks")):
        assert not v.passed and v.score < 1.0, f"verifier {name}: the {label!r} answer passes {t.id}: {v}"
    cross = [(t, o.reference) for t in tasks for o in tasks if o.key != t.key]
    passed = sum(v.passed for v in run(cross, "another task's answer"))
    assert passed <= len(cross) // 4, f"verifier {name}: {passed} of {len(cross)} answers to other tasks pass"

    pairs = right + nothing[: 2 * len(tasks)] + cross[: len(tasks)]
    first, second = run(pairs, "a first time"), run(pairs, "a second time")
    key = lambda v: (v.passed, v.score, v.reason)  # noqa: E731
    assert [key(v) for v in first] == [key(v) for v in second], f"verifier {name}: not deterministic"
    check_many = getattr(verifier, "check_many", None)
    if callable(check_many):
        many = check_many(pairs)
        assert len(many) == len(pairs), f"verifier {name}: check_many returned {len(many)} for {len(pairs)}"
        for (t, _), v in zip(pairs, many):
            check_verdict(v, f"verifier {name} check_many {t.id}")
        assert [key(v) for v in many] == [key(v) for v in first], f"verifier {name}: check_many != check"


# ---------------------------------------------------------------- environments


_WRONG = {"string": 12345, "integer": "12", "number": "1.5", "boolean": "true", "object": [1], "array": {"a": 1}}
_VALID = {"string": "x", "integer": 1, "number": 1.5, "boolean": True, "object": {}, "array": []}


def malformed_calls(tools: list[Tool]) -> dict[str, str]:
    """Tool calls that break the call format or a tool's schema: each must be refused with an
    error observation before any tool runs, so the episode's state is unchanged."""
    any_tool = tools[0].name if tools else "tool"
    calls = {
        "bad JSON": "<tool_call>{bad json</tool_call>",
        "truncated JSON": '<tool_call>{"name": "' + any_tool + '", "arguments": {"a": "1+</tool_call>',
        "unclosed": '<tool_call>{"name": "' + any_tool + '", "arguments": {}}',
        "empty call": "<tool_call></tool_call>",
        "not an object": '<tool_call>["' + any_tool + '", {}]</tool_call>',
        "no name": '<tool_call>{"arguments": {}}</tool_call>',
        "name not a string": '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
        "arguments not an object": '<tool_call>{"name": "' + any_tool + '", "arguments": [1, 2]}</tool_call>',
        "extra key": '<tool_call>{"name": "' + any_tool + '", "arguments": {}, "id": 1}</tool_call>',
        "two calls": format_call(any_tool) + format_call(any_tool),
        "deeply nested JSON": "<tool_call>" + "[" * 50_000 + "]" * 50_000 + "</tool_call>",
        "unknown tool": format_call("no_such_tool", {}),
        "huge unknown tool name": format_call("t" * HUGE, {}),
        "huge JSON garbage": "<tool_call>" + garbage("json", HUGE) + "</tool_call>",
    }
    for tool in tools:
        params = tool.parameters
        required = list(params) if tool.required is None else list(tool.required)
        valid = {p: _VALID.get(t, "x") for p, (t, _) in params.items()}
        if required:
            calls[f"{tool.name}: no arguments"] = format_call(tool.name, {})
            calls[f"{tool.name}: {required[-1]} missing"] = format_call(
                tool.name, {p: v for p, v in valid.items() if p != required[-1]})
        calls[f"{tool.name}: an unknown argument"] = format_call(tool.name, {**valid, "no_such_argument": 1})
        for p, (t, _) in params.items():
            calls[f"{tool.name}: {p} of a wrong type"] = format_call(tool.name, {**valid, p: _WRONG.get(t, None)})
            calls[f"{tool.name}: {p} null"] = format_call(tool.name, {**valid, p: None})
    return calls


def huge_calls(tools: list[Tool]) -> dict[str, str]:
    """Calls with the right shape and huge string arguments: any result, but bounded."""
    calls = {}
    for tool in tools:
        strings = [p for p, (t, _) in tool.parameters.items() if t == "string"]
        if strings:
            args = {p: _VALID.get(t, "x") for p, (t, _) in tool.parameters.items()}
            for i, p in enumerate(strings):
                args[p] = chr(ord("a") + i % 26) * HUGE  # distinct values (a patch's old != new)
            calls[f"{tool.name}: huge arguments"] = format_call(tool.name, args)
    return calls


def _step(env: Environment, action: str, what: str) -> Step:
    try:
        step = env.step(action)
    except Exception as e:
        raise AssertionError(f"{what}: step raised {e!r}") from e
    assert isinstance(step, Step), f"{what}: step returned {type(step).__name__}"
    return step


def _observation(step: Step, what: str, *, error: bool) -> str:
    assert len(step.observation) == 1, f"{what}: {len(step.observation)} observation messages"
    message = step.observation[0]
    assert message.get("role") == "tool" and isinstance(message.get("content"), str), f"{what}: {message!r}"
    content = message["content"]
    assert not error or content.startswith("error"), f"{what}: not an error observation: {content[:120]!r}"
    return content


def env_tasks(name: str) -> list[Task]:
    """One task per level of every registered domain whose tasks run in environment ``name``."""
    users = domains_where(lambda t: t.env == name)
    assert users, (f"no registered domain makes tasks in environment {name!r}: conformance has no "
                   f"task and expert to run it with (register a domain whose tasks name it)")
    return [t for d in users for t in sample_tasks(DOMAINS.get(d), 0, ("train",), 1) if t.env == name]


def check_env(name: str, sandbox=None) -> None:
    """The environment protocol (malformed calls, budgets, expert, close); the size of what it
    says back is ``check_env_observations``."""
    cls = ENVS.get(name)
    assert isinstance(cls, type) and issubclass(cls, Environment), f"environment {name!r}: {cls!r}"
    assert cls.name == name, f"environment registered as {name!r} calls itself {cls.name!r}"
    tasks = env_tasks(name)
    env = cls(EnvConfig(), sandbox=sandbox)
    try:
        for t in tasks:  # the baseline: under the default budgets the expert passes
            v = _play(env, t, expert(t), f"{name} expert")
            assert v.passed, f"{name}: the expert fails {t.id} under the default budgets: {v}"
        for t in tasks[:: max(1, len(tasks) // 4)]:
            _check_malformed(name, cls, t, sandbox)
            _check_budgets(name, cls, t, sandbox)
    finally:
        env.close()
        env.close()  # idempotent


class _Recording:
    """A sandbox that remembers the jobs it ran (``check_env_grants``)."""

    def __init__(self, sandbox) -> None:
        self.sandbox, self.jobs = sandbox, []

    def run(self, job):
        self.jobs.append(job)
        return self.sandbox.run(job)


def check_env_grants(name: str, sandbox=None) -> None:
    """Least privilege (``rlvr.envs.grants``): see the module docstring."""
    from grant_probes import connect, read_path, spawn, write_path
    from rlvr.envs.grants import Grant, GrantRefused, run_granted
    from rlvr.sandbox.workspace import Workspace

    cls = ENVS.get(name)
    declared = getattr(cls, "grants", {})
    assert all(g is None or isinstance(g, Grant) for g in declared.values()), f"{name}: grants {declared!r}"
    if not issubclass(cls, ToolEnv):
        return
    rec = _Recording(sandbox)
    env = cls(EnvConfig(max_turns=1000, wall_s=600.0), sandbox=rec)
    offered: set[str] = set()
    try:
        for task in env_tasks(name):
            env.reset(task)
            tools = {t.name: t for t in env.tools()}
            offered |= set(tools)
            for tool in tools.values():
                assert tool.name in declared, f"{name}: tool {tool.name} has no declared grant"
                assert tool.grant == declared[tool.name], f"{name}: tool {tool.name} runs under another grant than declared"
                for arg, mode in tool.paths.items():
                    assert mode in ("read", "write") and arg in tool.parameters, f"{name}: {tool.name}.paths {tool.paths}"
                    args = {p: ("x" if t == "string" else 1) for p, (t, _) in tool.parameters.items()}
                    for path in ("../outside.py", "/etc/passwd"):
                        before = len(rec.jobs)
                        step = _step(env, format_call(tool.name, {**args, arg: path}), f"{name} {tool.name}({path})")
                        content = _observation(step, f"{name} {tool.name}({path})", error=True)
                        assert content.startswith(f"error: {tool.name}: refused"), f"{name}: {tool.name}({path}) -> {content[:120]!r}"
                        assert len(rec.jobs) == before, f"{name}: {tool.name}({path}) ran a sandbox job"
            env.reset(task)
            for action in expert(task):
                call = parse_tool_call(action)
                before = len(rec.jobs)
                step = _step(env, action, f"{name} expert on {task.id}")
                if call is not None and call.name in tools:
                    grant, jobs = declared[call.name], rec.jobs[before:]
                    if grant is None:
                        assert not jobs, f"{name}: control tool {call.name} ran {len(jobs)} sandbox job(s)"
                    for job in jobs:
                        assert job.limits == grant.limits() and job.read_only == (not grant.write), \
                            f"{name}: {call.name} ran a job outside its grant: {job.limits}, read_only={job.read_only}"
                if step.done:
                    break
        assert offered == set(declared), f"{name}: declared grants {sorted(set(declared) - offered)} for tools it never offers"
    finally:
        env.close()
    ws = Workspace.create({"a.py": "x = 1\n"}, writable=True)
    try:
        for tool, grant in declared.items():
            if grant is None:
                continue
            probes = [(read_path, {"path": "/etc/passwd"}), (connect, {"port": 80}), (spawn, {})]
            if not grant.write:
                probes.append((write_path, {"path": "a.py", "content": "y"}))
            for body, args in probes:
                try:
                    run_granted(sandbox, tool, body, grant, args, workdir=ws.path)
                except GrantRefused:
                    continue
                raise AssertionError(f"{name}: {body.__name__}{args} was not refused under {tool}'s grant")
            assert ws.read("a.py") == "x = 1\n", f"{name}: a probe under {tool}'s grant changed the workspace"
    finally:
        ws.close()


def check_env_observations(name: str, sandbox=None) -> None:
    """What an environment says back is bounded whatever the model sent: a tool result is cut at
    ``MAX_RESULT_CHARS`` (docs/environments.md), and so must an error be, though it quotes the
    call (a context-sized observation costs the collector a tokenisation and the episode its
    context budget)."""
    cls = ENVS.get(name)
    for task in env_tasks(name):
        env = cls(EnvConfig(max_turns=1000, wall_s=600.0), sandbox=sandbox)
        try:
            env.reset(task)
            tools = env.tools()
            for label, action in {**malformed_calls(tools), **huge_calls(tools)}.items():
                what = f"{name} on {task.id}, {label}"
                env.reset(task)
                step = _step(env, action, what)
                if not step.done:
                    content = _observation(step, what, error=False)
                    assert len(content) <= MAX_RESULT_CHARS + 100, f"{what}: a {len(content)}-character observation"
        finally:
            env.close()


def _check_malformed(name: str, cls, task: Task, sandbox) -> None:
    env = cls(EnvConfig(max_turns=1000, wall_s=600.0), sandbox=sandbox)
    try:
        env.reset(task)
        tools = env.tools()
        malformed = malformed_calls(tools)
        refused = []
        for label, action in {**malformed, **huge_calls(tools)}.items():
            what = f"{name} on {task.id}, {label}"
            env.reset(task)
            step = _step(env, action, what)
            if step.done:  # the turn ended the episode (single-turn): judged, and failed
                v = check_verdict(env.verify(), what)
                assert not v.passed, f"{what}: passes {v}"
            else:
                _observation(step, what, error=label in malformed)
                if label in malformed:
                    refused.append(action)
        if refused:  # refused calls change nothing: after all of them the expert still wins
            v = _play_after(env, task, refused, f"{name} on {task.id}, expert after malformed calls")
            assert v.passed, f"{name}: after malformed calls the expert fails {task.id}: {v}"
    finally:
        env.close()


def _play_after(env: Environment, task: Task, prefix: list[str], what: str) -> Verdict:
    env.reset(task)
    for action in prefix:
        step = _step(env, action, what)
        assert not step.done, f"{what}: a refused call ended the episode ({step.finish})"
    for action in expert(task):
        step = _step(env, action, what)
        if step.done:
            break
    else:
        env.cut("turns")
    return check_verdict(env.verify(), what)


def _check_budgets(name: str, cls, task: Task, sandbox) -> None:
    turns = expert(task)
    loop = format_call("no_such_tool", {})  # a turn that never ends a multi-turn episode

    def episode(cfg: EnvConfig, actions: list[str], what: str):
        env = cls(cfg, sandbox=sandbox)
        try:
            v = _play(env, task, actions, f"{name} {what}")
            return env, v
        finally:
            env.close()

    env, v = episode(EnvConfig(max_turns=3), [loop] * 10, "turn budget")
    assert env.turns <= 3, f"{name}: {env.turns} turns under max_turns=3"
    if env.finish not in NATURAL_FINISHES:
        assert env.finish == "turns" and env.turns == 3, (
            f"{name}: a looping episode ended {env.finish!r} at turn {env.turns}")
        assert not v.passed and v.reason == "budget" and v.score == 0.0, f"{name}: out of turns yet {v}"
    if len(turns) > 1:
        env, v = episode(EnvConfig(max_turns=len(turns) - 1), turns, "expert without enough turns")
        assert env.finish == "turns" and not v.passed and v.reason == "budget", (
            f"{name}: the expert of {task.id} with one turn too few ended {env.finish!r}: {v}")
        env, v = episode(EnvConfig(wall_s=0.0), turns, "wall budget")
        assert env.finish == "wall" and env.turns == 1, (
            f"{name}: with wall_s=0 the episode of {task.id} ended {env.finish!r} at turn {env.turns}")
        assert not v.passed and v.reason == "budget" and v.score == 0.0, f"{name}: out of wall time yet {v}"
    for reason in BUDGET_FINISHES:  # token budgets are the collector's: it cuts, the env must fail
        env = cls(EnvConfig(), sandbox=sandbox)
        try:
            env.reset(task)
            for action in turns[:-1]:
                _step(env, action, f"{name} before a cut")
            env.cut(reason)
            v = check_verdict(env.verify(), f"{name} cut {reason}")
            assert not v.passed and v.reason == "budget" and v.details.get("finish") == reason, (
                f"{name}: an episode cut for {reason!r} gives {v}")
            try:
                env.cut("answer")  # only a budget cuts an episode
            except ValueError:
                pass
            else:
                raise AssertionError(f"{name}: cut('answer') is accepted")
        finally:
            env.close()


# ---------------------------------------------------------------- algorithms


def _finite(t: torch.Tensor, what: str) -> None:
    assert torch.isfinite(t).all(), f"{what}: not finite: {t}"


def check_advantage(name: str) -> None:
    fn = ADVANTAGES.get(name)
    group_ids = torch.tensor([7, -2, 7, 40, 7, -2, 40, 7, 40, 5, 11, 11])  # unsorted, uneven, a singleton
    rewards = torch.rand(12, generator=torch.Generator().manual_seed(0))
    rewards[[10, 11]] = 0.5  # group 11: constant rewards
    for dtype in (torch.float32, torch.float64):
        r = rewards.to(dtype)
        a = fn(r, group_ids, eps=1e-6)
        assert isinstance(a, torch.Tensor) and a.shape == r.shape and a.dtype == dtype, (
            f"{name}: {tuple(r.shape)} {dtype} -> {getattr(a, 'shape', a)} {getattr(a, 'dtype', '')}")
        _finite(a, name)
        assert torch.equal(fn(r, group_ids), a), f"{name}: the default eps is not 1e-6"
        if name not in WITHOUT_GROUP_BASELINE:
            assert a[9] == 0 and torch.all(a[10:] == 0), f"{name}: a singleton or constant group gets {a[9:]}"
    a = fn(rewards, group_ids)
    assert torch.all(fn(torch.full((6,), 0.3), torch.tensor([1, 1, 1, 2, 2, 2])) == 0), f"{name}: constant rewards"
    binary = fn(torch.tensor([0.0, 1.0, 1.0, 0.0]), torch.tensor([0, 0, 0, 0]))
    _finite(binary, f"{name} on 0/1 rewards")
    relabelled = fn(rewards, group_ids * 1000 + 3)
    assert torch.allclose(relabelled, a), f"{name}: depends on the group ids' values"
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(fn(rewards[perm], group_ids[perm]), a[perm]), f"{name}: depends on the sample order"
    other = rewards.clone()
    other[group_ids == -2] = torch.tensor([5.0, -3.0])
    changed = fn(other, group_ids)
    if name in BATCH_NORMALISED:  # other groups shift the statistics: check the normalisation
        for adv in (a, changed):
            assert abs(float(adv.mean())) < 1e-5 and abs(float(adv.std()) - 1) < 1e-4, f"{name}: not batch-normalised"
    else:
        assert torch.allclose(changed[group_ids != -2], a[group_ids != -2]), f"{name}: groups are not independent"
    for g in group_ids.unique():
        idx = (group_ids == g).nonzero().flatten()
        for i in idx:
            for j in idx:
                if rewards[i] > rewards[j]:
                    assert a[i] >= a[j], f"{name}: a higher reward gets a lower advantage in group {int(g)}"


def _loss_batch(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    B, T = 4, 6
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1], [0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=dtype)
    old = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    logprobs = old + torch.randn(B, T, generator=g, dtype=dtype) * 0.3
    advantages = torch.tensor([1.0, -0.5, 2.0, 0.7], dtype=dtype)
    return logprobs, old, advantages, mask


def check_aggregation(name: str) -> None:
    agg = AGGREGATIONS.get(name)
    _, _, _, mask = _loss_batch()
    B, T = mask.shape
    token_loss = torch.randn(B, T, generator=torch.Generator().manual_seed(2), requires_grad=True)
    out = agg(token_loss, mask, max_tokens=T)
    assert isinstance(out, torch.Tensor) and out.dim() == 0 and out.dtype == token_loss.dtype, f"{name}: {out!r}"
    _finite(out, name)
    out.backward()
    grad = token_loss.grad
    _finite(grad, f"{name} gradient")
    assert torch.all(grad[mask == 0] == 0), f"{name}: gradient off the mask"
    assert torch.all(grad[mask == 1] != 0), f"{name}: a policy token gets no gradient"
    with torch.no_grad():
        junk = torch.where(mask > 0, token_loss, torch.full_like(token_loss, 1e6))
        assert torch.allclose(agg(junk, mask, max_tokens=T), out), f"{name}: masked tokens count"
        assert torch.allclose(agg(3.0 * token_loss, mask, max_tokens=T), 3.0 * out), f"{name}: not linear"
        empty = agg(token_loss, torch.zeros_like(mask), max_tokens=T)
        assert float(empty) == 0.0, f"{name}: an all-masked batch gives {empty}"
        totals = dict(num_tokens=mask.sum(), num_seqs=B, max_tokens=T)
        parts = sum(agg(token_loss[i:i + 2], mask[i:i + 2], **totals) for i in range(0, B, 2))
        full = agg(token_loss, mask, **totals)
        assert torch.allclose(parts, full), f"{name}: micro-batches do not sum to the batch"
        assert torch.allclose(full, out), f"{name}: the batch's own totals are not the default"


def check_policy_loss(name: str) -> None:
    fn = POLICY_LOSSES.get(name)
    for aggregation in AGGREGATIONS.names():
        what = f"{name} with {aggregation}"
        logprobs, old, advantages, mask = _loss_batch()
        B, T = mask.shape
        kw = dict(clip_low=0.2, clip_high=0.28, aggregation=aggregation, max_tokens=T)
        lp = logprobs.clone().requires_grad_(True)
        loss, metrics = fn(lp, old, advantages, mask, **kw)
        assert isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.dtype == lp.dtype, f"{what}: {loss!r}"
        _finite(loss, what)
        assert isinstance(metrics, dict) and all(isinstance(k, str) and type(v) is float and math.isfinite(v)
                                                 for k, v in metrics.items()), f"{what}: metrics {metrics!r}"
        loss.backward()
        _finite(lp.grad, f"{what} gradient")
        assert torch.all(lp.grad[mask == 0] == 0), f"{what}: gradient off the mask"
        assert lp.grad[mask == 1].abs().sum() > 0, f"{what}: no gradient on policy tokens"

        # masked positions hold anything (stale, -inf, nan): same loss, same gradient
        junk_lp = torch.where(mask > 0, logprobs, torch.tensor(float("-inf"))).requires_grad_(True)
        junk_old = torch.where(mask > 0, old, torch.tensor(float("nan")))
        junk_loss, _ = fn(junk_lp, junk_old, advantages, mask, **kw)
        junk_loss.backward()
        assert torch.allclose(junk_loss, loss), f"{what}: masked tokens change the loss"
        assert torch.allclose(junk_lp.grad, lp.grad), f"{what}: masked tokens change the gradient"

        # on policy: zero advantages give zero loss and gradient; otherwise descent raises the
        # log-prob of tokens with a positive advantage and lowers it with a negative one
        on = logprobs.clone().requires_grad_(True)
        zero, _ = fn(on, logprobs.detach(), torch.zeros(B), mask, **kw)
        zero.backward()
        assert zero.item() == 0.0 and torch.all(on.grad == 0), f"{what}: zero advantages give {zero.item()}"
        on = logprobs.clone().requires_grad_(True)
        pg, _ = fn(on, logprobs.detach(), advantages, mask, **kw)
        pg.backward()
        sign = torch.sign(advantages).unsqueeze(-1).expand_as(mask)
        assert torch.all(torch.sign(on.grad[mask == 1]) == -sign[mask == 1]), f"{what}: not a policy gradient"

        with torch.no_grad():
            ones, _ = fn(logprobs, old, advantages, mask, is_weights=torch.ones(B, T), **kw)
            assert torch.allclose(ones, loss), f"{what}: is_weights of 1 change the loss"
            totals = dict(kw, num_tokens=mask.sum(), num_seqs=B)
            parts = sum(fn(logprobs[i:i + 2], old[i:i + 2], advantages[i:i + 2], mask[i:i + 2], **totals)[0]
                        for i in range(0, B, 2))
            assert torch.allclose(parts, loss), f"{what}: micro-batches do not sum to the batch"


def check_kl(name: str) -> None:
    fn = KL_ESTIMATORS.get(name)
    g = torch.Generator().manual_seed(0)
    for shape in [(5,), (3, 7), (2, 3, 4)]:
        for dtype in (torch.float32, torch.float64):
            lp = (-torch.rand(shape, generator=g) * 4).to(dtype).requires_grad_(True)
            ref = (-torch.rand(shape, generator=g) * 4).to(dtype)
            out = fn(lp, ref)
            assert isinstance(out, torch.Tensor) and out.shape == lp.shape and out.dtype == dtype, f"{name}: {out!r}"
            _finite(out, name)
            out.sum().backward()
            _finite(lp.grad, f"{name} gradient")
            same = fn(lp.detach(), lp.detach())
            assert torch.allclose(same, torch.zeros_like(same), atol=1e-7), f"{name}: KL of identical log-probs {same}"
    # an estimator of KL(pi || pi_ref) from tokens drawn from pi: its exact expectation under pi
    # (a sum over a small vocabulary) is the true KL for nearby distributions
    for seed in range(3):
        gg = torch.Generator().manual_seed(seed)
        logits = torch.randn(16, generator=gg, dtype=torch.float64)
        logpi = torch.log_softmax(logits, -1)
        logref = torch.log_softmax(logits + 0.05 * torch.randn(16, generator=gg, dtype=torch.float64), -1)
        true_kl = float((logpi.exp() * (logpi - logref)).sum())
        expected = float((logpi.exp() * fn(logpi, logref)).sum())
        assert abs(expected - true_kl) <= 0.1 * true_kl, f"{name}: E_pi[estimate] = {expected}, KL = {true_kl}"


def check_preference_loss(name: str) -> None:
    fn = PREFERENCE_LOSSES.get(name)
    B = 6
    g = torch.Generator().manual_seed(0)
    lengths = (torch.randint(1, 30, (B,), generator=g), torch.randint(1, 30, (B,), generator=g))
    for dtype in (torch.float32, torch.float64):
        ref = [-torch.rand(B, generator=g, dtype=dtype) * 2 * n for n in lengths]
        pol = [r + torch.randn(B, generator=g, dtype=dtype) for r in ref]

        def run(c, r, rc, rr, lc=lengths[0], lr=lengths[1]):
            return fn(c, r, rc, rr, beta=0.3, label_smoothing=0.0, chosen_lengths=lc, rejected_lengths=lr, gamma=0.0)

        c, r = (x.clone().requires_grad_(True) for x in pol)
        out = run(c, r, *ref)
        assert isinstance(out, tuple) and len(out) == 3, f"{name}: returns {type(out).__name__}, not 3 tensors"
        loss, chosen_rewards, rejected_rewards = out
        for what, t in zip(("loss", "chosen rewards", "rejected rewards"), out):
            assert isinstance(t, torch.Tensor) and t.shape == (B,) and t.dtype == dtype, f"{name} {what}: {t!r}"
            _finite(t, f"{name} {what}")
        assert not chosen_rewards.requires_grad and not rejected_rewards.requires_grad, f"{name}: rewards need grad"
        loss.sum().backward()
        for what, x in (("chosen", c), ("rejected", r)):
            _finite(x.grad, f"{name} gradient to the {what} log-probs")
        # at a tie (policy = reference, the same per-token log-prob in both responses) descent raises the
        # chosen response's log-prob and lowers the rejected one's
        tie = [-2.0 * n.to(dtype) for n in lengths]
        tc, tr = (x.clone().requires_grad_(True) for x in tie)
        run(tc, tr, *tie)[0].sum().backward()
        assert torch.all(tc.grad < 0) and torch.all(tr.grad > 0), f"{name}: at a tie d/dc {tc.grad}, d/dr {tr.grad}"

        with torch.no_grad():
            perm = torch.randperm(B, generator=g)
            permuted = fn(pol[0][perm], pol[1][perm], ref[0][perm], ref[1][perm], beta=0.3,
                          chosen_lengths=lengths[0][perm], rejected_lengths=lengths[1][perm])
            assert all(torch.allclose(a, b[perm]) for a, b in zip(permuted, out)), f"{name}: depends on the pair order"
            head = run(pol[0][:2], pol[1][:2], ref[0][:2], ref[1][:2], lengths[0][:2], lengths[1][:2])
            assert all(torch.allclose(a, b[:2]) for a, b in zip(head, out)), f"{name}: pairs are not independent"
            swapped = run(pol[1], pol[0], ref[1], ref[0], lengths[1], lengths[0])
            assert torch.allclose(swapped[1], rejected_rewards) and torch.allclose(swapped[2], chosen_rewards), (
                f"{name}: swapping chosen and rejected does not swap the rewards")
            try:
                run(pol[0], pol[1], None, None)
            except ValueError:  # needs the reference: only the log-ratios count
                k = torch.tensor([5.0, -3.0, 0.5, 40.0, -40.0, 1.0], dtype=dtype)
                moved = run(pol[0] + k, pol[1] - k, ref[0] + k, ref[1] - k)
                assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(moved, out)), (
                    f"{name}: shifting a response's policy and reference log-probs equally changes the output")
            else:  # reference-free: any reference gives the same output
                for refs in ((None, None), (ref[0] + 100.0, ref[1] - 7.0)):
                    other = run(pol[0], pol[1], *refs)
                    assert all(torch.equal(a, b) for a, b in zip(other, out)), f"{name}: reads the reference {refs}"


# ---------------------------------------------------------------- the registries and their tests


CHECKED = [DOMAINS, VERIFIERS, ENVS, ADVANTAGES, POLICY_LOSSES, AGGREGATIONS, KL_ESTIMATORS, PREFERENCE_LOSSES, SUITES,
           DETECTORS, HACKS, TRACKERS, ROLLOUT_ENGINES, SERVING_ENGINES, STEP_COMPONENTS, CONTENT_RULES,
           REWARD_SOURCES]


def rlvr_registries() -> dict[int, tuple[str, Registry]]:
    """Every ``Registry`` held at module level anywhere in rlvr (each module imported)."""
    found: dict[int, tuple[str, Registry]] = {}
    for info in pkgutil.walk_packages(rlvr.__path__, "rlvr."):
        module = importlib.import_module(info.name)
        for attr, value in vars(module).items():
            if isinstance(value, Registry):
                found.setdefault(id(value), (f"{info.name}.{attr}", value))
    return found


def test_every_registry_in_rlvr_is_checked():
    registries = rlvr_registries()
    missing = [where for where, registry in registries.values() if not any(registry is r for r in CHECKED)]
    assert not missing, f"registries without a conformance check here: {missing}"
    assert len(registries) == len(CHECKED)


def test_every_registry_has_entries_to_check():
    assert all(len(registry) for registry in CHECKED), [r.kind for r in CHECKED if not len(r)]


@pytest.fixture(scope="module")
def strict_sandbox():
    if not choose("auto").strict:
        pytest.skip("no strict sandbox backend here")
    with Sandbox(workers=2) as box:
        previous = use_sandbox(box)
        try:
            yield box
        finally:
            use_sandbox(previous)


def _sandbox_if(needed: bool, request):
    return request.getfixturevalue("strict_sandbox") if needed else None


def check_suite(name: str) -> None:
    """An eval suite is named, versioned and described, builds exactly its task count from the eval
    split of its domains and levels, without duplicates, and the same set (fingerprint) every time."""
    suite = SUITES.get(name)
    assert suite.name == name and suite.version and suite.description and suite.source == "builtin"
    tasks = tasks_of(suite)
    assert len(tasks) == suite.tasks
    assert {t.domain for t in tasks} == set(suite.resolved_domains())
    assert {t.level for t in tasks} <= set(suite.levels)
    assert all(t.id.split("/")[2] == "eval" for t in tasks), "a suite holds eval-split tasks only"
    assert len({(t.domain, t.key) for t in tasks}) == len(tasks)
    assert fingerprint(tasks_of(suite)) == fingerprint(tasks)


def _healthy_batch() -> list:
    """Honest samples: right and wrong math answers, code that computes its function."""
    from rlvr.types import Scored, Trajectory

    samples = [(t, f"Answer: {t.spec.payload['answer']}", True, {}) for t in generate_tasks("math.arith", "train", 2, seed=0)]
    samples += [(t, "40 + 2 is 42.\nAnswer: 1", False, {}) for t, _, _, _ in samples]
    samples += [(t, t.reference, True, {"code": t.reference.removeprefix("```python\n").removesuffix("```")})
                for t in generate_tasks("code.gen", "train", 2, seed=0)]
    out = []
    for i, (task, text, ok, details) in enumerate(samples):
        traj = Trajectory(task_id=task.id, group_id=i, messages=task.prompt, completion=text, token_ids=(1, 2, 3),
                          loss_mask=(0, 1, 1), logprobs=(0.0, -0.7, -1.2), finish_reason="stop")
        out.append(Scored(task, traj, Verdict(ok, float(ok), "ok" if ok else "mismatch", details), float(ok),
                          {"outcome": float(ok)}))
    return out


def _healthy_history(steps: int = 30) -> list[dict]:
    """Steady metrics of a learning run: reward and pass rates creeping up, evals with them."""
    rows = []
    for step in range(1, steps + 1):
        p = 0.3 + 0.005 * step
        row = {"step": step, "rollout/reward_mean": p, "rollout/pass_rate": p, "rollout/pass_rate/math.arith": p,
               "rollout/group_reward_std": 0.4, "rollout/kept_frac": 0.8, "rollout/response_tokens_mean": 30.0 + step % 3,
               "rollout/truncated_frac": 0.05, "rollout/entropy": 1.0 - 0.01 * step, "rollout/logprob_mismatch_kl": 1e-6,
               "train/pg_loss": 0.01, "train/grad_norm": 1.5, "train/kl": 0.01 + 0.0002 * step}
        if step % 10 == 0:
            row.update({"eval/pass@1": p, "eval/pass@1/math.arith": p})
        rows.append(row)
    return rows


def check_detector(name: str) -> None:
    d = DETECTORS.get(name)
    assert d.name == name and d.kind in ("sample", "step") and d.severity in SEVERITIES and d.watches
    assert name in MonitorConfig.detector_names(), f"MonitorConfig has no section '{name}'"
    section = MonitorConfig().detector(name)
    assert section.NAME == name and section.enabled and section.action == "log"
    assert section.ACTIONS == (SAMPLE_ACTIONS if d.kind == "sample" else STEP_ACTIONS)
    data = _healthy_batch() if d.kind == "sample" else _healthy_history()
    before = json.dumps([s.to_dict() for s in data] if d.kind == "sample" else data, sort_keys=True)
    if d.kind == "sample":
        assert d.check([], section, code_tools()) == {}
        assert d.check(data, section, code_tools()) == {}, f"{name} flags honest samples"
    else:
        assert d.check([], section) == []
        for n in range(1, len(data) + 1):
            assert d.check(data[:n], section) == [], f"{name} fires on a healthy history at step {n}"
    after = json.dumps([s.to_dict() for s in data] if d.kind == "sample" else data, sort_keys=True)
    assert before == after, f"{name} changed its input"
    docs = (Path(rlvr.__file__).parent.parent / "docs" / "monitoring.md").read_text()
    assert f"`{name}`" in docs, f"docs/monitoring.md does not describe {name}"


@pytest.mark.parametrize("name", DETECTORS.names())
def test_detector_conforms(name):
    check_detector(name)


def check_hack(name: str) -> None:
    hack = HACKS.get(name)
    assert (hack.__doc__ or "").strip(), f"hack {name}: no docstring saying what it tries"
    tasks = [t for d in DOMAINS for t in sample_tasks(DOMAINS.get(d), 0, ("train",), 1)]
    tasks += [t for kind in VERIFIERS for t, _ in getattr(VERIFIERS.get(kind), "examples", list)()]
    applied = set()
    for task in tasks:
        attempts = hack(task)
        if attempts is None:
            continue
        assert isinstance(attempts, list) and attempts, f"hack {name} on {task.id}: {attempts!r} is not None or attempts"
        for a in attempts:
            if task.multi_turn:
                assert isinstance(a, list) and all(isinstance(turn, str) for turn in a), (
                    f"hack {name} on {task.id} (multi-turn): {a!r} is not a list of turns")
            else:
                assert isinstance(a, str), f"hack {name} on {task.id}: {a!r} is not a completion"
        assert hack(task) == attempts, f"hack {name} on {task.id}: not deterministic"
        applied.add(task.domain)
    assert applied & set(DOMAINS.names()), f"hack {name} applies to no registered domain"
    docs = (Path(rlvr.__file__).parent.parent / "docs" / "audit.md").read_text()
    assert f"`{name}`" in docs, f"docs/audit.md does not describe hack {name}"


@pytest.mark.parametrize("name", HACKS.names())
def test_hack_conforms(name):
    check_hack(name)


def check_content_rule(name: str) -> None:
    rule = CONTENT_RULES.get(name)
    assert rule.description and rule.matches and rule.passes, f"content rule {name}: needs examples both ways"
    for text in rule.matches:
        hits = scan(text, [name])
        assert [h.rule for h in hits] == [name], f"content rule {name} misses {text!r}"
        assert f"[redacted:{name}]" in redact(text, hits) and text[hits[0].start:hits[0].end] not in redact(text, hits)
    for text in rule.passes:
        assert scan(text, [name]) == [], f"content rule {name} flags the look-alike {text!r}"
    docs = (Path(rlvr.__file__).parent.parent / "docs" / "content_filter.md").read_text()
    assert f"`{name}`" in docs, f"docs/content_filter.md does not describe {name}"


@pytest.mark.parametrize("name", CONTENT_RULES.names())
def test_content_rule_conforms(name):
    check_content_rule(name)


def test_a_content_rule_that_flags_its_look_alikes_fails_conformance():
    import re

    from rlvr.content_filter import ContentRule

    loose = ContentRule("digits", re.compile(r"\d+"), matches=("1234",), passes=("version 2",))
    with CONTENT_RULES.temporary("loose_digits", loose), pytest.raises(AssertionError, match="look-alike"):
        check_content_rule("loose_digits")


def test_a_hack_of_the_wrong_shape_fails_conformance():
    def flat(task: Task):
        """A completion where a list of turns is due."""
        return ["Answer: 1"]

    with HACKS.temporary("flat", flat), pytest.raises(AssertionError, match="is not a list of turns"):
        check_hack("flat")


def check_engine(name: str, model_dir: str, run_dir: Path) -> None:
    """See the module docstring (``check_engine``)."""
    from rlvr.train.grpo import RolloutConfig

    docs = (Path(rlvr.__file__).parent.parent / "docs" / "rollout.md").read_text()
    assert f"`rollout.engine: {name}`" in docs or f"`{name}`" in docs, f"docs/rollout.md does not describe engine {name}"
    model, tok = load_model_and_tokenizer(model_dir)
    try:
        engine = ROLLOUT_ENGINES.get(name)(EngineSetup(model, tok, RolloutConfig(batch_size=8), run_dir, model_dir, 2, 0))
    except UserError as e:
        assert str(e).startswith(f"rollout.engine: {name} "), f"engine {name} refused without naming itself: {e}"
        return
    assert engine.name == name and engine.version == 2, f"engine {name}: name {engine.name!r}, version {engine.version}"
    prompts = [tok("1+2=", add_special_tokens=False)["input_ids"], tok("30", add_special_tokens=False)["input_ids"]]
    stops = tuple(range(40, 90))
    params = SamplingParams(n=3, max_new_tokens=8, stop_token_ids=stops)
    runs = [engine.generate(model, prompts, params, generator=torch.Generator().manual_seed(0),
                            pad_token_id=tok.pad_token_id) for _ in range(2)]
    out = runs[0]
    assert [c.prompt_index for c in out] == [0, 0, 0, 1, 1, 1], f"engine {name}: not prompt-major n per prompt"
    assert [c.token_ids for c in runs[1]] == [c.token_ids for c in out], f"engine {name}: draws not from the generator"
    for c in out:
        assert c.finish_reason in ("stop", "length") and len(c.logprobs) == len(c.token_ids) <= 8, f"engine {name}: {c}"
        assert (c.finish_reason == "stop") == bool(c.token_ids and c.token_ids[-1] in stops), f"engine {name}: {c}"
        ids = torch.tensor([prompts[c.prompt_index] + c.token_ids])
        with torch.no_grad():
            lp = sequence_logprobs(model, ids, torch.ones_like(ids))[0, len(prompts[c.prompt_index]):]
        assert torch.allclose(lp, torch.tensor(c.logprobs), atol=1e-4), f"engine {name}: log-probs not the trainer's"
    engine.push(model, 3)
    assert engine.version == 3, f"engine {name}: serves {engine.version} after a push of 3"
    engine.close()
    engine.close()


@pytest.mark.parametrize("name", ROLLOUT_ENGINES.names())
def test_rollout_engine_conforms(name, tiny_model_dir, tmp_path):
    from importlib.util import find_spec

    if name == "vllm" and torch.cuda.is_available() and find_spec("vllm") is not None:
        pytest.skip("vllm builds here: its GPU test (tests/test_vllm_engine.py) runs it on a model it fits")
    check_engine(name, tiny_model_dir, tmp_path)


def check_serving_engine(name: str, model_dir: str, other_dir: str, draft: str = "") -> None:
    """See the module docstring (``check_serving_engine``); ``draft`` (the fast engine's
    ``--draft``) picks its speculative variant."""
    docs = (Path(rlvr.__file__).parent.parent / "docs" / "serve.md").read_text()
    assert f"`{name}`" in docs, f"docs/serve.md does not name serving engine {name}"
    model, tok = load_model_and_tokenizer(model_dir)
    cfg = ServeConfig(model=model_dir, device="cpu", max_batch=4, fast=name == "fast", draft=draft,
                      batching=name if name in ("continuous", "none") else "continuous")
    engine = SERVING_ENGINES.get(name)(cfg, model, tok)
    try:
        assert isinstance(engine, ServingEngine), f"serving engine {name} does not meet the protocol"
        deadline = time.monotonic() + 30
        while not engine.ready and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.ready and engine.version == 0, f"serving engine {name}: not ready at version 0"
        prompts = [tok("1+2=", add_special_tokens=False)["input_ids"], tok("the answer", add_special_tokens=False)["input_ids"]]

        def run(*requests: GenRequest) -> list[tuple[list[int], list[float], object]]:
            handles = [engine.submit(r) for r in requests]
            out = []
            for h in handles:
                events = list(h.iter_sync(timeout=60))
                toks = [e for e in events if e.token_id is not None]
                out.append(([e.token_id for e in toks], [e.logprob for e in toks], h))
            return out

        greedy = [GenRequest(prompt_ids=p, max_tokens=8, temperature=0.0, stop_token_ids=(), logprobs=True,
                             prompt_logprobs=True) for p in prompts]
        together, alone = run(*greedy), [run(r)[0] for r in greedy]
        reference = generate(model, prompts, SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=()),
                             pad_token_id=tok.pad_token_id)
        for p, (ids, lps, handle), (ids_alone, _, _), ref in zip(prompts, together, alone, reference):
            assert ids == list(ref.token_ids) == ids_alone, f"serving engine {name}: greedy tokens differ"
            full = torch.tensor([p + ids])
            with torch.no_grad():
                lp = sequence_logprobs(model, full, torch.ones_like(full))[0]
            assert torch.allclose(lp[len(p):], torch.tensor(lps), atol=1e-4), f"serving engine {name}: log-probs"
            assert handle.prompt_logprobs is not None and len(handle.prompt_logprobs) == len(p)
            assert torch.allclose(lp[1:len(p)], torch.tensor(handle.prompt_logprobs[1:]), atol=1e-4), \
                f"serving engine {name}: prompt log-probs not the trainer's"
        seeded = GenRequest(prompt_ids=prompts[0], max_tokens=8, temperature=1.0, seed=7, stop_token_ids=())
        assert run(seeded)[0][0] == run(seeded)[0][0], f"serving engine {name}: a seed does not repeat"
        stats = engine.stats()
        assert {"running", "waiting", "prefix_cache_hits", "steps"} <= set(stats), f"{name}: stats {stats}"
        assert all(isinstance(v, (int, float)) for v in stats.values())
        assert engine.load_weights(other_dir) == 1 and engine.version == 1
        assert run(greedy[0])[0][0] != together[0][0], f"serving engine {name}: other weights, same output"
    finally:
        engine.close()
        engine.close()


@pytest.mark.parametrize(("name", "draft"), [(n, "") for n in SERVING_ENGINES.names()] + [("fast", "ngram")])
def test_serving_engine_conforms(name, draft, tiny_model_dir, tmp_path):
    from rlvr.model.checkpoint import save_model_dir

    model, tok = load_model_and_tokenizer(tiny_model_dir)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    check_serving_engine(name, tiny_model_dir, str(save_model_dir(tmp_path / "other", model, tok)), draft)


def check_tracker(name: str, run_dir: Path) -> None:
    """A tracker opens on a run directory from the config alone, takes rows of metrics.jsonl numbers
    (NaN included), closes, and leaves its record in the run directory (nothing elsewhere)."""
    (tracker,) = open_trackers(TrackerConfig(use=[name]), run_dir, {"seed": 0, "optim": {"lr": 1e-4}})
    assert callable(tracker.log) and callable(tracker.close), f"tracker {name}: no log/close"
    tracker.log(1, {"rollout/reward_mean": 0.5, "eval/pass@1": 0.25})
    tracker.log(2, {"rollout/reward_mean": float("nan")})
    tracker.close()
    assert any(p.is_file() for p in run_dir.rglob("*")), f"tracker {name} wrote nothing under the run dir"
    docs = (Path(rlvr.__file__).parent.parent / "docs" / "monitoring.md").read_text()
    assert f"`{name}`" in docs, f"docs/monitoring.md does not describe tracker {name}"


@pytest.mark.parametrize("name", TRACKERS.names())
def test_tracker_conforms(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a tracker writing to the working directory would show below
    check_tracker(name, tmp_path / "run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"], f"tracker {name} wrote outside its run dir"


@pytest.mark.parametrize("name", SUITES.names())
def test_eval_suite_conforms(name):
    check_suite(name)


@pytest.mark.parametrize("name", DOMAINS.names())
def test_domain_conforms(name, request):
    check_domain(name, _sandbox_if(needs_sandbox([name]), request))


@pytest.mark.parametrize("name", VERIFIERS.names())
def test_verifier_conforms(name, request):
    users = domains_where(lambda t: t.spec.kind == name and not t.multi_turn)
    check_verifier(name, _sandbox_if(needs_sandbox(users), request))


@pytest.mark.parametrize("name", ENVS.names())
def test_environment_conforms(name, request):
    check_env(name, _sandbox_if(needs_sandbox(domains_where(lambda t: t.env == name)), request))


@pytest.mark.parametrize("name", ENVS.names())
def test_environment_tools_keep_to_their_grants(name, request):
    check_env_grants(name, _sandbox_if(needs_sandbox(domains_where(lambda t: t.env == name)), request))


@pytest.mark.parametrize("name", ENVS.names())
def test_environment_bounds_its_observations(name, request):
    # Found by this module: error messages quote the model's call (an unknown tool's 200,000-
    # character name came back whole) until ToolEnv.step cut them like results.
    check_env_observations(name, _sandbox_if(needs_sandbox(domains_where(lambda t: t.env == name)), request))


@pytest.mark.parametrize("name", [n for n in ADVANTAGES.names() if n not in NEEDS_VALUES])
def test_advantage_estimator_conforms(name):
    check_advantage(name)


@pytest.mark.parametrize("name", sorted(NEEDS_VALUES))
def test_value_estimator_conforms(name):
    """An estimator over a critic's values: token advantages and the critic's targets [B, T], 0 off
    the policy tokens whatever the values hold there, finite, and different for different rewards."""
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 1]], dtype=torch.float32)
    values = torch.where(mask > 0, torch.tensor([[0.0, 0.2, 0.4, 0.0], [0.0, 0.1, 0.0, 0.3]]), torch.nan)
    fn = ADVANTAGES.get(name)
    adv, targets = fn(torch.tensor([1.0, 0.0]), None, values=values, mask=mask, gamma=1.0, lam=0.95,
                      whiten_advantages=False)
    for t in (adv, targets):
        assert t.shape == mask.shape and torch.isfinite(t).all() and bool((t[mask == 0] == 0).all())
    other, other_targets = fn(torch.tensor([0.0, 1.0]), None, values=values, mask=mask, gamma=1.0, lam=0.95,
                              whiten_advantages=False)
    assert not torch.equal(adv, other) and not torch.equal(targets, other_targets)


@pytest.mark.parametrize("name", STEP_COMPONENTS.names())
def test_step_component_conforms(name, tiny_model_dir):
    """A step component is a row of the compatibility table, and is built only when its config
    key turns it on (the default config builds none)."""
    from rlvr.config import load_config
    from rlvr.train.components import Setup
    from rlvr.train.grpo_config import GRPOConfig
    from rlvr.train.policy import Policy

    assert name in {c.name for c in COMPAT_COMPONENTS}
    cfg = load_config(GRPOConfig, None, [f"model={tiny_model_dir}"])
    policy = Policy(torch.nn.Linear(1, 1), None, cfg.lora)
    assert STEP_COMPONENTS.get(name)(Setup(cfg, policy, torch.device("cpu"), None, 1)) is None


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_policy_loss_conforms(name):
    check_policy_loss(name)


@pytest.mark.parametrize("name", AGGREGATIONS.names())
def test_loss_aggregation_conforms(name):
    check_aggregation(name)


@pytest.mark.parametrize("name", KL_ESTIMATORS.names())
def test_kl_estimator_conforms(name):
    check_kl(name)


@pytest.mark.parametrize("name", PREFERENCE_LOSSES.names())
def test_preference_loss_conforms(name):
    check_preference_loss(name)


# ---------------------------------------------------------------- Registry.temporary


def test_temporary_registers_for_the_block_only_and_refuses_a_taken_name():
    registry: Registry[int] = Registry("thing")
    registry.register("kept")(1)
    with registry.temporary("extra", 2) as entry:
        assert entry == 2 and registry.get("extra") == 2 and registry.names() == ["extra", "kept"]
    assert registry.names() == ["kept"]
    with pytest.raises(RuntimeError), registry.temporary("extra", 3):
        raise RuntimeError("the block fails")
    assert "extra" not in registry
    for taken in (1, 5):  # the same entry or another: refused, and the registered one stays
        with pytest.raises(ValueError, match="already registered"), registry.temporary("kept", taken):
            pass
    assert registry.get("kept") == 1
    with pytest.raises(ValueError, match="lowercase"), registry.temporary("Extra", 4):
        pass
    assert registry.names() == ["kept"]


def test_entries_made_on_demand_are_kept_but_never_listed():
    """A lazy family's entry is made once and kept, but ``names()`` and ``in`` list only what was
    registered: what an earlier ``get`` asked for never changes what a later caller iterates over
    (a suite over ``DOMAINS.names()`` once generated every reasoning-gym dataset a previous test had
    touched)."""
    registry: Registry[list] = Registry("thing")
    registry.register("kept")([0])
    made: list[str] = []

    def make(name: str) -> list:
        if name == "fam.bad":
            raise UserError("no such member")
        made.append(name)
        return [name]

    registry.lazy("fam.", make, "fam.<member>")
    first = registry.get("fam.x")
    assert first == ["fam.x"] and registry.get("fam.x") is first and made == ["fam.x"]
    assert registry.names() == ["kept"] and "fam.x" not in registry and list(registry) == ["kept"]
    with pytest.raises(UserError, match="no such member"):
        registry.get("fam.bad")
    with pytest.raises(UserError, match="choose one of: kept, fam.<member>"):
        registry.get("other")
    registry.register("fam.x")(["registered"])  # a registered entry wins over a made one
    assert registry.get("fam.x") == ["registered"] and registry.names() == ["fam.x", "kept"]


# ---------------------------------------------------------------- the checks catch broken entries


class _SumDomain(Domain):
    """A healthy single-turn domain for these tests: add two numbers (the math verifier)."""

    name = "test.conformance.sum"
    levels = (1, 2)

    def sample(self, level, rng):
        a, b = rng.randrange(10 ** (level + 1)), rng.randrange(10 ** (level + 1))
        return Problem(key=f"{a}+{b}", prompt=f"Compute: {a} + {b}", spec=Spec("math", {"answer": str(a + b)}),
                       reference=self.answer(a, b))

    def answer(self, a: int, b: int) -> str:
        return f"{a} + {b} = {a + b}\nAnswer: {a + b}"


class _BrokenSumDomain(_SumDomain):
    """Its reference answer is off by one: it fails its own verifier."""

    name = "test.conformance.broken"

    def answer(self, a: int, b: int) -> str:
        return f"Answer: {a + b + 1}"


class _SecretEnv(ToolEnv):
    """A healthy tool environment: ``reveal()`` shows the task's secret, ``submit(answer)`` ends;
    it passes iff the submitted answer is the secret and it was revealed first."""

    name = "test.conformance.env"

    def reset(self, task):
        self.revealed, self.answer = False, None
        return super().reset(task)

    def tools(self):
        return [Tool("reveal", "Show the secret.", self._reveal),
                Tool("submit", "Submit the answer.", self._submit, {"answer": ("string", "the secret")})]

    def _reveal(self) -> str:
        self.revealed = True
        return self.task.spec.payload["secret"]

    def _submit(self, answer: str) -> str:
        self.answer = answer
        self.finish_with("submit")
        return "submitted"

    def _verify(self) -> Verdict:
        ok = self.revealed and self.answer == self.task.spec.payload["secret"]
        return Verdict(ok, float(ok), "ok" if ok else "mismatch")


class _CrashingEnv(_SecretEnv):
    """Reads tool calls with a bare ``json.loads``: a malformed call raises out of ``step``."""

    name = "test.conformance.crashing"

    def step(self, action):
        for body in CALL_PATTERN.findall(action):
            json.loads(body)["arguments"].items()
        return super().step(action)


class _SecretDomain(Domain):
    """Multi-turn tasks in the environment ``env``: reveal the secret, then submit it."""

    levels = (1,)

    def __init__(self, name: str, env: str) -> None:
        self.name, self.env = name, env

    def sample(self, level, rng):
        secret = "".join(rng.choice("abcdefghij") for _ in range(12))
        actions = (format_call("reveal"), format_call("submit", {"answer": secret}))
        return Problem(key=secret, prompt="Reveal the secret, then submit it.", spec=Spec("secret", {"secret": secret}),
                       reference="\n".join([actions[0], f"tool: {secret}", actions[1]]), actions=actions)


def test_a_healthy_throwaway_domain_and_environment_conform():
    with DOMAINS.temporary(_SumDomain.name, _SumDomain()):
        check_domain(_SumDomain.name)
        check_verifier("math")  # its tasks are among the math verifier's now
    with ENVS.temporary(_SecretEnv.name, _SecretEnv), \
            DOMAINS.temporary("test.conformance.secret", _SecretDomain("test.conformance.secret", _SecretEnv.name)):
        check_domain("test.conformance.secret")
        check_env(_SecretEnv.name)
    assert _SumDomain.name not in DOMAINS and _SecretEnv.name not in ENVS


def test_a_domain_whose_reference_fails_its_verifier_fails_conformance():
    with DOMAINS.temporary(_BrokenSumDomain.name, _BrokenSumDomain()):
        with pytest.raises(AssertionError, match="the reference of .* fails its verifier"):
            check_domain(_BrokenSumDomain.name)
        with pytest.raises(AssertionError, match="reference of"):
            check_verifier("math")
    assert _BrokenSumDomain.name not in DOMAINS


def test_an_environment_that_crashes_on_a_malformed_call_fails_conformance():
    name = "test.conformance.crashing_tasks"
    with ENVS.temporary(_CrashingEnv.name, _CrashingEnv), \
            DOMAINS.temporary(name, _SecretDomain(name, _CrashingEnv.name)):
        with pytest.raises(AssertionError, match="bad JSON: step raised JSONDecodeError"):
            check_env(_CrashingEnv.name)
    assert _CrashingEnv.name not in ENVS and name not in DOMAINS


def test_an_environment_without_tasks_fails_conformance():
    with ENVS.temporary(_SecretEnv.name, _SecretEnv):
        with pytest.raises(AssertionError, match="no registered domain makes tasks in environment"):
            check_env(_SecretEnv.name)


class _GrantedSecretEnv(_SecretEnv):
    """``_SecretEnv`` whose ``reveal`` runs in the sandbox under its declared grant."""

    name = "test.conformance.granted"
    grants = {"reveal": None, "submit": None}  # set below: the grant the tool runs under
    run_under = None

    def tools(self):
        from grant_probes import echo
        from rlvr.envs.grants import run_granted

        reveal = lambda: (setattr(self, "revealed", True), run_granted(
            self.sandbox, "reveal", echo, self.run_under or self.grants["reveal"], {},
            context={"text": self.task.spec.payload["secret"]}))[1]
        return [Tool("reveal", "Show the secret.", reveal, grant=self.grants["reveal"]),
                Tool("submit", "Submit the answer.", self._submit, {"answer": ("string", "the secret")})]


def test_tools_without_grants_or_outside_them_fail_conformance(sandbox):
    from rlvr.envs.grants import Grant

    name = "test.conformance.granted_tasks"
    with ENVS.temporary(_SecretEnv.name, _SecretEnv), DOMAINS.temporary(name, _SecretDomain(name, _SecretEnv.name)):
        with pytest.raises(AssertionError, match="tool reveal has no declared grant"):
            check_env_grants(_SecretEnv.name, sandbox)
    granted = type("_Healthy", (_GrantedSecretEnv,), {"grants": {"reveal": Grant(wall_s=1.0), "submit": None}})
    wide = type("_Wide", (granted,), {"run_under": Grant(wall_s=9.0)})
    for env, error in ((granted, None), (wide, "reveal ran a job outside its grant")):
        with ENVS.temporary(_GrantedSecretEnv.name, env), \
                DOMAINS.temporary(name, _SecretDomain(name, _GrantedSecretEnv.name)):
            if error is None:
                check_env_grants(_GrantedSecretEnv.name, sandbox)
            else:
                with pytest.raises(AssertionError, match=error):
                    check_env_grants(_GrantedSecretEnv.name, sandbox)


def reward_source_config(kind: str, tmp: Path, tiny_model_dir: str, judge_url: str):
    """A minimal ``SourceConfig`` of ``kind``, with what it needs made in ``tmp``."""
    from rlvr.model.load import load_model_and_tokenizer
    from rlvr.reward_source_config import SourceConfig
    from rlvr.rm.model import RewardMeta, RewardModel, save_reward_model

    if kind in ("reward_model", "process_reward"):
        model, tok = load_model_and_tokenizer(tiny_model_dir)
        path = tmp / kind
        save_reward_model(path, RewardModel(model), model, tok,
                          RewardMeta(kind="outcome" if kind == "reward_model" else "process", max_length=64))
        return SourceConfig(kind=kind, path=str(path))
    if kind == "judge":
        return SourceConfig(kind=kind, url=judge_url, timeout_s=5.0, retries=0, on_failure="zero")
    if kind == "python":
        (tmp / "fns.py").write_text("def f(prompts, completions, **kw):\n    return [len(c) % 3 for c in completions]\n")
        return SourceConfig(kind=kind, function=f"{tmp / 'fns.py'}:f")
    raise AssertionError(f"reward source {kind!r}: no minimal config in this check; add one")


def check_reward_source(kind: str, tmp: Path, tiny_model_dir: str, judge_url: str) -> None:
    """See the module docstring (``check_reward_source``)."""
    from test_reward_sources import scored

    from rlvr.reward_source_config import KINDS

    assert kind in KINDS, f"reward source {kind!r} is not a reward.sources kind"
    cfg = reward_source_config(kind, tmp, tiny_model_dir, judge_url)
    source = REWARD_SOURCES.get(kind)(cfg)
    assert source.name == cfg.name and isinstance(source.can_fail, bool)
    batch = scored(["1 + 1 = 2\nAnswer: 2", "Answer: 5", ""], [True, False, False])
    first, second = source.score(batch), source.score(batch)
    assert len(first) == len(batch), f"{kind}: {len(first)} scores for {len(batch)} samples"
    assert all(v is None or (isinstance(v, float) and math.isfinite(v)) for v in first), first
    assert first == second, f"{kind}: not deterministic"
    assert None not in first or source.can_fail, f"{kind}: a failed score from a source that cannot fail"
    assert f"`{kind}`" in (Path(rlvr.__file__).parent.parent / "docs" / "reward-models.md").read_text(), f"docs/reward-models.md does not describe {kind}"


@pytest.mark.parametrize("kind", REWARD_SOURCES.names())
def test_reward_source_conforms(kind, tiny_model_dir, tmp_path):
    from test_reward_sources import Stub, text_reply

    stub = Stub(text_reply("7"))
    try:
        check_reward_source(kind, tmp_path, tiny_model_dir, stub.url)
    finally:
        stub.close()
