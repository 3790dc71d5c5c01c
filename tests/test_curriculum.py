"""The curriculum scheduler: mix weights, stages, filtering, recycling, seesaw, dynamic sampling,
exact resume (scheduler alone and inside a GRPO run that is killed and resumed)."""

from __future__ import annotations

import contextlib
import json
from collections import Counter

import pytest

import rlvr.tasks  # noqa: F401
from rlvr.config import load_config
from rlvr.curriculum.config import CurriculumConfig
from rlvr.curriculum.plots import curriculum_plot
from rlvr.curriculum.rules import (choose_level, eval_noise, learnability_level, recycle_accepts, seesaw_step,
                                   should_promote, weight_groups)
from rlvr.curriculum.scheduler import Curriculum
from rlvr.errors import ConfigError
from rlvr.monitor.alerts import read_alerts
from rlvr.monitor.metrics import read_metrics
from rlvr.rollout.sync_rollout import SyncRollout, signal_groups
from rlvr.tasks.base import DOMAINS, seeded_rng
from rlvr.types import Scored, Spec, Task, Trajectory, Verdict
from rlvr.verifiers.base import VERIFIERS


def _task(domain: str, level: int, i: int) -> Task:
    return Task(id=f"{domain}/v1/train/{level}/{i:06d}", domain=domain, level=level,
                prompt=({"role": "user", "content": f"{domain} {level} {i}"},), spec=Spec(kind="math"),
                key=f"{level}:{i}", reference="x")


def _pool(domains=("math.arith", "math.word", "code.gen"), levels=(1, 2, 3), per=20) -> list[Task]:
    return [_task(d, lv, i) for d in domains for lv in levels for i in range(per)]


def _scored(task: Task, group: int, passes: list[bool]) -> list[Scored]:
    traj = Trajectory(task_id=task.id, group_id=group, messages=(), completion="", token_ids=(1,), loss_mask=(1,),
                      logprobs=(0.0,), finish_reason="stop")
    return [Scored(task, traj, Verdict(passed=p, score=float(p), reason="ok" if p else "wrong"), float(p))
            for p in passes]


def _cfg(**kw) -> CurriculumConfig:
    from rlvr.config import from_dict

    return from_dict(CurriculumConfig, {"enabled": True, **kw})


# ------------------------------------------------------------------ pure rules


def test_weight_groups_cover_domains_by_name_or_family_and_reject_bad_keys():
    domains = ["code.debug", "code.gen", "math.arith", "math.word"]
    assert weight_groups({"math": 1, "code.gen": 2}, domains) == {"math": ["math.arith", "math.word"],
                                                                 "code.gen": ["code.gen"]}
    assert weight_groups({}, domains) == {d: [d] for d in domains}
    with pytest.raises(ConfigError, match="curriculum.weights.long_ctx' names no training domain"):
        weight_groups({"long_ctx": 1}, domains)
    with pytest.raises(ConfigError, match="covered by both"):
        weight_groups({"code": 1, "code.gen": 1}, domains)
    with pytest.raises(ConfigError, match="every weight is 0"):
        weight_groups({"math": 0}, domains)
    with pytest.raises(ConfigError, match="'curriculum.stages.promote_at' = 1.5"):
        _cfg(stages={"promote_at": 1.5})


def test_promotion_level_choice_seesaw_and_recycling_rules():
    assert not should_promote([1] * 10, min_samples=16, promote_at=0.5)  # too few samples
    assert should_promote([1] * 12 + [0] * 4, min_samples=16, promote_at=0.75)
    assert not should_promote([1] * 11 + [0] * 5, min_samples=16, promote_at=0.75)
    assert choose_level([1, 2, 3], 3, 0.7, 0.5, 0.9) == 3  # u < share: frontier
    assert choose_level([1, 2, 3], 3, 0.7, 0.8, 0.9) == 2 and choose_level([1, 2, 3], 3, 0.7, 0.8, 0.1) == 1
    assert choose_level([1], 1, 0.0, 0.99, 0.5) == 1  # nothing below the frontier
    assert seesaw_step(0.5, None, 1.0, tolerance=0.03, boost=1.5, max_factor=4) == (1.0, 0.5, False)
    assert seesaw_step(0.45, 0.5, 1.0, tolerance=0.03, boost=1.5, max_factor=4) == (1.5, 0.5, True)
    assert seesaw_step(0.45, 0.5, 3.0, tolerance=0.03, boost=1.5, max_factor=4) == (4.0, 0.5, True)
    assert seesaw_step(0.49, 0.5, 1.5, tolerance=0.03, boost=1.5, max_factor=4) == (1.0, 0.5, False)  # relaxes
    assert seesaw_step(0.45, 0.5, 1.0, tolerance=0.03, boost=1.5, max_factor=4, noise=0.06)[2] is False  # inside noise
    assert abs(eval_noise(0.75, 50, 1.0) - 0.0877) < 1e-3 and eval_noise(0.75, 50, 0.0) == 0.0
    near_zero = eval_noise(2 / 28, 28, 1.0)  # 2 of 28 tasks, then 0 of 28: inside the noise
    assert not seesaw_step(0.0, 2 / 28, 1.0, tolerance=0.03, boost=1.5, max_factor=4, noise=near_zero)[2]
    assert recycle_accepts(1, 0.5, 0.99) and recycle_accepts(2, 0.5, 0.49) and not recycle_accepts(2, 0.5, 0.5)


