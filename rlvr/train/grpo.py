"""GRPO-family RL from verifiable rewards: the training loop, read top to bottom.

One step:  batch = source.next()          which tasks (curriculum), then n samples per task
                                           (``rollout``: exact tokens + sampling logprobs; multi-turn
                                           tasks play episodes in their environments), then
                                           ``verify_and_reward``: verdict -> reward terms
           monitor.screen()                reward-hack detectors on the samples: alert, zero, stop
           select_samples()                zero-variance groups dropped (dynamic sampling, in the
                                           source, refilled them: ``algo.dynamic_sampling_rounds``)
           prepare()                       the kept samples collated once, and the no-grad forwards
                                           on them: the reference's log-probs (KL), the teacher's
                                           (``distill``), the critic's values (``algo.advantage: gae``)
           compute_advantages()            ADVANTAGES[...] per group over the kept samples' rewards
                                           (less the KL penalty: ``algo.kl_in_reward``), or GAE over
                                           the critic's values; the teacher's per-token reverse-KL
                                           signal added, or alone
           update()                        truncated rows out (``algo.overlong_filter``), then the
                                           policy loss's epochs over mini/micro-batches (and the
                                           critic's)
           source.push(model)              the rollout side gets the new weights
           log, eval, checkpoint           metrics.jsonl + TensorBoard, sampled trajectories, the
                                           detectors over the metrics (docs/monitoring.md);
                                           checkpoints atomic, resumable
Algorithm variants live in registries (``rlvr.algos``); this file never branches on their names
(the learned critic, ``uses_critic``, is a component it builds, not a registry entry).

Batches come from a ``RolloutSource`` (``rlvr.rollout.source``): ``next`` gives the verified
batch of a step, ``push`` takes the weights after the update. The default (``SyncRollout``) runs
the curriculum, rollout and verify phases in this thread with the trainer's own model; in
asynchronous mode (``asynchronous.enabled``, docs/async.md) ``AsyncRollout`` generates and
verifies in background threads on an engine copy, batches at most ``max_staleness`` versions old,
and the update corrects stale samples with truncated IS weights (``rlvr.algos.off_policy``).
With ``backend: ray`` the same sources run their generate and verify phases on Ray actors
(``rlvr.workers``) and ``rlvr.train.ray_train`` runs this loop in a trainer actor.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.progress import Progress
from torch.nn.attention import SDPBackend, sdpa_kernel

from rlvr.algos.advantages import ADVANTAGES, group_has_variance
from rlvr.algos.distill import reverse_kl, reverse_kl_advantages
from rlvr.algos.kl import KL_ESTIMATORS, kl_reward_penalty, logprob_mismatch_kl, masked_kl
from rlvr.algos.losses import AGGREGATIONS, POLICY_LOSSES
from rlvr.algos.off_policy import correct_off_policy
from rlvr.config import check_choice, check_device, check_range, resolve_device, to_dict
from rlvr.curriculum.config import CurriculumConfig
from rlvr.curriculum.plots import curriculum_plot
from rlvr.curriculum.pool import TaskPool
from rlvr.curriculum.scheduler import Curriculum
from rlvr.errors import ConfigError
from rlvr.eval.evaluate import EvalConfig, evaluate
from rlvr.eval.suites import fingerprint, get_suite, tasks_of
from rlvr.model.checkpoint import (
    latest_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    save_model_dir,
)
from rlvr.model.load import ModelLoadConfig, load_model_and_tokenizer
from rlvr.model.lora import LoraConfig, adapters_off, load_for_training, sampling_weights, save_final
from rlvr.monitor.alerts import AlertLog, RunStopped, read_alerts
from rlvr.monitor.config import MonitorConfig
from rlvr.monitor.metrics import MetricsLogger, read_metrics
from rlvr.monitor.trackers import TrackerConfig, open_trackers
from rlvr.monitor.watch import Monitor
from rlvr.rewards import RewardConfig, score_all
from rlvr.envs.base import EnvConfig
from rlvr.rollout.async_rollout import AsyncConfig, AsyncRollout, parity_kl
from rlvr.rollout.sharded import ShardedPhases
from rlvr.rollout.source import RolloutBatch, RolloutSource
from rlvr.rollout.sync_rollout import SyncRollout
from rlvr.model.logprobs import sequence_logprobs
from rlvr.rollout.engine import PRECISIONS, SamplingParams, precision_autocast
from rlvr.rollout.episodes import EnvPool, Episode, run_tasks
from rlvr.verifiers.judge import judge
from rlvr.sandbox.config import SandboxConfig, shared_sandbox
from rlvr.tasks.files import drop_failing
from rlvr.tasks.rows import TaskFileConfig, as_file_config
from rlvr.tasks.sets import build_task_set, file_tasks, needs_sandbox
from rlvr.tasks.validate import refuse_eval_tasks
from rlvr.train.allocator import keep_freed_memory
from rlvr.train.code_tools import code_tools
from rlvr.train.batching import collate, select
from rlvr.train.compiled import compiled_layers
from rlvr.train.critic import CRITIC_DIR, GAE, Critic, CriticConfig, critic_advantages
from rlvr.train.distributed import (
    DistributedConfig,
    Group,
    all_reduce_grads,
    barrier,
    close_group,
    from_rank0,
    gather,
    launched,
    open_group,
    rank_device,
)
from rlvr.train.teacher import DistillConfig, load_teacher
from rlvr.train.memory import checkpointing, enable_activation_checkpointing
from rlvr.train.packing import packed_logprobs
from rlvr.train.common import (
    OptimConfig,
    Timer,
    build_optimizer,
    clip_and_step,
    prepare_run_dir,
    restore_training_state,
    seed_everything,
    training_state,
)
from rlvr.types import Batch, Scored, Task
from rlvr.workers.config import RayConfig
from rlvr.rollout.engines import ENGINES, EngineSetup, EngineSource, RolloutEngine
from rlvr.rollout.remote_engine import RemoteConfig
from rlvr.rollout.vllm_engine import VLLMConfig, require_vllm

BACKENDS = ("local", "ray")


@dataclass
class RolloutConfig:
    tasks_per_step: int = 16
    """Tasks (prompts) per RL step."""
    samples_per_task: int = 8
    """Samples per task: the group size G."""
    max_new_tokens: int = 48
    """Generation budget per sample, in tokens."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    batch_size: int = 256
    """Sequences decoded together."""
    precision: str = "model"
    """model | bf16: the engine's matrix multiplies in the model's dtype or in bfloat16 (the
    rest in the model's dtype; ``SamplingParams.precision``, docs/rollout.md)."""
    engine: str = "rlvr"
    """rlvr | vllm | remote: what generates the rollouts: rlvr's own engine on the trainer's model,
    vLLM in this process on its GPU (the ``vllm`` extra), or an OpenAI-compatible server
    (``rollout.remote.*``); the last two get the weights after each update (``rlvr.rollout.engines``,
    docs/rollout.md "vLLM engine", "Remote engines"). Eval always uses rlvr's engine."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """With ``engine: vllm``: vLLM's memory share, dtype, CUDA graphs, context, canary tolerance."""
    remote: RemoteConfig = field(default_factory=RemoteConfig)
    """With ``engine: remote``: the server's URL, keys, model name, concurrency, weight push, canary."""

    def __post_init__(self) -> None:
        check_choice("rollout.precision", self.precision, list(PRECISIONS))
        check_choice("rollout.engine", self.engine, ENGINES.names())
        if self.engine == "vllm":
            require_vllm()  # the extra and CUDA, named in one line
            if self.precision != "model":
                raise ConfigError("config key 'rollout.precision' is rlvr's engine's; with 'rollout.engine: vllm' "
                                  "set 'rollout.vllm.dtype' instead")
        if self.engine == "remote":
            self.remote.require()
            if self.precision != "model":
                raise ConfigError("config key 'rollout.precision' is rlvr's engine's; with 'rollout.engine: remote' "
                                  "the server's own settings decide its precision")
        check_range("rollout.tasks_per_step", self.tasks_per_step, 1)
        check_range("rollout.samples_per_task", self.samples_per_task, 1)
        check_range("rollout.temperature", self.temperature, 0.0)
        check_range("rollout.top_p", self.top_p, 0.0, 1.0)


