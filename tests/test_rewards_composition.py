"""Reward composition as configuration: terms, per-domain overrides, the batched ruff lint term."""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from rlvr import lint
from rlvr.algos.penalties import overlong_penalty
from rlvr.config import load_config, read_yaml, save_config
from rlvr.errors import ConfigError
from rlvr.rewards import RewardConfig, score, score_all
from rlvr.types import Scored, Spec, Task, Trajectory, Verdict

CLEAN = "def f(n):\n    return n + 7\n"
UNUSED_IMPORT = "import os\n\n\ndef f(n):\n    return n + 7\n"
UNDEFINED = "def f(n):\n    return m + 7\n"
TWO_ISSUES = "import os\n\n\ndef f(n):\n    return m + 7\n"
SYNTAX_ERROR = "def f(n)\n    return n + 7\n"


def task(domain: str = "math.arith", i: int = 0) -> Task:
    return Task(id=f"{domain}/v1/train/{i:06d}", domain=domain, level=1,
                prompt=({"role": "user", "content": "q"},), spec=Spec(kind=domain.split(".")[0]))


def traj(tokens: int = 5, finish: str = "stop", group: int = 0) -> Trajectory:
    return Trajectory(task_id="t", group_id=group, messages=(), completion="c", token_ids=tuple(range(tokens + 3)),
                      loss_mask=(0, 0, 0) + (1,) * tokens, logprobs=(0.0,) * (tokens + 3), finish_reason=finish)


def verdict(passed: bool = True, score_: float | None = None, code: str | None = None, **details) -> Verdict:
    if code is not None:
        details["code"] = code
    return Verdict(passed=passed, score=float(passed) if score_ is None else score_,
                   reason="ok" if passed else "mismatch", details=details)


def old_score(tk: Task, v: Verdict, t: Trajectory, cfg: RewardConfig, max_new_tokens: int) -> Scored:
    """``rlvr.rewards.score`` before reward composition became configurable (verbatim)."""
    if cfg.outcome == "binary":
        outcome = cfg.pass_reward if v.passed else cfg.fail_reward
    else:
        outcome = cfg.fail_reward + (cfg.pass_reward - cfg.fail_reward) * float(v.score)
    terms = {"outcome": outcome}
    if cfg.format_weight:
        terms["format"] = cfg.format_weight * float(bool(v.details.get("format_ok", False)))
    if cfg.overlong == "soft":
        length = torch.tensor([float(t.num_policy_tokens)])
        terms["overlong"] = float(overlong_penalty(length, max_tokens=max_new_tokens,
                                                   buffer=cfg.overlong_buffer, penalty=cfg.overlong_penalty)[0])
    elif cfg.overlong == "truncated":
        terms["overlong"] = -cfg.overlong_penalty if t.finish_reason == "length" else 0.0
    return Scored(task=tk, trajectory=t, verdict=v, reward=sum(terms.values()), terms=terms)


OLD_CONFIGS = [
    {},
    {"outcome": "score", "pass_reward": 2.0, "fail_reward": -1.0},
    {"format_weight": 0.1},
    {"overlong": "soft", "overlong_buffer": 4, "overlong_penalty": 0.5},
    {"overlong": "truncated", "format_weight": 0.2, "fail_reward": -0.5},
]


@pytest.mark.parametrize("fields", OLD_CONFIGS)
def test_defaults_reproduce_the_old_math_reward_exactly(fields):
    cfg = RewardConfig(**fields)
    cases = [(verdict(True, format_ok=True), traj(5)), (verdict(False, format_ok=False), traj(10, "length")),
             (verdict(False, 0.25, format_ok=True), traj(9)), (verdict(True, format_ok=True), traj(7))]
    tasks = [task("math.arith", i) for i in range(len(cases))]
    batch = score_all(tasks, [v for v, _ in cases], [t for _, t in cases], cfg, max_new_tokens=10)
    for tk, (v, t), got in zip(tasks, cases, batch):
        want = old_score(tk, v, t, cfg, 10)
        assert score(tk, v, t, cfg, 10) == want
        assert got == want  # same reward, same terms, no new ones


def test_terms_sum_to_the_reward_and_appear_only_when_configured():
    cfg = RewardConfig(fail_reward=-0.2, format_weight=0.1, overlong="soft", overlong_buffer=4,
                       length_penalty=0.01, length_target=6, process_weight=0.05)
    cases = [(verdict(True, code=CLEAN, format_ok=True), traj(5)), (verdict(False, code=TWO_ISSUES), traj(9)),
             (verdict(False, code=SYNTAX_ERROR), traj(12, "length")), (verdict(True, format_ok=True), traj(8))]
    out = score_all([task("code.gen", i) for i in range(4)], [v for v, _ in cases], [t for _, t in cases], cfg, 10)
    for s in out:
        assert set(s.terms) == {"outcome", "format", "overlong", "length", "process"}
        assert s.reward == sum(s.terms.values())
    assert [s.terms["length"] for s in out] == pytest.approx([0.0, -0.03, -0.06, -0.02])
    assert [s.terms["process"] for s in out] == pytest.approx([0.05, 0.05 / 3, 0.0, 0.0])  # no code -> 0
    assert out[0].reward == pytest.approx(1.0 + 0.1 + 0.0 + 0.0 + 0.05)
    assert set(score_all([task()], [verdict()], [traj()], RewardConfig(length_penalty=0.01), 10)[0].terms) == \
        {"outcome", "length"}


def test_lint_scores_clean_code_above_unused_import_and_undefined_name():
    clean, unused, undefined, two, broken, blank = lint.lint_scores(
        [CLEAN, UNUSED_IMPORT, UNDEFINED, TWO_ISSUES, SYNTAX_ERROR, "  \n"])
    assert clean == 1.0
    assert unused == undefined == 0.5  # 1 / (1 + violations)
    assert two == pytest.approx(1 / 3)
    assert broken == 0.0 and blank == 0.0