# ------------------------------------------------------------------ the scheduler


def test_draws_follow_the_weights_and_start_at_the_lowest_level():
    cur = Curriculum(_pool(per=200), _cfg(weights={"math": 3.0, "code.gen": 1.0}), seed=0)
    drawn = [t for step in range(100) for t in cur.next(16, step)]
    share = Counter("math" if t.domain.startswith("math") else "code" for t in drawn)
    assert abs(share["math"] / len(drawn) - 0.75) < 0.03
    assert {t.level for t in drawn} == {1}  # nothing observed: nothing promoted
    within_step = cur.next(16, 100)
    assert len({t.id for t in within_step}) == 16  # no task twice in one draw


def test_a_mastered_level_promotes_once_and_failures_never_demote():
    cfg = _cfg(weights={"math.arith": 1.0}, filter={"enabled": False},
               stages={"min_samples": 16, "window": 32, "promote_at": 0.75, "level_choice": "frontier"})
    cur = Curriculum(_pool(domains=("math.arith",)), cfg, seed=0)
    tasks = cur.next(2, 0)
    cur.observe([s for g, t in enumerate(tasks) for s in _scored(t, g, [True] * 4)], 0)
    assert cur.frontier["math.arith"] == 1  # 8 samples < min_samples
    tasks = cur.next(2, 1)
    cur.observe([s for g, t in enumerate(tasks) for s in _scored(t, g, [True] * 4)], 1)
    assert cur.frontier["math.arith"] == 2
    assert cur.events == [{"step": 1, "event": "promote", "domain": "math.arith", "from_level": 1, "to_level": 2}]
    for step in range(2, 10):  # everything fails from now on
        tasks = cur.next(4, step)
        cur.observe([s for g, t in enumerate(tasks) for s in _scored(t, g, [False] * 8)], step)
        assert {t.level for t in tasks} <= {1, 2}
    assert cur.frontier["math.arith"] == 2
    drawn = Counter(t.level for step in range(10, 60) for t in cur.next(4, step))
    assert 0.6 < drawn[2] / sum(drawn.values()) < 0.8  # frontier_share 0.7, the rest reviews level 1


def test_learnability_draws_most_where_groups_carry_signal():
    cur = Curriculum(_pool(domains=("math.arith",), levels=(1, 2, 3), per=300), _cfg(stages={"enabled": False}), seed=0)
    cur.windows = {"math.arith/1": [1] * 19 + [0], "math.arith/2": [1, 0] * 10, "math.arith/3": [0] * 20}
    drawn = Counter(t.level for step in range(40) for t in cur.next(8, step))
    assert drawn[2] > 3 * drawn[1] and drawn[2] > 3 * drawn[3]  # p(1-p): 0.25 against 0.0475 and the 0.02 floor
    assert drawn[1] > 0 and drawn[3] > 0
    assert learnability_level([1, 2], {1: None, 2: 0.0}, 0.9) == 1 and learnability_level([1, 2], {1: 0.5, 2: 0.5}, 0.6) == 2