def refuse_with_engine(cfg) -> None:
    """What a rollout engine other than rlvr's (``rollout.engine``) does not run with: it gets the
    weights from the synchronous loop after each update, in this process, as full state dicts."""
    engine = cfg.rollout.engine
    if engine == "rlvr":
        return
    refuse_outside_sync_loop(cfg, f"'rollout.engine: {engine}'", "that engine runs in the synchronous local loop "
                             "and takes full weights", "rollout.engine: rlvr")
    if launched().world > 1:
        raise ConfigError(f"'rollout.engine: {engine}' does not run under torchrun ({launched().world} processes): "
                          "data parallel deals rollout chunks to the ranks' own rlvr engines; use rollout.engine: rlvr")
    if engine == "vllm" and cfg.device == "cpu":
        raise ConfigError("config key 'device' = 'cpu' with 'rollout.engine: vllm': vLLM shares the trainer's "
                          "CUDA GPU; set device: cuda (or auto)")


def refuse_outside_sync_loop(cfg, what: str, why: str, instead: str) -> None:
    """``what`` runs only in the synchronous local loop on full weights: refuse asynchronous mode,
    ``backend: ray`` and LoRA, naming the key, ``why`` and the alternative (``instead``)."""
    for on, key in ((cfg.asynchronous.enabled, "asynchronous.enabled"), (cfg.backend == "ray", "backend"),
                    (cfg.lora.enabled, "lora.enabled")):
        if on:
            raise ConfigError(f"config key '{key}' does not work with {what}: {why} (set asynchronous.enabled: "
                              f"false, backend: local, lora.enabled: false; or {instead})")


@dataclass
class AlgoConfig:
    advantage: str = "grpo"
    """Advantage estimator: grpo | dr_grpo | rloo | reinforce_pp | reinforce_pp_baseline (registry
    ADVANTAGES) | gae (PPO with a learned critic, ``critic.*``: token advantages by GAE over the
    critic's values; docs/algorithms.md)."""
    policy_loss: str = "ppo_clip"
    """Policy loss: ppo_clip | gspo | cispo (registry POLICY_LOSSES)."""
    aggregation: str = "token_mean"
    """token_mean (DAPO) | seq_mean_token_mean (GRPO) | seq_mean_token_sum_norm (Dr. GRPO)."""
    clip_low: float = 0.2
    """PPO clip range below 1 (epsilon_low)."""
    clip_high: float = 0.28
    """PPO clip range above 1 (epsilon_high; > clip_low is DAPO clip-higher)."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the frozen initial policy (0 = off, no reference model)."""
    kl_estimator: str = "k3"
    """KL estimator: k1 | k2 | k3 (registry KL_ESTIMATORS)."""
    kl_in_reward: bool = False
    """With ``kl_coef`` > 0: the KL to the reference in the reward instead of the loss. Each kept
    sample's reward becomes r - kl_coef * sum_t kl_t over its policy tokens (``kl_estimator`` on the
    sampling log-probs against the reference's) before the advantage estimator, and the loss has no
    KL term (``rlvr.algos.kl.kl_reward_penalty``; metric ``rollout/kl_penalty_mean``)."""
    drop_zero_variance: bool = True
    """Drop groups whose rewards are all equal (they carry no signal). Not applied with
    ``advantage: gae``: the critic's advantages of such samples are not zero, and it learns from them."""
    dynamic_sampling_rounds: int = 0
    """DAPO dynamic sampling without the curriculum (Yu et al. 2025, Sec. 3.2): for the groups whose
    rewards are all equal, draw, roll out and verify more tasks, up to this many extra rounds, until
    the batch has ``rollout.tasks_per_step`` groups with signal (0 = off: those groups are only
    dropped). Metrics ``dynamic_sampling/rounds``, ``/groups_drawn``, ``/zero_variance_frac``. With
    the curriculum use ``curriculum.filter.refill_rounds`` instead; not in asynchronous mode."""
    overlong_filter: bool = False
    """DAPO overlong filtering (Yu et al. 2025, Sec. 3.4): samples cut at the length limit
    (``finish_reason == "length"``) keep their place in their group's advantages, but their rows
    leave the update (metric ``train/overlong_filtered_frac``). Distinct from ``reward.overlong``,
    which changes the reward of long samples."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    minibatch_size: int = 0
    """Samples per optimizer step (0 = the whole rollout batch: one step per epoch)."""
    microbatch_size: int = 64
    """Samples per forward/backward; gradients accumulate up to the mini-batch."""
    packing: bool = True
    """Padding-free training forward (``rlvr.train.packing``): sequences packed end to end with a
    block-diagonal causal mask when that saves >= 10% of the token slots (else the padded rows with
    a causal-only mask), and the LM head on policy tokens only. Same loss and gradients as the
    plain padded forward; false for a model whose attention takes no 4D mask (FlashAttention-2)."""
    share_prompts: bool = True
    """With packing: the samples of a group that start with the same prompt run it once per packed
    row instead of once each (``rlvr.train.packing.shared_prompts``); same loss and gradients."""
    precision: str = "model"
    """model | bf16: the training forward and backward in the model's dtype, or under
    ``torch.autocast`` to bfloat16 (weights, gradients, optimizer state and the loss math stay in
    the model's dtype; log-probs are computed in float32 from bf16 logits)."""
    compile: bool = False
    """``torch.compile`` the policy's decoder layers for the training forward and backward
    (``rlvr.train.compiled``): fused elementwise kernels, same loss and gradients; one compile of
    about 20-30 s per run on CPU (needs a C++ compiler there). The rollout engine stays eager."""
    logits_chunk: int = 0
    """Policy tokens whose logits the update computes at a time (``rlvr.train.chunked_head``; with
    ``packing``): a long batch never holds all its N x vocabulary logits. 0: all at once."""
    gradient_checkpointing: bool = False
    """Activation checkpointing in the update (``rlvr.train.memory``): decoder layers recompute
    their activations in the backward; less memory, about one more forward of time. Same loss and
    gradients."""

    def __post_init__(self) -> None:
        check_choice("algo.advantage", self.advantage, [*ADVANTAGES.names(), GAE])
        check_choice("algo.policy_loss", self.policy_loss, POLICY_LOSSES.names())
        check_choice("algo.aggregation", self.aggregation, AGGREGATIONS.names())
        check_choice("algo.kl_estimator", self.kl_estimator, KL_ESTIMATORS.names())
        check_choice("algo.precision", self.precision, list(PRECISIONS))
        check_range("algo.ppo_epochs", self.ppo_epochs, 1)
        check_range("algo.microbatch_size", self.microbatch_size, 1)
        check_range("algo.minibatch_size", self.minibatch_size, 0)
        check_range("algo.logits_chunk", self.logits_chunk, 0)
        check_range("algo.kl_coef", self.kl_coef, 0.0)
        check_range("algo.dynamic_sampling_rounds", self.dynamic_sampling_rounds, 0)
        if self.kl_in_reward and not self.kl_coef > 0:
            raise ConfigError("config key 'algo.kl_in_reward' needs 'algo.kl_coef' > 0 (the weight of the KL penalty "
                              "in the reward); with algo.kl_coef: 0 there is no reference model")
        if self.dynamic_sampling_rounds and not self.drop_zero_variance:
            raise ConfigError("config key 'algo.dynamic_sampling_rounds' refills the zero-variance groups that "
                              "'algo.drop_zero_variance' drops: set algo.drop_zero_variance: true")
        if self.compile and self.gradient_checkpointing:
            raise ConfigError("config keys 'algo.compile' and 'algo.gradient_checkpointing' cannot both be true: "
                              "the compiled layers are not recomputed in the backward")


@dataclass
class GRPOConfig:
    model: str = "runs/sft/final"
    """Hugging Face causal-LM directory to start from."""
    model_load: ModelLoadConfig = field(default_factory=ModelLoadConfig)
    """How the model directory is loaded: dtype, trust_remote_code, chat_template."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters instead of full fine-tuning (docs/lora.md): the engine samples from the merged
    weights, the KL reference is the model with adapters off (no reference model loaded)."""
    out: str = "runs/grpo"
    """Run directory (config, metrics, checkpoints, final model)."""
    seed: int = 0
    """Seed for the task pool, sampling and update order."""
    device: str = "cpu"
    """Where the policy (and the reference model) train and generate: cpu | cuda | cuda:N | auto
    (cuda when torch sees a GPU, else cpu). The run's one CPU generator drives task order, update
    order and sampling on any device (the engine draws its uniforms on it), so a resumed run
    draws the same random numbers wherever it runs."""
    domains: list[str] = field(default_factory=lambda: ["math.arith", "math.word"])
    """Built-in training domains (may be empty when ``task_files`` supply the tasks)."""
    levels: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    """Difficulty levels in the pool."""
    train_tasks: int = 4000
    """Size of the training task pool (train split)."""
    domain_weights: dict[str, float] = field(default_factory=dict)
    """Relative share of each training domain in the pool, e.g. ``{code.repair: 3}`` (a domain
    not named weighs 1; empty: equal shares)."""
    task_files: list[TaskFileConfig | str] = field(default_factory=list)
    """The user's task files added to the pool: a path, or a mapping of ``TaskFileConfig`` keys
    (path, map, verifier, options, reward, system_prompt, instruction, domain, split, level;
    docs/tasks.md). A malformed row stops the run naming file, line and field; a task whose own
    answer fails its acceptance criteria is dropped, and the run says how many were."""
    allow_eval_tasks: bool = False
    """Train on tasks that are also eval tasks (``eval.task_files``) or were written from an eval
    result (``rlvr tasks from-failures``); refused by default."""
    steps: int = 100
    """RL steps (one rollout batch each)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-4, warmup_steps=5))
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Where model-written code runs; opened only when a domain's verifier executes code."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Budgets of multi-turn episodes (turns, tokens per turn and per episode, context, wall)."""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(tasks=100))
    """Periodic eval suite (eval split)."""
    eval_suite: str = ""
    """The periodic eval's task set as a named suite or a suite YAML file (``rlvr eval suites``,
    docs/evaluation.md), e.g. ``all`` for a full sweep of every built-in domain; empty: the draw that
    ``eval.domains``, ``eval.tasks``, ``eval.levels`` and ``eval.seed`` describe."""
    eval_every: int = 0
    """Evaluate every this many steps (0 = never during training), writing eval/step_N.json; with
    ``eval.task_files`` (``--eval-tasks``) the final model is also evaluated (eval/final.json)."""
    checkpoint_every: int = 25
    """Write a resumable checkpoint every this many steps (and at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk."""
    save_trajectories_every: int = 1
    """Write the sampled share of a step's samples (``monitor.sample_share``) to
    trajectories/step_N.jsonl every this many steps; flagged samples are written at every step."""
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    """Detectors of reward hacking and training trouble, their thresholds and actions (log, zero
    the flagged rewards, stop), and the trajectory sample (docs/monitoring.md)."""
    trackers: TrackerConfig = field(default_factory=TrackerConfig)
    """Experiment trackers beside metrics.jsonl and TensorBoard (``rlvr.monitor.trackers``): mlflow, wandb
    (offline; docs/monitoring.md)."""
    backend: str = "local"
    """local: rollouts and verification in this process (the reference); ray: on Ray actors
    (rollout engine copies, verifier sandbox pools) and the trainer itself an actor restarted from
    its last checkpoint when lost (``rlvr.workers``, docs/distributed.md)."""
    ray: RayConfig = field(default_factory=RayConfig)
    """With ``backend: ray``: the cluster's address, workers and resources per role, retries."""
    asynchronous: AsyncConfig = field(default_factory=AsyncConfig)
    """Asynchronous mode: generation, verification and updates overlap (docs/async.md)."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """Data parallel under torchrun: the process group's backend and the rollout chunks dealt to
    the ranks (``rlvr.train.distributed``, docs/distributed.md)."""
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    """Which tasks each step draws: uniform over the pool (default) or the scheduler (domain mix,
    easy-to-hard stages, filtering and dynamic sampling, recycling, seesaw control;
    docs/curriculum.md)."""
    distill: DistillConfig = field(default_factory=DistillConfig)
    """On-policy distillation: a teacher's per-token log-probs on the student's samples as a
    reverse-KL signal, added to the verifiable reward's advantages or alone (docs/algorithms.md)."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """With ``algo.advantage: gae`` (PPO with a learned critic): the value model, its optimizer,
    GAE's gamma and lambda, value clipping, advantage whitening (``rlvr.train.critic``)."""

    def __post_init__(self) -> None:
        check_device("device", self.device)
        check_choice("backend", self.backend, BACKENDS)
        refuse_with_engine(self)
        check_range("steps", self.steps, 1)
        self.task_files = [as_file_config(f) for f in self.task_files]
        if not self.domains and not self.task_files:
            raise ConfigError("no training tasks: set 'domains' (built-in) or 'task_files' (--tasks FILE)")
        check_range("checkpoint_every", self.checkpoint_every, 1)
        check_range("save_trajectories_every", self.save_trajectories_every, 1)
        if self.eval_suite:
            get_suite(self.eval_suite)  # an unknown name or a bad file stops here, naming it
        for name, w in self.domain_weights.items():
            check_choice("domain_weights", name, self.domains)
            check_range(f"domain_weights.{name}", w, 0.0)
        if self.domain_weights and not any(self.domain_weights.get(d, 1.0) > 0 for d in self.domains):
            raise ConfigError("config key 'domain_weights': every training domain weighs 0")
        if self.lora.enabled and (self.asynchronous.enabled or self.backend == "ray"):
            raise ConfigError("config key 'lora.enabled' works with the synchronous local rollout only: set "
                              "'asynchronous.enabled: false' and 'backend: local' (engine copies and Ray actors "
                              "take full state dicts, not adapters; docs/lora.md)")
        if self.curriculum.enabled and self.asynchronous.enabled:
            raise ConfigError("config keys 'curriculum.enabled' and 'asynchronous.enabled' cannot both be true: "
                              "the scheduler learns from each batch before drawing the next, which the "
                              "asynchronous producer (drawing ahead) does not allow")
        refuse_sampling_options(self)
        refuse_data_parallel(self, launched().world)
        refuse_with_critic(self, launched().world)


