"""GRPO end to end on a tiny random model: parameters change, reward rises, resume is exact."""

from __future__ import annotations

import contextlib
import json

import pytest

import rlvr.tasks  # noqa: F401
import rlvr.verifiers  # noqa: F401
from rlvr.config import load_config
from rlvr.monitor.metrics import read_metrics
from rlvr.tasks.base import DOMAINS, seeded_rng
from rlvr.types import Spec, Task, Verdict
from rlvr.verifiers.base import VERIFIERS


class DigitsDomain:
    """An easy task for a random model: write digits. Registered the way any domain is."""

    name = "test.digits"
    version = "v1"
    levels = (1,)

    def generate(self, split: str, level: int, index: int, seed: int) -> Task:
        rng = seeded_rng(seed, self.name, split, index)
        key = f"{split}:{index}:{rng.randrange(10**6)}"
        return Task(id=f"{self.name}/v1/{split}/{level}/{index:06d}", domain=self.name, level=level,
                    prompt=({"role": "user", "content": "Write digits."},),
                    spec=Spec(kind="test.digits"), key=key, reference="123")

    def corpus(self, seed: int, n_docs: int) -> list[str]:
        return ["123"] * n_docs


class DigitsVerifier:
    """Score = fraction of characters that are digits (partial credit)."""

    name = "test.digits"

    def check(self, task: Task, completion: str) -> Verdict:
        score = sum(c.isdigit() for c in completion) / max(len(completion), 1)
        return Verdict(passed=score == 1.0, score=score, reason="ok" if score == 1.0 else "mismatch")


@contextlib.contextmanager
def digits_registered():
    """``test.digits`` registered as a domain and a verifier for the block, removed after it."""
    with DOMAINS.temporary("test.digits", DigitsDomain()), VERIFIERS.temporary("test.digits", DigitsVerifier()):
        yield


@pytest.fixture(scope="module", autouse=True)
def digits():
    """Every test of a module that imports this fixture (test_async does) sees ``test.digits``."""
    with digits_registered():
        yield


def _cfg(model_dir, out, **extra):
    from rlvr.train.grpo import GRPOConfig

    overrides = [
        f"model={model_dir}", f"out={out}", "domains=[test.digits]", "levels=[1]", "train_tasks=16",
        "rollout.tasks_per_step=4", "rollout.samples_per_task=8", "rollout.max_new_tokens=6",
        "reward.outcome=score", "optim.lr=1e-2", "optim.warmup_steps=0", "checkpoint_every=2",
        "save_trajectories_every=100",
    ] + [f"{k}={v}" for k, v in extra.items()]
    return load_config(GRPOConfig, None, overrides)


@pytest.mark.parametrize("extra", [{}, {"rollout.precision": "bf16", "algo.precision": "bf16"}], ids=["fp32", "bf16"])
def test_grpo_changes_every_parameter_and_raises_reward(tiny_model_dir, tmp_path, extra):
    import torch
    from rlvr.model.load import load_model
    from rlvr.train.grpo import run_grpo

    cfg = _cfg(tiny_model_dir, tmp_path / "run", steps=12, **extra)
    run_grpo(cfg, progress=False)
    before = dict(load_model(tiny_model_dir).named_parameters())
    after = dict(load_model(tmp_path / "run" / "final").named_parameters())
    unchanged = [n for n, p in after.items() if torch.equal(p, before[n])]
    assert not unchanged, f"parameters that did not change: {unchanged}"
    metrics = read_metrics(tmp_path / "run")
    rewards = [m["rollout/reward_mean"] for m in metrics]
    assert len(rewards) == 12
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.05, rewards
    assert all(p.dtype == torch.float32 for p in after.values())  # bf16 is compute only
    mismatch = max(m["rollout/logprob_mismatch_kl"] for m in metrics)
    assert (mismatch < 1e-8) if not extra else (1e-8 < mismatch < 1e-2), mismatch


