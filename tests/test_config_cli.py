"""Bad input gets one clear message and a non-zero exit, no traceback (acceptance 5)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from typing import Literal

import pytest

from rlvr.cli import main
from rlvr.config import load_config, save_config, read_yaml
from rlvr.errors import ConfigError
from rlvr.train.grpo import GRPOConfig


@dataclass
class Inner:
    lr: float = 1e-3
    mode: Literal["a", "b"] = "a"


@dataclass
class Outer:
    inner: Inner = field(default_factory=Inner)
    steps: int = 3
    names: list[str] = field(default_factory=lambda: ["x"])


def test_overrides_and_yaml(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("steps: 7\ninner:\n  mode: b\n")
    cfg = load_config(Outer, recipe, ["inner.lr=1e-5", "names=[p, q]"])
    assert cfg == Outer(inner=Inner(lr=1e-5, mode="b"), steps=7, names=["p", "q"])


@pytest.mark.parametrize(
    "cls, override, needle",
    [
        (Outer, ["inner.lrr=1"], "unknown config key 'inner.lrr'; allowed keys in 'inner': lr, mode"),
        (Outer, ["steps=x"], "config key 'steps' must be int, got str 'x'"),
        (Outer, ["steps=1.5"], "config key 'steps' must be int"),
        (Outer, ["inner.mode=c"], "config key 'inner.mode' = 'c' is not allowed; choose one of: ['a', 'b']"),
        (Outer, ["inner=3"], "config key 'inner' must be a mapping"),
        (GRPOConfig, ["domain_weights={tool.use: 2}"],
         "config key 'domain_weights' = 'tool.use' is not allowed; choose one of"),
        (GRPOConfig, ["domain_weights={math.arith: -1}"],
         "config key 'domain_weights.math.arith' = -1.0 must be in [0.0, inf]"),
        (GRPOConfig, ["domain_weights={math.arith: 0, math.word: 0}"],
         "config key 'domain_weights': every training domain"),
    ],
)
def test_config_errors_name_the_key(cls, override, needle):
    with pytest.raises(ConfigError) as err:
        load_config(cls, None, override)
    assert needle in str(err.value)


def test_resolved_config_roundtrips(tmp_path):
    cfg = load_config(GRPOConfig, None, ["algo.advantage=rloo", "rollout.samples_per_task=4"])
    save_config(cfg, tmp_path / "config.yaml")
    again = load_config(GRPOConfig, tmp_path / "config.yaml")
    assert again == cfg
    assert read_yaml(tmp_path / "config.yaml")["algo"]["clip_high"] == 0.28  # defaults written out


def test_registry_choice_validated():
    with pytest.raises(ConfigError, match="algo.advantage.*choose one of: \\['dr_grpo', 'gae', 'grpo', "
                                          "'reinforce_pp', 'reinforce_pp_baseline', 'rloo'\\]"):
        load_config(GRPOConfig, None, ["algo.advantage=ppo"])


@pytest.mark.parametrize("key", ["rollout.precision", "algo.precision"])
def test_precision_choice_validated(key):
    with pytest.raises(ConfigError, match=f"{key}.*choose one of: \\['model', 'bf16'\\]"):
        load_config(GRPOConfig, None, [f"{key}=fp16"])
    assert load_config(GRPOConfig, None, [f"{key}=bf16"]) is not None


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["train", "--set", "algo.lr=1"], "unknown config key 'algo.lr'"),
        (["train", "--set", "steps=many"], "config key 'steps' must be int"),
        (["sft", "--set", "model=/nonexistent/model", "--out", "{tmp}/sft"], "/nonexistent/model"),
        (["eval", "--model", "{tmp}/missing"], "does not exist"),
        (["train", "-c", "{tmp}/nope.yaml"], "config file"),
        (["train", "--set", "device=gpu"], "config key 'device' = 'gpu' is not a device"),
        (["eval", "--model", "{tmp}/missing", "--set", "device=tpu"], "config key 'eval.device'"),
    ],
)
def test_cli_user_errors_exit_nonzero_without_traceback(argv, needle, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_a_one_line_error_naming_the_key(tmp_path, capsys):
    assert main(["train", "--set", "device=cuda", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "config key 'device' = 'cuda', but torch sees no CUDA device" in err and "Traceback" not in err


def test_console_script_exit_code(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rlvr.cli", "eval", "--model", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "rlvr: error:" in proc.stderr and "rlvr pretrain" in proc.stderr


def test_overriding_one_key_of_a_section_keeps_the_parents_defaults_for_the_rest():
    from rlvr.config import load_config
    from rlvr.train.quickstart import QuickstartConfig

    default = QuickstartConfig()
    cfg = load_config(QuickstartConfig, None, ["grpo.steps=7", "grpo.rollout.temperature=0.5"])
    assert cfg.grpo.steps == 7 and cfg.grpo.rollout.temperature == 0.5
    assert cfg.grpo.domains == default.grpo.domains  # not GRPOConfig's own default domains
    assert cfg.grpo.rollout.max_new_tokens == default.grpo.rollout.max_new_tokens
    assert cfg.grpo.sandbox.allow_weak == default.grpo.sandbox.allow_weak


@pytest.mark.parametrize("name, kind", [("quickstart.yaml", "quickstart"), ("agentic.yaml", "quickstart"),
                                        ("grpo_math.yaml", "grpo"), ("professional.yaml", "quickstart"),
                                        ("professional_code.yaml", "quickstart"), ("professional_cad.yaml", "quickstart")])
def test_shipped_recipes_parse(name, kind):
    """Every file in configs/ resolves into its config type (a typo in a recipe fails here, not
    an hour into a run)."""
    from pathlib import Path

    from rlvr.config import from_dict
    from rlvr.train.quickstart import QuickstartConfig

    path = Path(__file__).resolve().parents[1] / "configs" / name
    cfg = from_dict(QuickstartConfig if kind == "quickstart" else GRPOConfig, read_yaml(path))
    grpo = cfg.grpo if kind == "quickstart" else cfg
    assert grpo.steps > 0 and grpo.domains
    if name == "agentic.yaml":  # the per-domain override reaches the reward of tool.use only
        assert grpo.reward.for_domain("tool.use").outcome == "score"
        assert grpo.reward.for_domain("code.repair").outcome == "binary"