def refuse_sampling_options(cfg: GRPOConfig) -> None:
    """The combinations dynamic sampling (``algo.dynamic_sampling_rounds``) and distillation
    (``distill.teacher``) do not run with."""
    a, c = cfg.algo, cfg.curriculum
    if a.dynamic_sampling_rounds and c.enabled and c.filter.enabled and c.filter.refill_rounds:
        raise ConfigError("config keys 'algo.dynamic_sampling_rounds' and 'curriculum.filter.refill_rounds' both "
                          "refill zero-variance groups: with the curriculum set curriculum.filter.refill_rounds only "
                          "(and algo.dynamic_sampling_rounds: 0)")
    if a.dynamic_sampling_rounds and cfg.asynchronous.enabled:
        raise ConfigError("config key 'algo.dynamic_sampling_rounds' works with the synchronous rollout only: the "
                          "asynchronous producer draws ahead of the update (set asynchronous.enabled: false)")
    d = cfg.distill
    if not d.enabled:
        return
    for on, key in ((cfg.asynchronous.enabled, "asynchronous.enabled"), (cfg.backend == "ray", "backend"),
                    (a.advantage not in ADVANTAGES.names(), "algo.advantage")):
        if on:
            raise ConfigError(f"config key 'distill.teacher' runs in the synchronous local loop with a group "
                              f"estimator (ADVANTAGES) only: set '{key}' to one (asynchronous.enabled: false, "
                              "backend: local, algo.advantage: grpo)")
    if launched().world > 1:
        raise ConfigError(f"config key 'distill.teacher' does not run under torchrun ({launched().world} processes)")
    if d.alone and (a.dynamic_sampling_rounds or a.kl_in_reward):
        key = "algo.dynamic_sampling_rounds" if a.dynamic_sampling_rounds else "algo.kl_in_reward"
        raise ConfigError(f"config key '{key}' acts on the verifiable reward, which 'distill.mode: alone' does not "
                          "use: set distill.mode: add, or turn it off")


def refuse_data_parallel(cfg: GRPOConfig, world: int) -> None:
    """The combinations a data-parallel run (world size > 1, torchrun) does not support."""
    if world == 1:
        return
    if cfg.backend != "local":
        raise ConfigError(f"config key 'backend' = {cfg.backend!r} with {world} torchrun processes: data parallel "
                          "needs 'backend: local' (Ray runs its own actors; launch it without torchrun)")
    if cfg.asynchronous.enabled:
        raise ConfigError(f"config key 'asynchronous.enabled' must be false with {world} torchrun processes: the "
                          "ranks share each step's batch synchronously (docs/distributed.md)")
    if not cfg.distributed.rollout_chunk:
        raise ConfigError(f"config key 'distributed.rollout_chunk' must be > 0 with {world} torchrun processes "
                          "(tasks per rollout chunk, dealt to the ranks; e.g. rollout.tasks_per_step / "
                          f"{world} = {max(1, cfg.rollout.tasks_per_step // world)})")


