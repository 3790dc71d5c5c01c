"""``rg.<dataset>``: any reasoning-gym dataset as an rlvr domain (the optional extra ``reasoning_gym``).

``rg.leg_counting``, ``rg.knights_knaves``, ... one domain per dataset of the library, checked by
the ``reasoning_gym`` verifier (rlvr's strict final answer, then the dataset's own scorer at full
credit only; see ``rlvr.verifiers.reasoning_gym``).

Registration: importing this module never imports reasoning_gym. When the package is installed,
the curated ``DEFAULT_DATASETS`` are registered at once (so ``rlvr tasks list`` shows them and the
conformance suite checks them); any other ``rg.<dataset>`` is made on its first
``DOMAINS.get`` (``Registry.lazy``). Without the package that ``get`` raises ``UserError`` naming
``pip install 'rlvr[reasoning_gym]'``.

Levels: level ``L`` is the dataset's curriculum at global level ``L - 1`` (every attribute at its
``L - 1``-th setting, clamped to its last), read with the library's default (``INCLUSIVE``)
context: a range attribute spans everything up to that setting, as the library's curricula mean
it (its ``UPPER_BOUND`` brackets give configurations some datasets reject or never finish
generating). Consecutive levels that give the same configuration count once; a configuration the
library rejects when the dataset is made is left out; more than
``MAX_LEVELS`` distinct ones are thinned to ``MAX_LEVELS`` spread evenly from the first to the last.
A dataset without a curriculum, or none of whose curriculum's configurations it accepts, has one
level, its default configuration. ``level_configs`` gives
the mapping; ``ReasoningGymDomain(dataset, configs)`` sets one by hand.

Problems: a candidate is item ``i`` of the level's dataset (seed 0, ``i`` drawn from rlvr's hashed
RNG), so generation is deterministic when the dataset's generator is. Its key is the question text
and ``split_of`` decides its split. A candidate is used only if its gold answer is a non-empty
string, its entry is plain JSON (tasks are written to JSONL; where the round trip breaks what the
scorer compares with, e.g. tuples to lists, the spec says how to rebuild the item) and its reference (the
gold as ``Answer: gold``, or ``\\boxed{gold}`` when the gold spans lines) passes the verifier;
``UNUSABLE_LIMIT`` unusable candidates before a usable one is a ``UserError`` naming the reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import random
from typing import Any, Sequence

from rlvr.errors import UserError
from rlvr.tasks.base import DOMAINS, MAX_DRAWS, Domain, Problem, seeded_rng, split_of
from rlvr.types import Spec, Task

PREFIX = "rg."
KIND = "reasoning_gym"  # the verifier (spec kind)
# registered whenever reasoning-gym is installed: fast generators of different kinds (an integer,
# an order-free logic statement, a multi-line grid, a list of words)
DEFAULT_DATASETS = ("leg_counting", "knights_knaves", "mini_sudoku", "word_sorting")
MAX_LEVELS = 10
UNUSABLE_LIMIT = 20
VIRTUAL_SIZE = 2**31 - 1  # the index range candidates are drawn from
# datasets that build ``size`` items up front: a smaller index range
SIZED = {"acre": 2_000, "gsm_symbolic": 100_000, "list_functions": 100_000, "word_ladder": 20_000}
UNSUPPORTED = {"composite": "it mixes other datasets; use them as separate rg.<dataset> domains"}

ANSWER_LINE = 'End your response with your final answer alone on its last line, as "Answer: <answer>".'
ANSWER_BOX = ("End your response with your final answer inside \\boxed{...}; it spans several lines, "
              "put all of them inside the box.")


def _verifier() -> Any:
    from rlvr.verifiers import reasoning_gym as verifier  # imports reasoning_gym only when used

    return verifier


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, allow_nan=False))


def level_configs(dataset: str) -> list[dict[str, Any]]:
    """The configuration overrides of each level, easiest first (see the module docstring)."""
    _verifier().require()
    from reasoning_gym.coaching.attributes import RangeAttributeDefinition, ScalarAttributeDefinition
    from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode
    from reasoning_gym.factory import create_curriculum, has_curriculum

    if not has_curriculum(dataset):
        return [{}]
    curriculum = create_curriculum(dataset)
    attributes = list(curriculum.attributes.values())
    fields = [f for a in attributes for f in (
        (a.lower_field_name, a.upper_field_name) if isinstance(a, RangeAttributeDefinition)
        else (a.field_name,) if isinstance(a, ScalarAttributeDefinition) else ())]
    context = DefaultCurriculumContext(mode=RangeAttributeMode.INCLUSIVE)
    configs: list[dict[str, Any]] = []
    for level in range(max((len(a.levels) for a in attributes), default=1)):
        curriculum.set_global_level(level)
        config = curriculum.generate_configuration(context=context)
        overrides = _plain({f: getattr(config, f) for f in fields})
        if (not configs or configs[-1] != overrides) and _builds(dataset, overrides):
            configs.append(overrides)
    if not configs and _builds(dataset, {}):  # a curriculum the dataset rejects: its default only
        configs.append({})
    if not configs:
        raise UserError(f"{PREFIX}{dataset}: reasoning-gym accepts no configuration of its curriculum, nor its default")
    if len(configs) > MAX_LEVELS:
        configs = [configs[round(i * (len(configs) - 1) / (MAX_LEVELS - 1))] for i in range(MAX_LEVELS)]
    return configs


def _builds(dataset: str, overrides: dict[str, Any]) -> bool:
    """Whether the library accepts ``overrides`` for ``dataset`` (its config checks run when the
    dataset is made; items are not generated here, some take many seconds)."""
    import reasoning_gym

    try:
        reasoning_gym.create_dataset(dataset, seed=0, size=1, **overrides)
    except Exception:  # the library's own asserts: the level is left out
        return False
    return True


def reference_for(gold: str) -> str | None:
    """The reference answer stating ``gold`` in rlvr's final-answer form, or None if it cannot."""
    if "\\boxed" in gold or not gold.strip():
        return None
    if "\n" not in gold.strip():
        return f"Answer: {gold.strip()}"
    depth = 0
    for ch in gold:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            return None
    return f"\\boxed{{\n{gold.strip()}\n}}" if depth == 0 else None