def test_ruff_runs_once_per_batch_and_repeated_programs_are_linted_once(monkeypatch):
    calls = []
    real_run = subprocess.run

    def spy(cmd, *args, **kwargs):
        calls.append(sorted(p.name for p in Path(kwargs["cwd"]).iterdir()))
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(lint.subprocess, "run", spy)
    programs = [CLEAN, UNUSED_IMPORT, UNDEFINED, SYNTAX_ERROR] * 8  # GRPO groups repeat programs
    tasks = [task("code.gen", i) for i in range(len(programs))] + [task("math.arith")]
    verdicts = [verdict(False, code=p) for p in programs] + [verdict(True)]
    cfg = RewardConfig(domains={"code.gen": {"process_weight": 0.05}})
    out = score_all(tasks, verdicts, [traj() for _ in tasks], cfg, 10)
    assert len(calls) == 1 and len(calls[0]) == 3  # one ruff run; the syntax error never reaches ruff
    assert [s.terms["process"] for s in out[:4]] == pytest.approx([0.05, 0.025, 0.025, 0.0])
    assert "process" not in out[-1].terms  # math keeps the global config
    calls.clear()
    score_all(tasks[-1:], verdicts[-1:], [traj()], cfg, 10)
    assert calls == []  # nothing to lint: no ruff run


@pytest.mark.parametrize("ruff, timeout", [
    ([sys.executable, "-m", "rlvr_no_such_ruff_module"], 10.0),  # ruff not installed
    ([sys.executable, "-c", "print('not json')"], 10.0),  # unexpected output
    ([sys.executable, "-c", "import time; time.sleep(30)"], 0.3),  # hangs
])
def test_ruff_failure_gives_a_zero_process_term_and_one_warning(monkeypatch, caplog, ruff, timeout):
    monkeypatch.setattr(lint, "RUFF", ruff)
    monkeypatch.setattr(lint, "TIMEOUT_S", timeout)
    monkeypatch.setattr(lint, "_warned", False)
    cfg = RewardConfig(process_weight=0.05)
    with caplog.at_level(logging.WARNING, logger="rlvr.lint"):
        for _ in range(2):
            out = score_all([task("code.gen")], [verdict(code=CLEAN)], [traj()], cfg, 10)
            assert out[0].terms["process"] == 0.0 and out[0].reward == 1.0
    assert len([r for r in caplog.records if "ruff lint failed" in r.getMessage()]) == 1


def test_domain_override_applies_only_to_that_domain():
    cfg = RewardConfig(fail_reward=-1.0, domains={"code.gen": {"fail_reward": 0.0, "format_weight": 0.5}})
    tasks = [task("code.gen"), task("code.debug"), task("math.arith")]
    out = score_all(tasks, [verdict(False, format_ok=True)] * 3, [traj()] * 3, cfg, 10)
    assert out[0].terms == {"outcome": 0.0, "format": 0.5}
    assert out[1].terms == out[2].terms == {"outcome": -1.0}
    assert cfg.for_domain("code.gen").fail_reward == 0.0 and cfg.for_domain("math.arith") is cfg


@pytest.mark.parametrize("domains, needle", [
    ({"code.gen": {"proces_weight": 0.05}},
     ("unknown config key 'reward.domains.code.gen.proces_weight'; allowed keys in 'reward.domains.code.gen': "
      "content_penalty, content_rules, fail_reward, format_weight, length_penalty, length_target, outcome, overlong")),
    ({"code.gen": {"domains": {}}}, "unknown config key 'reward.domains.code.gen.domains'"),
    ({"code.gen": {"process_weight": -0.1}}, "config key 'reward.domains.code.gen.process_weight' = -0.1 must be in"),
    ({"code.gen": {"outcome": "partial"}}, "config key 'reward.domains.code.gen.outcome' = 'partial' is not allowed"),
    ({"code.gen": {"fail_reward": "low"}}, "config key 'reward.domains.code.gen.fail_reward' must be float"),
    ({"code.gen": 0.05}, "config key 'reward.domains.code.gen' must be a mapping"),
])
def test_bad_domain_override_names_the_key(domains, needle):
    with pytest.raises(ConfigError) as err:
        RewardConfig(domains=domains)
    assert needle in str(err.value)


@dataclass
class Recipe:
    """Stands in for GRPOConfig (same ``reward`` section) without importing the trainer."""

    reward: RewardConfig = field(default_factory=RewardConfig)


def test_reward_domains_through_yaml_and_set(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("reward:\n  domains:\n    code.gen: {fail_reward: -0.5}\n")
    cfg = load_config(Recipe, recipe, ["reward.process_weight=0.05", "reward.length_target=30",
                                           "reward.domains.code.gen.process_weight=0.1",  # dotted path
                                           "reward.domains.code.debug={length_penalty: 0.01}"])
    assert cfg.reward.process_weight == 0.05 and cfg.reward.length_target == 30
    assert cfg.reward.domains == {"code.gen": {"fail_reward": -0.5, "process_weight": 0.1},
                                  "code.debug": {"length_penalty": 0.01}}
    assert cfg.reward.for_domain("code.gen").process_weight == 0.1
    assert cfg.reward.for_domain("code.debug").process_weight == 0.05  # the global value
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(Recipe, tmp_path / "config.yaml") == cfg
    assert read_yaml(tmp_path / "config.yaml")["reward"]["domains"]["code.gen"]["process_weight"] == 0.1
    with pytest.raises(ConfigError, match=r"reward\.domains\.code\.gen\.pass_rewrd"):
        load_config(Recipe, None, ["reward.domains.code.gen.pass_rewrd=2"])