def uses_critic(cfg: GRPOConfig) -> bool:
    """PPO with a learned critic (``algo.advantage: gae``): the run builds, trains and checkpoints one."""
    return cfg.algo.advantage == GAE


def refuse_with_critic(cfg: GRPOConfig, world: int) -> None:
    """What PPO with a learned critic does not run with: the critic lives in the synchronous local
    trainer process, as one full model."""
    if not uses_critic(cfg):
        return
    refuse_outside_sync_loop(cfg, "'algo.advantage: gae' (a learned critic)", "the critic is a full model trained "
                             "in the synchronous local loop", "a group estimator such as grpo")
    if cfg.algo.dynamic_sampling_rounds:
        raise ConfigError("config key 'algo.dynamic_sampling_rounds' refills zero-variance groups, which "
                          "'algo.advantage: gae' keeps and trains on (the critic's advantages are not zero there): "
                          "set algo.dynamic_sampling_rounds: 0")
    if world > 1:
        raise ConfigError(f"'algo.advantage: gae' (a learned critic) does not run under torchrun ({world} processes): "
                          "the critic is not data parallel; run one process or use a group estimator such as grpo")


# --------------------------------------------------------------------------- the story


def run_grpo(cfg: GRPOConfig, *, resume: bool = False, progress: bool = True) -> dict:
    run = setup(cfg, resume)
    source = rollout_source(run, cfg)
    try:
        with Progress(disable=not progress or not run.group.is_main, transient=True) as bar:
            job = bar.add_task("grpo", total=cfg.steps, completed=run.step)
            for step in range(run.step + 1, cfg.steps + 1):
                timer = Timer()
                with timer("wait"):
                    batch = source.next(trainer_version=step - 1)
                with timer("monitor"):
                    scored = run.monitor.screen(step, batch.scored)  # sample detectors: alert, zero or stop
                with timer("advantage"):
                    kept = select_samples(scored, cfg)  # zero-variance groups dropped
                with timer("prepare"):
                    prepared = prepare(run, kept, cfg)  # collated once; reference, teacher log-probs; values
                with timer("advantage"):
                    advantage_metrics = compute_advantages(prepared, cfg)
                with timer("update"):
                    train_metrics = update(run, prepared, cfg)
                with timer("weight_sync"):
                    source.push(run.model, version=step)
                run.pool_state = batch.pool_state
                metrics = {**rollout_metrics(scored, kept), **advantage_metrics, **train_metrics, **run.monitor.counts,
                           **mismatch_metric(run, batch, train_metrics, cfg), **source.metrics(batch, step - 1)}
                if cfg.eval_every and step % cfg.eval_every == 0:
                    with timer("eval"):
                        metrics.update(periodic_eval(run, cfg, step))
                run.step = step
                run.logger.log(step, {**metrics, **timer.pop()})
                run.monitor.keep(step, scored)  # trajectories/step_N.jsonl: the sampled share + the flagged
                run.monitor.watch(step, metrics)  # step detectors over the metrics history: alert or stop
                if step % cfg.checkpoint_every == 0 or step == cfg.steps:
                    checkpoint(run, cfg)
                bar.update(job, advance=1, description=f"grpo reward {metrics['rollout/reward_mean']:.2f}")
    except RunStopped as stop:
        stopped(run, cfg, stop)
        raise
    finally:
        source.close()
    run.logger.close()
    if run.envs is not None:
        run.envs.close()
    if run.group.is_main:  # data parallel: the ranks' weights are the same, rank 0 writes them
        save_final_model(run, cfg)
    out = {"steps": cfg.steps, "seconds": time.perf_counter() - run.started}
    if cfg.eval.task_files:  # the user's held-out file: the final model's report
        report = eval_report(run, cfg, run.dir / "eval" / "final.json")
        out.update({"eval/pass@1": report["overall"]["pass@1"], "eval_report": str(run.dir / "eval" / "final.json")})
    close_group()
    return out


def save_final_model(run: Run, cfg: GRPOConfig) -> None:
    """``final/`` (and the curriculum's report and plot)."""
    if run.lora is not None:  # merged (a plain model) or the adapter, as lora.save says
        run.model = save_final(run.dir / "final", run.lora, run.tokenizer, cfg.lora)
        run.lora = run.lora if cfg.lora.save == "adapter" else None  # merged: the adapters are in the weights now
    else:
        save_model_dir(run.dir / "final", run.model, run.tokenizer)
    if cfg.curriculum.enabled:
        (run.dir / "curriculum.json").write_text(json.dumps(
            {"events": run.pool.events, "frontier": run.pool.frontier, "tasks": run.pool.task_report()}, indent=1))
        curriculum_plot(read_metrics(run.dir), run.dir / "plots" / "curriculum.png", read_alerts(run.dir))


# --------------------------------------------------------------------------- phases


@dataclass
class Run:
    """Everything a step touches; checkpointed by ``checkpoint`` and restored by ``setup``."""

    cfg: GRPOConfig
    dir: Path
    model: torch.nn.Module
    tokenizer: object
    ref_model: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: object
    pool: TaskPool | Curriculum
    generator: torch.Generator
    logger: MetricsLogger
    step: int
    started: float
    sandbox: object | None = None  # the shared rlvr.sandbox.Sandbox when a domain runs model code
    envs: EnvPool | None = None  # environment instances of multi-turn tasks, reused step to step
    pool_state: dict | None = None  # async: pool state after the newest trained batch's draw
    eval_tasks: list[Task] = field(default_factory=list)  # the periodic eval suite, built once
    alerts: AlertLog | None = None  # alerts.jsonl (seesaw control, the detectors)
    monitor: Monitor | None = None  # the detectors and the trajectory sample
    lora: object | None = None  # lora.enabled: the PeftModel around ``model`` (its get_base_model())
    group: Group = field(default_factory=Group)  # data parallel (torchrun): this rank; world 1 without
    teacher: torch.nn.Module | None = None  # distill.teacher: frozen, on the policy's device
    critic: Critic | None = None  # algo.advantage: gae (PPO with a learned critic)