def test_bf16_training_forward_is_close_to_fp32(tiny_model_dir):
    """``algo.precision: bf16``: log-probs and gradients of the autocast forward match fp32 up to
    bf16 rounding (and are not bitwise fp32: autocast really ran)."""
    import torch
    from rlvr.model.load import load_model
    from rlvr.train.batching import collate
    from rlvr.train.grpo import AlgoConfig
    from rlvr.train.update import logprobs_of
    from rlvr.types import Trajectory

    model = load_model(tiny_model_dir)
    g = torch.Generator().manual_seed(0)
    trajs = []
    for i in range(6):
        prompt, resp = torch.randint(5, 100, (7 + i,), generator=g).tolist(), torch.randint(5, 100, (9,), generator=g).tolist()
        trajs.append(Trajectory(task_id=str(i), group_id=i // 3, messages=(), completion="", token_ids=tuple(prompt + resp),
                                loss_mask=(0,) * len(prompt) + (1,) * len(resp), logprobs=(0.0,) * (len(prompt) + len(resp)),
                                finish_reason="length"))
    batch = collate(trajs, [1.0, -1.0, 0.5, 0.2, -0.3, 0.1], 0)
    out, flash = {}, {}
    for precision in ("model", "bf16"):
        model.zero_grad()
        lp = logprobs_of(model, batch, AlgoConfig(precision=precision))
        flash[precision] = any("Flash" in name for name in _graph_ops(lp.grad_fn))
        (lp * batch.loss_mask).sum().backward()
        out[precision] = (lp.detach(), torch.cat([p.grad.flatten() for p in model.parameters()]))
        assert lp.dtype == torch.float32
    (lp32, g32), (lp16, g16) = out["model"], out["bf16"]
    mask = batch.loss_mask > 0
    diff = (lp32 - lp16)[mask].abs()
    assert 0 < diff.max() < 0.1 and diff.mean() < 0.02, diff
    cos = torch.nn.functional.cosine_similarity(g32, g16, dim=0)
    assert cos > 0.99, cos
    # On CPU, bf16 attention is differentiated through SDPA's math backend, not the flash kernel.
    assert flash == {"model": True, "bf16": False}, flash


def _graph_ops(fn) -> set[str]:
    """Names of the autograd nodes reachable from ``fn``."""
    seen, stack, names = set(), [fn], set()
    while stack:
        f = stack.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        names.add(type(f).__name__)
        stack.extend(nxt for nxt, _ in f.next_functions)
    return names


@pytest.mark.parametrize("extra", [{}, {"algo.advantage": "rloo", "algo.aggregation": "seq_mean_token_mean",
                                       "algo.kl_coef": 0.05, "algo.ppo_epochs": 2, "algo.minibatch_size": 16,
                                       "algo.microbatch_size": 8}])
def test_killed_run_resumes_to_same_metrics(tiny_model_dir, tmp_path, monkeypatch, extra):
    a, b = killed_and_straight_metrics(tiny_model_dir, tmp_path, monkeypatch, extra)
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5]
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def killed_at_rollout(cfg, monkeypatch, version: int) -> None:
    """``cfg``'s run, stopped (KeyboardInterrupt) as the rollout of policy version ``version`` starts."""
    import rlvr.train.grpo as grpo
    from rlvr.train import sources

    real_rollout = sources.rollout

    def rollout_then_die(run, tasks, policy_version):
        if policy_version == version:
            raise KeyboardInterrupt
        return real_rollout(run, tasks, policy_version)

    monkeypatch.setattr(sources, "rollout", rollout_then_die)
    with pytest.raises(KeyboardInterrupt):
        grpo.run_grpo(cfg, progress=False)
    monkeypatch.setattr(sources, "rollout", real_rollout)