def test_always_solved_tasks_are_retired_and_never_solved_ones_recycled_then_retired():
    cfg = _cfg(stages={"enabled": False}, filter={"solved_after": 2},
               recycle={"retry_limit": 2, "delay_steps": 3, "decay": 1.0, "max_share": 1.0})
    pool = _pool(domains=("math.arith",), levels=(1,), per=6)
    cur = Curriculum(pool, cfg, seed=0)
    easy, hard = pool[0], pool[1]
    seen: list[list[str]] = []
    for step in range(40):
        tasks = cur.next(2, step)
        seen.append([t.id for t in tasks])
        outcome = {easy.id: [True] * 4, hard.id: [False] * 4}
        cur.observe([s for g, t in enumerate(tasks) for s in _scored(t, g, outcome.get(t.id, [True, False] * 2))], step)
    easy_steps = [s for s, ids in enumerate(seen) if easy.id in ids]
    hard_steps = [s for s, ids in enumerate(seen) if hard.id in ids]
    assert len(easy_steps) == 2  # solved twice in a row: retired
    assert cur.status[str(0)] == "solved" and cur.status[str(1)] == "unsolved"
    assert len(hard_steps) == 3  # first try + retry_limit retries, each at least delay_steps later
    assert all(b - a >= 3 for a, b in zip(hard_steps, hard_steps[1:]))
    assert cur.metrics()["curriculum/retired_solved"] == 1.0 and cur.metrics()["curriculum/retired_unsolved"] == 1.0


def test_a_pool_with_everything_retired_keeps_drawing():
    cfg = _cfg(stages={"enabled": False}, filter={"solved_after": 1})
    cur = Curriculum(_pool(domains=("math.arith",), levels=(1,), per=3), cfg, seed=0)
    for step in range(6):
        tasks = cur.next(3, step)
        assert len(tasks) == 3
        cur.observe([s for g, t in enumerate(tasks) for s in _scored(t, g, [True] * 2)], step)
    assert cur.counts["exhausted"] > 0


def test_too_few_unlocked_tasks_for_a_step_is_a_user_error_naming_the_key_and_the_counts():
    from rlvr.errors import UserError

    cur = Curriculum(_pool(domains=("math.arith", "code.gen"), levels=(1, 2), per=3),
                     _cfg(weights={"math": 1.0}), seed=0)  # code.gen has weight 0 here: not counted
    assert len(cur.next(3, 0)) == 3
    with pytest.raises(UserError) as info:
        cur.next(4, 1)
    text = str(info.value)
    assert "rollout.tasks_per_step=4" in text and "math.arith L1: 3 tasks" in text
    assert "code.gen" not in text and "L2" not in text  # only what a draw may take now


def test_seesaw_raises_a_dropping_domains_weight_from_a_scripted_eval_history(tmp_path):
    cur = Curriculum(_pool(), _cfg(weights={"math": 1.0, "code.gen": 1.0}), seed=0)
    history = [  # (math.arith, math.word, code.gen) pass@1 per periodic eval
        (0.50, 0.50, 0.40), (0.60, 0.60, 0.45), (0.50, 0.52, 0.50), (0.45, 0.50, 0.52), (0.60, 0.62, 0.52)]
    weights, alerts = [], []
    for i, (a, w, c) in enumerate(history):
        alerts += cur.on_eval(10 * (i + 1), {"math.arith": {"pass@1": a, "n_tasks": 50},
                                             "math.word": {"pass@1": w, "n_tasks": 50},
                                             "code.gen": {"pass@1": c, "n_tasks": 100}})
        weights.append(cur.weights()["math"])
    assert [x["step"] for x in alerts] == [30, 40] and {x["group"] for x in alerts} == {"math"}
    assert alerts[0]["detector"] == "seesaw" and alerts[0]["evidence"]["best"] == 0.6
    assert weights[0] == weights[1] == 0.5 and weights[2] > 0.5 and weights[3] > weights[2]
    assert weights[4] < weights[3]  # recovered: the boost relaxes
    draws = Counter(t.domain.split(".")[0] for step in range(50) for t in cur.next(16, step))
    assert draws["math"] > draws["code"]
    rows = [{"step": s, **{f"curriculum/weight/{g}": w for g, w in cur.weights().items()},
             "curriculum/frontier/math.arith": 1.0} for s in range(1, 4)]
    curriculum_plot(rows, tmp_path / "c.png", alerts)
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _script(task: Task, step: int) -> list[bool]:
    """Outcome of a task's group: a pure function of the task and the step."""
    r = seeded_rng("outcome", task.id, step)
    p = [0.0, 0.5, 1.0, 0.9][r.randrange(4)]
    return [r.random() < p for _ in range(4)]