def setup(cfg: GRPOConfig, resume: bool) -> Run:
    keep_freed_memory()
    seed_everything(cfg.seed)
    group = launched()  # data parallel: rank 0 writes the run directory, the others log under ranks/
    run_dir = prepare_run_dir(cfg.out, cfg) if group.is_main else Path(cfg.out)
    log_dir = run_dir if group.is_main else run_dir / "ranks" / f"rank_{group.rank}"
    log_dir.mkdir(parents=True, exist_ok=True)  # the sandbox's audit log may open first
    ckpt = latest_checkpoint(run_dir) if resume else None
    device = rank_device(resolve_device("device", cfg.device))
    open_group(cfg.distributed, device)
    lora = None
    if cfg.lora.enabled:  # the base from cfg.model, the adapter (resume) from the checkpoint
        lora, model, tokenizer = load_for_training(cfg.model, cfg.lora, ckpt, device=device, options=cfg.model_load)
    else:
        model, tokenizer = load_model_and_tokenizer(str(ckpt) if ckpt else cfg.model, device=device, options=cfg.model_load)
    ref_model = None
    if cfg.algo.kl_coef > 0 and lora is None:  # with LoRA the reference is the model with adapters off
        ref_model, _ = load_model_and_tokenizer(cfg.model, device=device, options=cfg.model_load)
        ref_model.eval().requires_grad_(False)
    teacher = load_teacher(cfg.distill, cfg.model, tokenizer, device=device, options=cfg.model_load) \
        if cfg.distill.enabled else None
    user_tasks = file_tasks(cfg.task_files, check=False)
    # The process-wide sandbox (the code verifier runs there), opened with this run's config.
    sandbox = shared_sandbox(cfg.sandbox, log_dir) if needs_sandbox(cfg.domains, user_tasks) else None
    if user_tasks:  # each file task's own answer must pass its acceptance criteria
        user_tasks = drop_failing(user_tasks, ", ".join(f.path for f in cfg.task_files))[0]
    tasks = build_task_set(cfg.domains, "train", cfg.train_tasks, seed=cfg.seed, levels=cfg.levels,
                           weights=cfg.domain_weights) + user_tasks
    eval_tasks = eval_task_set(cfg) if cfg.eval_every or cfg.eval.task_files else []
    refuse_eval_tasks(tasks, eval_tasks, allowed=cfg.allow_eval_tasks, key="allow_eval_tasks")
    per_step = cfg.rollout.tasks_per_step * cfg.rollout.samples_per_task
    updates_per_step = cfg.algo.ppo_epochs * math.ceil(per_step / (cfg.algo.minibatch_size or per_step))
    if cfg.algo.gradient_checkpointing:
        enable_activation_checkpointing(model)
    optimizer, scheduler = build_optimizer(model, cfg.optim, cfg.steps * updates_per_step)
    critic = None
    if uses_critic(cfg):  # the value model: fresh from critic.model (or the start model), or the checkpoint's
        critic_steps = cfg.steps * cfg.critic.epochs * math.ceil(per_step / (cfg.algo.minibatch_size or per_step))
        kw = dict(device=device, total_steps=critic_steps, options=cfg.model_load, precision=cfg.algo.precision,
                  master_weights=cfg.optim.master_weights, packing=cfg.algo.packing,
                  share_prompts=cfg.algo.share_prompts)
        critic = Critic.load(ckpt / CRITIC_DIR, cfg.critic, **kw) if ckpt is not None else \
            Critic.build(cfg.critic, cfg.model, tokenizer=tokenizer, **kw)
    envs = EnvPool(cfg.env, sandbox) if any(t.multi_turn for t in tasks) else None
    pool = Curriculum(tasks, cfg.curriculum, cfg.seed) if cfg.curriculum.enabled else TaskPool(tasks, seed=cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed)
    step = 0
    if ckpt is not None:
        state = restore_training_state(ckpt, optimizer, scheduler, generator)
        pool.load_state_dict(state["pool"])
        step = state["step"]
    logger = MetricsLogger(log_dir, resume_step=step if resume else None, tensorboard=group.is_main,
                           trackers=open_trackers(cfg.trackers, run_dir, to_dict(cfg)) if group.is_main else ())
    alerts = AlertLog(log_dir, resume_step=step if resume else None)
    barrier()  # every rank's detectors start from rank 0's metrics history (truncated at the resumed step)
    monitor = Monitor(cfg.monitor, log_dir, alerts, cfg.reward, code_tools(), seed=cfg.seed,
                      history=read_metrics(run_dir), trajectories_every=cfg.save_trajectories_every)
    return Run(cfg, run_dir, model, tokenizer, ref_model, optimizer, scheduler, pool, generator, logger, step,
               time.perf_counter(), sandbox, envs, eval_tasks=eval_tasks, alerts=alerts, monitor=monitor, lora=lora,
               teacher=teacher, group=group, critic=critic)


def eval_task_set(cfg: GRPOConfig) -> list[Task]:
    """The periodic eval suite: ``eval_suite``'s tasks, or the eval split of ``eval.domains``; and the
    ``eval.task_files``."""
    e = cfg.eval
    if cfg.eval_suite:
        return tasks_of(get_suite(cfg.eval_suite)) + build_task_set([], "eval", 0, seed=e.seed, files=e.task_files)
    return build_task_set(e.domains, "eval", e.tasks, seed=e.seed, levels=e.levels, files=e.task_files)


def sampling_params(run: Run) -> SamplingParams:
    """The run's sampling settings (``params.n`` samples per task)."""
    r = run.cfg.rollout
    return SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
                          n=r.samples_per_task, stop_token_ids=[run.tokenizer.eos_token_id], precision=r.precision)


def generation(run: Run, tokenizer, engine: RolloutEngine | None = None) -> Callable:
    """The rollout phase as a source calls it: ``(model, tasks, version, envs, generator) ->
    episodes`` under the run's sampling settings; ``engine`` None: rlvr's engine on ``model``."""
    params, batch_size = sampling_params(run), run.cfg.rollout.batch_size

    def generate(model, tasks: list[Task], version: int, envs: EnvPool | None, generator) -> list[Episode]:
        return run_tasks(model, tokenizer, tasks, params, envs, generator=generator, policy_version=version,
                         batch_size=batch_size, engine=engine)

    return generate


def rollout(run: Run, tasks: list[Task], policy_version: int, engine: RolloutEngine | None = None) -> list[Episode]:
    """One batch of episodes from the trainer's model (or ``engine``), as the synchronous source makes it."""
    run.model.eval()
    with sampling(run) as model:  # LoRA: the merged weights
        return generation(run, run.tokenizer, engine)(model, tasks, policy_version, run.envs, run.generator)


def sampling(run: Run):
    """The model the engine samples from: the trainer's, merged with its LoRA adapters if any."""
    return sampling_weights(run.lora) if run.lora is not None else contextlib.nullcontext(run.model)


def dynamic_sampling(cfg: GRPOConfig) -> dict:
    """The synchronous sources' refill settings: the curriculum's ``filter.refill_rounds`` (metrics
    ``curriculum/*``) or ``algo.dynamic_sampling_rounds`` (metrics ``dynamic_sampling/*``)."""
    c = cfg.curriculum
    if c.enabled and c.filter.enabled and c.filter.refill_rounds:
        return {"refill_rounds": c.filter.refill_rounds, "refill_metrics": "curriculum"}
    return {"refill_rounds": cfg.algo.dynamic_sampling_rounds, "refill_metrics": "dynamic_sampling"}


def engine_source(run: Run, cfg: GRPOConfig) -> RolloutSource:
    """The synchronous phases generating on the ``rollout.engine`` engine (``rlvr.rollout.engines``),
    which gets the trainer's weights after each update and must serve each batch's version."""
    setup = EngineSetup(run.model, run.tokenizer, cfg.rollout, run.dir, cfg.model, run.step, cfg.seed)
    engine = ENGINES.get(cfg.rollout.engine)(setup)
    sync = SyncRollout(generate=lambda tasks, version: rollout(run, tasks, version, engine),
                       verify=functools.partial(verify_and_reward, cfg=cfg), pool=run.pool,
                       tasks_per_step=cfg.rollout.tasks_per_step, **dynamic_sampling(cfg))
    return EngineSource(sync, engine)


def rollout_source(run: Run, cfg: GRPOConfig) -> RolloutSource:
    """Where the loop's batches come from: the synchronous phases in this thread, or (asynchronous
    mode) background producer and verifier threads on an engine copy of the model; with
    ``backend: ray`` the generate and verify phases run on Ray actors either way."""
    if cfg.rollout.engine != "rlvr":
        return engine_source(run, cfg)
    verify = functools.partial(verify_and_reward, cfg=cfg)
    refill = dynamic_sampling(cfg)
    workers = ray_workers(run, cfg, verify) if cfg.backend == "ray" else None
    common = dict(pool=run.pool, tasks_per_step=cfg.rollout.tasks_per_step)
    if not cfg.asynchronous.enabled:
        if workers is not None:
            from rlvr.workers.ray_rollout import RayRollout

            return RayRollout(workers, generator=run.generator, **refill, **common)
        if cfg.distributed.rollout_chunk:  # data parallel: chunks dealt to the ranks, gathered after verify
            phases = ShardedPhases(generate=functools.partial(chunk_rollout, run), verify=verify, gather=gather,
                                   rank=run.group.rank, world=run.group.world, generator=run.generator,
                                   chunk=cfg.distributed.rollout_chunk)
            return SyncRollout(generate=phases.generate, verify=phases.verify, **refill, **common)
        return SyncRollout(generate=lambda tasks, version: rollout(run, tasks, version), verify=verify,
                           **refill, **common)
    if workers is not None:
        from rlvr.workers.ray_rollout import RayAsyncRollout

        return RayAsyncRollout(workers, run.model, cfg.asynchronous, start=run.step, total=cfg.steps,
                               pad_token_id=run.tokenizer.pad_token_id, seed=cfg.seed, **common).start()
    # its own tokenizer: a fast tokenizer is not safe to share across threads
    return AsyncRollout(
        run.model, cfg.asynchronous, generate=generation(run, copy.deepcopy(run.tokenizer)), verify=verify,
        start=run.step, total=cfg.steps, pad_token_id=run.tokenizer.pad_token_id, seed=cfg.seed,
        make_env_pool=(lambda: EnvPool(cfg.env, run.sandbox)) if run.envs is not None else None, **common,
    ).start()