def without_times(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def killed_and_straight_metrics(model_dir, tmp_path, monkeypatch, extra: dict) -> tuple[list, list]:
    """The metrics (no timings) of a 5-step run, and of the same run killed as step 4 starts (step 3
    logged, the newest checkpoint step 2) and resumed."""
    import rlvr.train.grpo as grpo

    straight = _cfg(model_dir, tmp_path / "straight", steps=5, **extra)
    grpo.run_grpo(straight, progress=False)
    crashed = _cfg(model_dir, tmp_path / "crashed", steps=5, **extra)
    killed_at_rollout(crashed, monkeypatch, 3)  # step 4 starts: step 3 is logged, the newest checkpoint is step 2
    assert [r["step"] for r in read_metrics(tmp_path / "crashed")] == [1, 2, 3]
    grpo.run_grpo(crashed, resume=True, progress=False)
    return without_times(read_metrics(tmp_path / "straight")), without_times(read_metrics(tmp_path / "crashed"))


def test_a_run_whose_newest_checkpoint_is_damaged_resumes_from_the_one_before(tiny_model_dir, tmp_path, monkeypatch,
                                                                              capsys):
    """Killed as step 5 starts (checkpoints every step), its step-4 weights then truncated and a
    metrics line left half-written: the resume warns once, starts from step 3 and logs what an
    uninterrupted run logs."""
    import rlvr.train.grpo as grpo

    extra = {"checkpoint_every": 1, "keep_checkpoints": 3}
    grpo.run_grpo(_cfg(tiny_model_dir, tmp_path / "straight", steps=5, **extra), progress=False)
    crashed = _cfg(tiny_model_dir, tmp_path / "crashed", steps=5, **extra)
    killed_at_rollout(crashed, monkeypatch, 4)
    weights = tmp_path / "crashed" / "checkpoints" / "step_4" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with (tmp_path / "crashed" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "rollout/rew')
    capsys.readouterr()
    grpo.run_grpo(crashed, resume=True, progress=False)
    warned = [line for line in capsys.readouterr().err.splitlines() if "is damaged" in line]
    assert len(warned) == 1 and "step_4" in warned[0] and "model.safetensors" in warned[0]

    straight, resumed = without_times(read_metrics(tmp_path / "straight")), without_times(read_metrics(tmp_path / "crashed"))
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5]
    assert json.dumps(straight, sort_keys=True) == json.dumps(resumed, sort_keys=True)


def test_task_files_join_the_pool_and_broken_tasks_are_dropped(tiny_model_dir, tmp_path, capsys):
    from rlvr.sandbox import choose
    from rlvr.train.grpo import run_grpo

    if not choose("auto").strict:
        pytest.skip("no strict sandbox backend here")
    good = {"task_id": "T/0", "prompt": "def inc(x):\n", "canonical_solution": "    return x + 1\n",
            "test": "def check(candidate):\n    assert candidate(1) == 2\n", "entry_point": "inc"}
    broken = dict(good, task_id="T/1", canonical_solution="    return x + 2\n")
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in (good, broken)) + "\n")
    cfg = _cfg(tiny_model_dir, tmp_path / "run", steps=2, task_files=f"[{path}]")
    run_grpo(cfg, progress=False)
    printed = capsys.readouterr().out
    assert "kept 1 of 2" in printed and "dropped 1" in printed, printed
    assert len(read_metrics(tmp_path / "run")) == 2  # the run went on with the rest

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(good) + "\n" + json.dumps({k: v for k, v in good.items() if k != "test"}) + "\n")
    from rlvr.errors import UserError

    with pytest.raises(UserError, match=r"bad\.jsonl:2: .*'test'"):
        run_grpo(_cfg(tiny_model_dir, tmp_path / "run2", steps=1, task_files=f"[{bad}]"), progress=False)


def test_device_is_checked_by_name_and_resolved_where_the_run_starts(tiny_model_dir, tmp_path):
    import torch

    from rlvr.config import resolve_device
    from rlvr.errors import ConfigError
    from rlvr.train import grpo

    from rlvr.train.pretrain import PretrainConfig
    from rlvr.train.sft import SFTConfig

    for bad in ("gpu", "cuda:x", "CPU"):
        with pytest.raises(ConfigError, match="config key 'device'"):
            _cfg(tiny_model_dir, tmp_path / "bad", device=bad)
        for cls, key in ((SFTConfig, "sft.device"), (PretrainConfig, "pretrain.device")):
            with pytest.raises(ConfigError, match=f"config key '{key}'"):
                load_config(cls, None, [f"device={bad}"])
    here = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("device", "auto") == here
    if not torch.cuda.is_available():  # a GPU recipe validates on a laptop and stops where it would start
        cfg = _cfg(tiny_model_dir, tmp_path / "gpu", device="cuda")
        with pytest.raises(ConfigError, match="no CUDA device"):
            grpo.setup(cfg, resume=False)
    run = grpo.setup(_cfg(tiny_model_dir, tmp_path / "auto", device="auto"), resume=False)
    assert next(run.model.parameters()).device.type == here.type


@pytest.mark.gpu
@pytest.mark.parametrize("compile", [False, True])
def test_grpo_on_cuda_in_bf16_changes_every_parameter(tiny_model_dir, tmp_path, compile):
    import torch

    from rlvr.model.load import load_model
    from rlvr.train.grpo import run_grpo

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    cfg = _cfg(tiny_model_dir, tmp_path / "run", steps=4, device="cuda", **{
        "rollout.precision": "bf16", "algo.precision": "bf16", "algo.compile": compile})
    run_grpo(cfg, progress=False)
    before = dict(load_model(tiny_model_dir).named_parameters())
    after = dict(load_model(tmp_path / "run" / "final").named_parameters())
    assert not [n for n, p in after.items() if torch.equal(p, before[n])]
    metrics = read_metrics(tmp_path / "run")
    assert len(metrics) == 4
    assert all(0 <= m["rollout/logprob_mismatch_kl"] < 1e-2 for m in metrics)