def test_state_dict_resumes_the_exact_task_sequence():
    cfg = _cfg(weights={"math": 2.0, "code.gen": 1.0}, stages={"min_samples": 8, "window": 16, "promote_at": 0.5},
               recycle={"delay_steps": 2, "decay": 0.5})

    def play(cur, steps):
        out = []
        for step in steps:
            tasks = cur.next(6, step)
            out.append([t.id for t in tasks])
            cur.observe([s for g, t in enumerate(tasks) for s in _scored(t, g, _script(t, step))], step)
            if step % 5 == 4:
                cur.on_eval(step, {"math.arith": {"pass@1": 0.5 - 0.02 * step, "n_tasks": 10}})
        return out

    straight = Curriculum(_pool(), cfg, seed=3)
    full = play(straight, range(30))
    first = Curriculum(_pool(), cfg, seed=3)
    head = play(first, range(13))
    state = json.loads(json.dumps(first.state_dict()))  # plain values only
    resumed = Curriculum(_pool(), cfg, seed=3)
    resumed.load_state_dict(state)
    assert head + play(resumed, range(13, 30)) == full
    assert straight.frontier == resumed.frontier and straight.metrics() == resumed.metrics()
    assert any(e["event"] == "promote" for e in straight.events)
    assert straight.counts["recycled"] > 0 and straight.status


# ------------------------------------------------------------------ dynamic sampling


def test_dynamic_sampling_refills_zero_variance_groups_up_to_the_batch_size():
    pool = _pool(domains=("math.arith",), levels=(1,), per=200)
    informative = {t.id for i, t in enumerate(pool) if i % 3 == 0}  # 1 in 3 tasks has signal
    cur = Curriculum(pool, _cfg(stages={"enabled": False}, filter={"enabled": False}), seed=0)

    def generate(tasks, version):
        return tasks

    def verify(tasks, episodes):
        return [s for g, t in enumerate(tasks) for s in _scored(t, g, [True, False] if t.id in informative else [False] * 2)]

    source = SyncRollout(pool=cur, tasks_per_step=8, generate=generate, verify=verify, refill_rounds=20)
    fracs = []
    for step in range(8):
        batch = source.next(step)
        assert signal_groups(batch.scored) == 8
        groups = sorted({s.trajectory.group_id for s in batch.scored})
        assert groups == list(range(len(batch.tasks)))  # ids index the merged task list
        assert all(batch.tasks[s.trajectory.group_id].id == s.task.id for s in batch.scored)
        metrics = source.metrics(batch, step)
        assert metrics["curriculum/rounds"] > 1
        fracs.append(metrics["curriculum/zero_variance_frac"])
    assert 0.45 < sum(fracs) / len(fracs) < 0.85  # 2 in 3 groups have no signal
    capped = SyncRollout(pool=cur, tasks_per_step=8, generate=generate, verify=verify, refill_rounds=1)
    batch = capped.next(10)
    assert capped.metrics(batch, 10)["curriculum/rounds"] == 2 and len(batch.tasks) <= 16


# ------------------------------------------------------------------ inside a GRPO run


class LevelledDigits:
    """Write digits; level 2 asks for more of them (a random model passes some of each)."""

    name = "test.ldigits"
    version = "v1"
    levels = (1, 2)

    def generate(self, split: str, level: int, index: int, seed: int) -> Task:
        key = f"{split}:{level}:{index}:{seeded_rng(seed, self.name, split, level, index).randrange(10**6)}"
        return Task(id=f"{self.name}/v1/{split}/{level}/{index:06d}", domain=self.name, level=level,
                    prompt=({"role": "user", "content": f"Write {level} digits ({key})."},),
                    spec=Spec(kind="test.ldigits"), key=key,
                    reference="1" * level)

    def corpus(self, seed: int, n_docs: int) -> list[str]:
        return ["123"] * n_docs


class LevelledDigitsVerifier:
    name = "test.ldigits"

    def check(self, task: Task, completion: str) -> Verdict:
        ok = sum(c.isdigit() for c in completion) >= task.level
        return Verdict(passed=ok, score=float(ok), reason="ok" if ok else "mismatch")


@contextlib.contextmanager
def levelled_digits():
    with DOMAINS.temporary("test.ldigits", LevelledDigits()), \
            VERIFIERS.temporary("test.ldigits", LevelledDigitsVerifier()):
        yield