def chunk_rollout(run: Run, tasks: list[Task], policy_version: int, generator: torch.Generator) -> list[Episode]:
    """``rollout`` of one chunk from its own generator (``rlvr.rollout.sharded``)."""
    return rollout(dataclasses.replace(run, generator=generator), tasks, policy_version)


def ray_workers(run: Run, cfg: GRPOConfig, verify: Callable):
    """The rollout and verifier actors of a ``backend: ray`` run, serving the trainer's weights."""
    from rlvr.workers.ray_rollout import RayWorkers

    return RayWorkers(run.model, run.tokenizer, params=sampling_params(run), batch_size=cfg.rollout.batch_size,
                      verify=verify, cfg=cfg.ray, env_cfg=cfg.env, sandbox_cfg=cfg.sandbox,
                      needs_sandbox=run.sandbox is not None, run_dir=run.dir, version=run.step,
                      canary_tolerance=cfg.asynchronous.canary_tolerance)


def mismatch_metric(run: Run, batch: RolloutBatch, train_metrics: dict, cfg: GRPOConfig) -> dict:
    """``rollout/logprob_mismatch_kl``: the producer's own parity check when it generated on an
    engine copy; else the update's forwards before its first step (trainer == sampling weights);
    else (every group dropped, nothing trained) a parity forward of the trainer's model."""
    if batch.mismatch_kl is not None:
        return {"rollout/logprob_mismatch_kl": batch.mismatch_kl}
    if "rollout/logprob_mismatch_kl" in train_metrics:
        return {}
    run.model.eval()
    return {"rollout/logprob_mismatch_kl": parity_kl(run.model, [s.trajectory for s in batch.scored],
                                                     run.tokenizer.pad_token_id, cfg.asynchronous.parity_rows)}


def verify_and_reward(tasks: list[Task], episodes: list[Episode], cfg: GRPOConfig) -> list[Scored]:
    trajectories = [ep.trajectory for ep in episodes]
    matched = [tasks[traj.group_id] for traj in trajectories]
    return score_all(matched, judge(tasks, episodes), trajectories, cfg.reward, cfg.rollout.max_new_tokens)


def select_samples(scored: list[Scored], cfg: GRPOConfig) -> list[Scored]:
    """The samples a step trains on: all but those of zero-variance groups when
    ``algo.drop_zero_variance`` (every group estimator gives them advantage 0). With
    ``distill.mode: alone`` every sample: the teacher's per-token signal needs no group variance."""
    if cfg.distill.alone:
        return list(scored)
    if not cfg.algo.drop_zero_variance or uses_critic(cfg):  # a critic learns from every sample
        return list(scored)
    rewards = torch.tensor([s.reward for s in scored], dtype=torch.float32)
    groups = torch.tensor([s.trajectory.group_id for s in scored], dtype=torch.long)
    return [s for s, keep in zip(scored, group_has_variance(rewards, groups).tolist()) if keep]


@dataclass
class Prepared:
    """A step's training batch before its update: the kept samples collated once on the trainer's
    device, with what the advantages and the loss compare against (None when off)."""

    kept: list[Scored]
    batch: Batch | None  # rows = ``kept`` in order; None when nothing is kept
    budget: int = 0  # the largest token budget of a kept sample (``max_tokens`` of the aggregation)
    ref_logprobs: torch.Tensor | None = None  # [B,T] the reference's (``algo.kl_coef`` > 0)
    teacher_logprobs: torch.Tensor | None = None  # [B,T] the teacher's (``distill.teacher``)
    values: torch.Tensor | None = None  # [B,T] the critic's, before its update (``algo.advantage: gae``)
    returns: torch.Tensor | None = None  # [B,T] the critic's targets, set with the advantages (gae)


def prepare(run: Run, kept: list[Scored], cfg: GRPOConfig) -> Prepared:
    """``kept`` collated once, and the no-grad forwards on it at the weights that sampled it,
    before any optimizer step of this update: the reference's log-probs (``algo.kl_coef`` > 0; with
    LoRA the model with its adapters off; in the loss's batch unless ``algo.kl_in_reward``) and the
    teacher's (``distill.teacher``). Data parallel: every rank prepares the whole batch."""
    if not kept:
        return Prepared(kept, None)
    device = next(run.model.parameters()).device
    batch = collate([s.trajectory for s in kept], [0.0] * len(kept), run.tokenizer.pad_token_id).to(device)
    budget = max(s.trajectory.token_budget(cfg.rollout.max_new_tokens) for s in kept)
    out = Prepared(kept, batch, budget, ref_logprobs=reference_logprobs(run, batch, cfg.algo))
    if run.critic is not None:
        out.values = run.critic.values(batch.input_ids, batch.attention_mask, cfg.algo.microbatch_size, batch.loss_mask)
    if run.teacher is not None:
        with torch.no_grad():
            out.teacher_logprobs = logprobs_of(run.teacher, batch, cfg.algo)
    if not cfg.algo.kl_in_reward:
        batch.ref_logprobs = out.ref_logprobs  # the KL term of the loss
    return out


def reference_logprobs(run: Run, batch: Batch, a: AlgoConfig) -> torch.Tensor | None:
    """[B,T] log-probs of ``batch`` under the frozen reference, or None without a KL term."""
    if run.ref_model is not None:
        with torch.no_grad():
            return logprobs_of(run.ref_model, batch, a)
    if a.kl_coef > 0 and run.lora is not None:  # LoRA: the reference is the same model with adapters off
        was_training = run.model.training
        run.model.eval()
        with torch.no_grad(), adapters_off(run.lora) as ref:
            out = logprobs_of(ref, batch, a)
        run.model.train(was_training)
        return out
    return None


def compute_advantages(p: Prepared, cfg: GRPOConfig) -> dict:
    """``p.batch.advantages``: the sequence-level estimator (``ADVANTAGES``) per group over the
    kept samples' rewards, less the KL penalty with ``algo.kl_in_reward``; with distillation
    ([B,T]) the teacher's per-token signal added to them (``distill.mode: add``) or alone.
    Returns the step's advantage metrics."""
    if not p.kept:
        return {}
    rewards = torch.tensor([s.reward for s in p.kept], dtype=torch.float32)
    if uses_critic(cfg):
        return gae_advantages(p, rewards, cfg)
    a, b, metrics = cfg.algo, p.batch, {}
    if cfg.distill.alone:  # the teacher's signal is the only one
        return distill_advantages(p, torch.zeros_like(b.old_logprobs), cfg)
    if a.kl_in_reward:  # r_i - beta * sum_t kl_{i,t}, before the estimator
        penalty = kl_reward_penalty(b.old_logprobs, p.ref_logprobs, b.loss_mask, a.kl_estimator, a.kl_coef)
        rewards = rewards - penalty.to(rewards)
        metrics["rollout/kl_penalty_mean"] = float(penalty.mean())
    groups = torch.tensor([s.trajectory.group_id for s in p.kept], dtype=torch.long)
    b.advantages = ADVANTAGES.get(a.advantage)(rewards, groups).to(b.input_ids.device)
    if p.teacher_logprobs is not None:
        metrics.update(distill_advantages(p, b.advantages[:, None], cfg))
    return metrics


def distill_advantages(p: Prepared, base: torch.Tensor, cfg: GRPOConfig) -> dict:
    """``p.batch.advantages`` [B,T] = ``base`` + the teacher's per-token reverse-KL signal
    (``rlvr.algos.distill``), and the step's ``distill/reverse_kl``."""
    b = p.batch
    b.advantages = base + reverse_kl_advantages(b.old_logprobs, p.teacher_logprobs, b.loss_mask, cfg.distill.coef)
    return {"distill/reverse_kl": reverse_kl(b.old_logprobs, p.teacher_logprobs, b.loss_mask)}