class ReasoningGymDomain(Domain):
    """One reasoning-gym dataset; ``configs`` (one dict of config overrides per level) defaults to
    ``level_configs(dataset)``, computed on first use."""

    version = "v1"

    def __init__(self, dataset: str, configs: Sequence[dict[str, Any]] | None = None) -> None:
        self.dataset = dataset
        self.name = PREFIX + dataset
        self._configs = [_plain(dict(c)) for c in configs] if configs is not None else None
        self._sources: dict[int, Any] = {}

    @property
    def configs(self) -> list[dict[str, Any]]:
        if self._configs is None:
            self._configs = level_configs(self.dataset)
        return self._configs

    @property
    def levels(self) -> tuple[int, ...]:  # type: ignore[override]  (computed, not a class constant)
        return tuple(range(1, len(self.configs) + 1))

    def config(self, level: int) -> dict[str, Any]:
        if level not in self.levels:
            raise UserError(f"{self.name} has no level {level}; levels are {list(self.levels)}")
        return self.configs[level - 1]

    def source(self, level: int) -> Any:
        """The reasoning-gym dataset of ``level`` (seed 0; candidates are drawn by index)."""
        if level not in self._sources:
            rg = _verifier().require()
            size = SIZED.get(self.dataset, VIRTUAL_SIZE)
            try:
                self._sources[level] = rg.create_dataset(self.dataset, seed=0, size=size, **self.config(level))
            except Exception as e:
                raise UserError(f"{self.name} level {level}: reasoning-gym cannot make the dataset "
                                f"with {self.config(level)}: {e!r}") from e
        return self._sources[level]

    def _candidate(self, level: int, rng: random.Random) -> tuple[int, dict | None, str]:
        source = self.source(level)
        index = rng.randrange(len(source))
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # codeio's generator prints what it runs
                item = source[index]
        except Exception as e:
            return index, None, f"the generator raised {e!r}"
        if not isinstance(item, dict) or not isinstance(item.get("question"), str) or not item["question"].strip():
            return index, None, "no question text"
        return index, item, ""

    def _problem(self, level: int, index: int, item: dict) -> tuple[Problem | None, str]:
        gold = item.get("answer")
        if not isinstance(gold, str) or not gold.strip():
            return None, f"no gold answer (the dataset gives {type(gold).__name__})"
        try:
            entry = _plain({"question": item["question"], "answer": gold, "metadata": item.get("metadata", {})})
        except (TypeError, ValueError) as e:
            return None, f"its entry is not plain JSON ({e})"
        reference = reference_for(gold)
        if reference is None:
            return None, "its gold cannot be written as one final answer"
        verifier = _verifier()
        config = self.config(level)
        payload = {"dataset": self.dataset, "config": config, "answer": gold, "entry": entry}
        extracted, status = verifier.extract_final_answer(reference)
        reason = status if extracted is None else verifier.judge(self.dataset, config, entry, extracted)[0]
        if reason != "ok" and extracted is not None and verifier.judge(self.dataset, config, item, extracted)[0] == "ok":
            # the JSON round trip broke what the scorer compares with (tuples became lists):
            # the verifier scores against the item generated again
            payload["rebuild"] = {"size": len(self.source(level)), "index": index}
            reason = "ok"
        if reason != "ok":
            return None, f"its gold answer fails the verifier ({reason})"
        spec = Spec(kind=KIND, payload=payload)
        instruction = ANSWER_BOX if reference.startswith("\\boxed") else ANSWER_LINE
        prompt = f"{item['question'].rstrip()}\n\n{instruction}"
        return Problem(key=item["question"], prompt=prompt, spec=spec, reference=reference), ""

    def sample(self, level: int, rng: random.Random) -> Problem:
        """A usable candidate of ``level`` in either split."""
        return self._first_usable(level, lambda attempt: rng, split=None)

    def draw(self, split: str, level: int, *rng_parts: object) -> Problem:
        return self._first_usable(level, lambda attempt: seeded_rng(*rng_parts, attempt), split)

    def _first_usable(self, level: int, rng_of, split: str | None) -> Problem:
        unusable, why = 0, ""
        for attempt in range(MAX_DRAWS):
            index, item, why_not = self._candidate(level, rng_of(attempt))
            if item is not None and split is not None and split_of(self.name, item["question"]) != split:
                continue
            problem, why_not = self._problem(level, index, item) if item is not None else (None, why_not)
            if problem is not None:
                return problem
            unusable, why = unusable + 1, why_not
            if unusable >= UNUSABLE_LIMIT:
                raise UserError(f"{self.name} level {level}: {unusable} problems drawn in a row are "
                                f"unusable; the last: {why}")
        raise RuntimeError(f"{self.name}: no {split} problem at level {level} in {MAX_DRAWS} draws")

    def generate(self, split: str, level: int, index: int, seed: int) -> Task:
        task = super().generate(split, level, index, seed)
        return dataclasses.replace(task, meta={"reasoning_gym": _library_version()})


@functools.lru_cache(maxsize=1)
def _library_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("reasoning-gym")
    except PackageNotFoundError:
        return "unknown"


def _resolve(name: str) -> ReasoningGymDomain:
    dataset = name[len(PREFIX):]
    _verifier().require()
    from reasoning_gym.factory import DATASETS

    if dataset not in DATASETS:
        raise UserError(f"unknown domain {name!r}: reasoning-gym has no dataset {dataset!r}; it has "
                        f"{', '.join(sorted(DATASETS))}")
    if dataset in UNSUPPORTED:
        raise UserError(f"domain {name!r} is not supported: {UNSUPPORTED[dataset]}")
    domain = ReasoningGymDomain(dataset)
    domain.levels  # noqa: B018  (reads the curriculum now: a broken one fails here, not mid-run)
    return domain


DOMAINS.lazy(PREFIX, _resolve, f"{PREFIX}<reasoning-gym dataset>")
if _verifier().available():  # finds the package without importing it
    for _dataset in DEFAULT_DATASETS:
        DOMAINS.register(PREFIX + _dataset)(ReasoningGymDomain(_dataset))