def _grpo_cfg(model_dir, out, **extra):
    from rlvr.train.grpo import GRPOConfig

    overrides = [
        f"model={model_dir}", f"out={out}", "domains=[test.ldigits]", "train_tasks=24",
        "rollout.tasks_per_step=3", "rollout.samples_per_task=4", "rollout.max_new_tokens=4",
        "optim.lr=1e-2", "optim.warmup_steps=0", "checkpoint_every=2", "save_trajectories_every=100",
        "curriculum.enabled=true", "curriculum.stages.min_samples=4", "curriculum.stages.window=8",
        "curriculum.stages.promote_at=0.3", "curriculum.recycle.delay_steps=1", "curriculum.filter.solved_after=1",
        "eval_every=2", "eval.domains=[test.ldigits]", "eval.tasks=4", "eval.max_new_tokens=4",
        "curriculum.seesaw.tolerance=0.0",
    ] + [f"{k}={v}" for k, v in extra.items()]
    return load_config(GRPOConfig, None, overrides)


def test_killed_grpo_run_with_the_curriculum_resumes_the_same_task_sequence(tiny_model_dir, tmp_path, monkeypatch):
    import rlvr.train.grpo as grpo

    from rlvr.train import sources
    real_rollout = sources.rollout
    drawn: dict[str, list[tuple[int, list[str]]]] = {"straight": [], "crashed": []}

    def recording(name, die_at=None):
        def rollout(run, tasks, policy_version):
            if policy_version == die_at:
                raise KeyboardInterrupt
            drawn[name].append((policy_version, [t.id for t in tasks]))
            return real_rollout(run, tasks, policy_version)
        return rollout

    with levelled_digits():
        monkeypatch.setattr(sources, "rollout", recording("straight"))
        grpo.run_grpo(_grpo_cfg(tiny_model_dir, tmp_path / "straight", steps=6), progress=False)
        crashed = _grpo_cfg(tiny_model_dir, tmp_path / "crashed", steps=6)
        monkeypatch.setattr(sources, "rollout", recording("crashed", die_at=5))
        with pytest.raises(KeyboardInterrupt):
            grpo.run_grpo(crashed, progress=False)
        assert [r["step"] for r in read_metrics(tmp_path / "crashed")] == [1, 2, 3, 4, 5]
        drawn["crashed"] = [d for d in drawn["crashed"] if d[0] < 4]  # steps after the step-4 checkpoint rerun
        monkeypatch.setattr(sources, "rollout", recording("crashed"))
        grpo.run_grpo(crashed, resume=True, progress=False)

    assert drawn["crashed"] == drawn["straight"]
    levels = {tid.split("/")[3] for _, ids in drawn["straight"] for tid in ids}
    assert levels == {"1", "2"}  # level 2 was unlocked during the run

    def strip(rows):
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]

    a, b = strip(read_metrics(tmp_path / "straight")), strip(read_metrics(tmp_path / "crashed"))
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert "curriculum/weight/test.ldigits" in a[-1] and "curriculum/rounds" in a[-1]
    assert read_alerts(tmp_path / "straight") == read_alerts(tmp_path / "crashed")
    assert (tmp_path / "straight" / "plots" / "curriculum.png").exists()
    report = json.loads((tmp_path / "straight" / "curriculum.json").read_text())
    assert any(e["event"] == "promote" for e in report["events"])
    assert sum(t["samples"] for t in report["tasks"]) == sum(len(ids) * 4 for _, ids in drawn["straight"])


def test_curriculum_with_asynchronous_mode_is_accepted(tiny_model_dir, tmp_path):
    cfg = _grpo_cfg(tiny_model_dir, tmp_path, **{"asynchronous.enabled": "true"})  # rlvr.train.compat: supported
    assert cfg.curriculum.enabled and cfg.asynchronous.enabled


def test_periodic_evals_can_sweep_a_named_suite(tiny_model_dir, tmp_path):
    import rlvr.train.grpo as grpo
    from rlvr.errors import UserError
    from rlvr.eval.suites import SUITES, fingerprint, tasks_of

    with levelled_digits():
        cfg = _grpo_cfg(tiny_model_dir, tmp_path, steps=1, eval_every=1, eval_suite="default",
                        **{"curriculum.enabled": "false", "eval.max_new_tokens": 2})
        grpo.run_grpo(cfg, progress=False)
        with pytest.raises(UserError, match="no_such_suite"):
            _grpo_cfg(tiny_model_dir, tmp_path, eval_suite="no_such_suite")
    report = json.loads((tmp_path / "eval" / "step_1.json").read_text())
    assert report["suite"]["name"] == "default"
    assert report["fingerprint"] == fingerprint(tasks_of(SUITES.get("default")))
    assert len(report["tasks"]) == SUITES.get("default").tasks