def gae_advantages(p: Prepared, rewards: torch.Tensor, cfg: GRPOConfig) -> dict:
    """``algo.advantage: gae``: token advantages [B,T] by GAE over the critic's values, from each
    sample's outcome reward at its last policy token, and the critic's targets ``p.returns``
    (``rlvr.train.critic.critic_advantages``). With ``algo.kl_in_reward``, -kl_coef * kl_t at every
    policy token (sampling log-probs against the reference's), as InstructGPT and OpenRLHF."""
    a, b = cfg.algo, p.batch
    kl = masked_kl(b.old_logprobs, p.ref_logprobs, b.loss_mask, a.kl_estimator) if a.kl_in_reward else None
    b.advantages, p.returns = critic_advantages(cfg.critic, rewards.to(b.input_ids.device), b.loss_mask, p.values,
                                                kl, a.kl_coef)
    return {} if kl is None else {"rollout/kl_penalty_mean": float(a.kl_coef * kl.sum(-1).mean())}


def drop_overlong(p: Prepared) -> dict:
    """``algo.overlong_filter`` (DAPO, Yu et al. 2025, Sec. 3.4): the samples cut at the length
    limit leave ``p`` (their rewards already took part in their groups' advantages): their rows of
    the batch and of every per-sample tensor of ``p``. The share filtered, as a metric."""
    truncated = [s.trajectory.finish_reason == "length" for s in p.kept]
    out = {"train/overlong_filtered_frac": sum(truncated) / len(truncated)}
    if not any(truncated):
        return out
    rows = torch.tensor([i for i, t in enumerate(truncated) if not t], dtype=torch.long)
    p.kept = [s for s, t in zip(p.kept, truncated) if not t]
    if not p.kept:
        p.batch = None
        return out
    p.batch = select(p.batch, rows)
    width = p.batch.input_ids.shape[1]
    for f in dataclasses.fields(p):  # the reference's, the teacher's, ... log-probs: same rows, same width
        x = getattr(p, f.name)
        if isinstance(x, torch.Tensor):
            setattr(p, f.name, x[rows.to(x.device), :width] if x.dim() == 2 else x[rows.to(x.device)])
    return out


def update(run: Run, p: Prepared, cfg: GRPOConfig) -> dict:
    """Truncated rows out (``algo.overlong_filter``), then PPO-clip epochs over mini-batches (one
    optimizer step each), micro-batched for memory."""
    filtered = drop_overlong(p) if p.kept and cfg.algo.overlong_filter else {}
    if not p.kept:
        return {"train/skipped": 1.0, **filtered}
    a, batch, kept, budget = cfg.algo, p.batch, p.kept, p.budget
    off_policy = off_policy_correction(run, batch, kept, cfg) if cfg.asynchronous.enabled else {}
    mismatch: list[float] = []  # rollout/logprob_mismatch_kl, from forwards before the first optimizer step
    run.model.train()
    n = batch.input_ids.shape[0]
    mb = a.minibatch_size or n
    sums: dict[str, list[float]] = defaultdict(list)
    for _ in range(a.ppo_epochs):
        order = torch.randperm(n, generator=run.generator)
        for start in range(0, n, mb):
            mini = select(batch, order[start: start + mb])
            totals = {"num_tokens": float(mini.loss_mask.sum()), "num_seqs": float(mini.input_ids.shape[0]),
                      "max_tokens": budget}
            mini_loss = 0.0
            for metrics in minibatch_backward(run, mini, a, totals, is_cap=cfg.asynchronous.is_cap):
                mini_loss += metrics["pg_loss"]
                if "train/grad_norm" not in sums:  # no optimizer step yet: trainer == engine weights
                    mismatch.append(metrics.pop("logprob_mismatch_kl"))
                metrics.pop("logprob_mismatch_kl", None)
                for k, v in metrics.items():
                    sums[f"train/{k}"].append(v)
            if run.monitor.stops_on_nonfinite:  # before the step: NaN/inf never reaches the weights
                run.monitor.guard_finite(run.step + 1, {"train/pg_loss": mini_loss, "train/grad_norm": grad_norm(run.model)},
                                         at_boundary="train/grad_norm" not in sums)
            sums["train/grad_norm"].append(clip_and_step(run.model, run.optimizer, run.scheduler, cfg.optim.grad_clip))
    out = {k: sum(v) / len(v) for k, v in sums.items()}
    out["train/lr"] = run.scheduler.get_last_lr()[0]
    out["train/samples"] = float(n)
    out["train/policy_tokens"] = float(batch.loss_mask.sum())
    out["rollout/logprob_mismatch_kl"] = sum(mismatch) / len(mismatch)
    out.update(off_policy)
    out.update(filtered)
    if run.critic is not None:  # the critic's epochs towards the returns, after the policy's
        out.update(run.critic.update(batch.input_ids, batch.attention_mask, batch.loss_mask, p.returns, p.values,
                                     run.generator, minibatch_size=a.minibatch_size, microbatch_size=a.microbatch_size))
    return out


def minibatch_backward(run: Run, mini: Batch, a: AlgoConfig, totals: dict, is_cap: float) -> list[dict]:
    """Forward and backward of ``mini`` in micro-batches; the metrics of each, in order.

    Data parallel: micro-batch u runs on rank u % world (the same micro-batches at every world
    size; the ranks all work when a mini-batch has at least ``world`` of them), the loss is
    normalised by the mini-batch's global ``totals``, so the sum of the ranks' gradients
    (``all_reduce_grads``) is the one-process gradient and every rank steps the same; every
    micro-batch's metrics reach every rank."""
    rows = mini.input_ids.shape[0]
    starts = range(0, rows, a.microbatch_size)
    mine = []
    for u in range(run.group.rank, len(starts), run.group.world):
        micro = mini if rows <= a.microbatch_size else \
            select(mini, torch.arange(starts[u], min(starts[u] + a.microbatch_size, rows)))
        loss, metrics = micro_loss(run.model, micro, a, totals, is_cap=is_cap)
        loss.backward()
        mine.append(metrics)
    all_reduce_grads([p for p in run.model.parameters() if p.requires_grad], run.cfg.distributed.bucket_mb)
    per_rank = gather(mine)
    return [per_rank[u % run.group.world][u // run.group.world] for u in range(len(starts))]


def grad_norm(model: torch.nn.Module) -> float:
    """The total L2 norm of the gradients (what ``clip_and_step`` clips), without stepping."""
    return float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None]))


def logprobs_of(model, batch: Batch, a: AlgoConfig) -> torch.Tensor:
    """[B, T] log-probs of ``batch`` under ``model``: on policy tokens only when packing, else
    every real token but the first. ``a.precision == "bf16"``: the forward under autocast;
    ``a.compile``: with compiled decoder layers."""
    # With activation checkpointing the backward reruns each layer outside this function's
    # contexts, so the forward must not depend on them: padded rows (the LM head still on policy
    # tokens only) and torch's default attention backend.
    recompute = model.training and checkpointing(model)
    with precision_autocast(model, a.precision), \
            contextlib.nullcontext() if recompute else training_attention(model, a.precision), \
            compiled_layers(model, a.compile):
        if a.packing:
            return packed_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask,
                                   share_prompts=a.share_prompts and not recompute,
                                   packing=False if recompute else None, logits_chunk=a.logits_chunk)
        return sequence_logprobs(model, batch.input_ids, batch.attention_mask)


def training_attention(model, precision: str):
    """The SDPA backend of the training forward: under bf16 autocast on CPU, the math backend
    (attention as batched matmuls, differentiated op by op), because the CPU flash kernel's bf16
    backward is slow (profiled at the benchmark's packed shapes, 13-14 rows x 196 tokens: 28 ms
    per layer against 13 ms in fp32, 6x its forward). Forward + backward measured 8% faster on
    the small benchmark model, 2% on the medium one (``docs/training_step.md``). Elsewhere (fp32,
    GPU) torch's default choice."""
    if PRECISIONS[precision] is None or next(model.parameters()).device.type != "cpu":
        return contextlib.nullcontext()
    return sdpa_kernel(SDPBackend.MATH)


def off_policy_correction(run: Run, batch: Batch, kept: list[Scored], cfg: GRPOConfig) -> dict:
    """Async mode: samples generated by an older policy version get pi_old = the trainer's
    log-probs at the start of this update and per-token truncated IS weights
    (``rlvr.algos.off_policy``; behaviour = the engine's sampling log-probs). On-policy rows keep
    pi_old = behaviour and weight 1. Rows of ``batch`` are ``kept`` in order.

    Single-pass update (one epoch, one mini-batch: the default): the loss's own forward runs at
    exactly those weights, so it supplies pi_old (``off_policy_terms``): no extra forward, only
    ``batch.stale`` is set. Otherwise one no-grad forward over the stale rows, before any step."""
    stale = torch.tensor([s.trajectory.policy_version < run.step for s in kept], device=batch.input_ids.device)
    out = {"async/stale_frac": float(stale.float().mean())}
    if not stale.any():
        return out
    n = batch.input_ids.shape[0]
    if cfg.algo.ppo_epochs == 1 and (cfg.algo.minibatch_size == 0 or cfg.algo.minibatch_size >= n):
        batch.stale = stale
        return out
    rows = stale.nonzero().flatten()
    was_training = run.model.training
    run.model.eval()
    with torch.no_grad():
        pi_old = torch.cat([logprobs_of(run.model, select(batch, r), cfg.algo)
                            for r in rows.split(cfg.algo.microbatch_size)])
    run.model.train(was_training)
    old, weights, metrics = correct_off_policy(pi_old, batch.old_logprobs[rows], batch.loss_mask[rows] > 0,
                                                cfg.asynchronous.is_cap)
    batch.is_weights = torch.ones_like(batch.old_logprobs)
    batch.is_weights[rows] = weights
    batch.old_logprobs = batch.old_logprobs.clone()
    batch.old_logprobs[rows] = old
    out.update({f"train/{k}": v for k, v in metrics.items()})
    return out


def off_policy_terms(logprobs: torch.Tensor, micro: Batch, is_cap: float) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
    """(pi_old, IS weights or None, metrics) for the loss. Rows marked ``micro.stale`` (async,
    single-pass update) take pi_old = this forward's log-probs (the trainer's weights before its
    step) and truncated IS weights; other rows keep the batch's values."""
    if micro.stale is None or not bool(micro.stale.any()):
        return micro.old_logprobs, micro.is_weights, {}
    return correct_off_policy(logprobs, micro.old_logprobs, micro.stale[:, None] & (micro.loss_mask > 0), is_cap)


def micro_loss(model, micro: Batch, a: AlgoConfig, totals: dict, is_cap: float = 2.0) -> tuple[torch.Tensor, dict]:
    # Packed: log-probs on policy tokens only (0 elsewhere; the loss and KL see only those).
    logprobs = logprobs_of(model, micro, a)
    old_logprobs, is_weights, off_metrics = off_policy_terms(logprobs, micro, is_cap)  # async only
    off_policy = {"is_weights": is_weights} if is_weights is not None else {}  # async only
    loss, metrics = POLICY_LOSSES.get(a.policy_loss)(
        logprobs, old_logprobs, micro.advantages, micro.loss_mask,
        clip_low=a.clip_low, clip_high=a.clip_high, aggregation=a.aggregation, **totals, **off_policy)
    metrics = dict(metrics, **off_metrics)
    metrics["logprob_mismatch_kl"] = logprob_mismatch_kl(logprobs, micro.old_logprobs, micro.loss_mask)
    metrics["pg_loss"] = float(loss.detach())
    if micro.ref_logprobs is not None:
        kl = KL_ESTIMATORS.get(a.kl_estimator)(logprobs, micro.ref_logprobs)
        kl_loss = AGGREGATIONS.get(a.aggregation)(kl, micro.loss_mask, **totals)
        loss = loss + a.kl_coef * kl_loss
        metrics["kl"] = float(kl_loss.detach())
    return loss, metrics


# --------------------------------------------------------------------------- bookkeeping


def rollout_metrics(scored: list[Scored], kept: list[Scored]) -> dict:
    n = len(scored)
    out = {
        "rollout/reward_mean": sum(s.reward for s in scored) / n,
        "rollout/pass_rate": sum(s.verdict.passed for s in scored) / n,
        "rollout/response_tokens_mean": sum(s.trajectory.num_policy_tokens for s in scored) / n,
        "rollout/truncated_frac": sum(s.trajectory.finish_reason == "length" for s in scored) / n,
        "rollout/kept_frac": len(kept) / n,
        "rollout/entropy": sampled_entropy(scored),
        "rollout/group_reward_std": group_reward_std(scored),
    }
    played = [s.trajectory.episode for s in scored if s.trajectory.episode]
    if played:  # multi-turn episodes: how long they ran and how they ended
        out["rollout/turns_mean"] = sum(e.turns for e in played) / len(played)
        for finish in sorted({e.finish for e in played}):
            out[f"rollout/finish/{finish}"] = sum(e.finish == finish for e in played) / len(played)
    for term in sorted({t for s in scored for t in s.terms}):
        out[f"rollout/reward_{term}"] = sum(s.terms.get(term, 0.0) for s in scored) / n
    by_domain: dict[str, list[bool]] = defaultdict(list)
    for s in scored:
        by_domain[s.task.domain].append(s.verdict.passed)
    for domain, passed in by_domain.items():
        out[f"rollout/pass_rate/{domain}"] = sum(passed) / len(passed)
    return out


def sampled_entropy(scored: list[Scored]) -> float:
    """Mean -log pi of the sampled policy tokens (nats per token; the rollout's log-probs are the
    policy's at temperature 1): at sampling temperature 1, the policy's entropy estimated from its
    own samples (``entropy_collapse`` watches it)."""
    total = sum(-lp for s in scored for lp, m in zip(s.trajectory.logprobs, s.trajectory.loss_mask) if m)
    return total / max(1, sum(s.trajectory.num_policy_tokens for s in scored))


def group_reward_std(scored: list[Scored]) -> float:
    """Mean over groups of the (population) std of their rewards: 0 when no group carries signal."""
    groups: dict[int, list[float]] = defaultdict(list)
    for s in scored:
        groups[s.trajectory.group_id].append(s.reward)
    stds = [float(torch.tensor(r, dtype=torch.float64).std(unbiased=False)) for r in groups.values()]
    return sum(stds) / len(stds)


def eval_report(run: Run, cfg: GRPOConfig, path: Path) -> dict:
    """The eval suite on the current policy, written as JSON to ``path`` (``rlvr eval``'s format)."""
    def report() -> dict:  # data parallel: on rank 0, which writes it and sends it to the others
        suite = {"suite": get_suite(cfg.eval_suite).record()} if cfg.eval_suite else {}
        with sampling(run) as model:
            out = {"model": str(run.dir), **suite, "fingerprint": fingerprint(run.eval_tasks),
                   **evaluate(model, run.tokenizer, run.eval_tasks, cfg.eval, seed=cfg.seed)}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=2))
        return out

    return from_rank0(report)


def periodic_eval(run: Run, cfg: GRPOConfig, step: int) -> dict:
    report = eval_report(run, cfg, run.dir / "eval" / f"step_{step}.json")
    out = {"eval/pass@1": report["overall"]["pass@1"]}
    for domain, stats in report["by_domain"].items():
        out[f"eval/pass@1/{domain}"] = stats["pass@1"]
    for alert in run.pool.on_eval(step, report["by_domain"]):  # seesaw control (the curriculum)
        run.alerts.write(alert)
    if not cfg.asynchronous.enabled:  # the checkpoint keeps what the eval changed
        run.pool_state = run.pool.state_dict()
    return out


def stopped(run: Run, cfg: GRPOConfig, stop: RunStopped) -> None:
    """A detector stopped the run (its alert and the step's trajectories are written): checkpoint
    the weights of the last finished step when they are intact and not saved yet, close the logs."""
    latest = latest_checkpoint(run.dir)
    if stop.checkpoint and run.step > 0 and (latest is None or latest.name != f"step_{run.step}"):
        checkpoint(run, cfg)
    run.logger.close()


def checkpoint(run: Run, cfg: GRPOConfig) -> None:
    """Rank 0's (data parallel: the weights, optimizer, generator and pool are the same on every rank)."""
    if not run.group.is_main:
        return
    pool = run.pool_state if run.pool_state is not None else run.pool.state_dict()  # async: not the producer's
    state = training_state(run.step, run.optimizer, run.scheduler, run.generator, pool=pool)
    critic = (lambda d: run.critic.save(d / CRITIC_DIR)) if run.critic is not None else None  # inside the atomic checkpoint
    save_checkpoint(run.dir, run.step, run.lora if run.lora is not None else run.model, run.tokenizer, state,  # LoRA: the adapter
                    extra=critic)
    prune_checkpoints(run.dir, keep=cfg.keep_checkpoints)
