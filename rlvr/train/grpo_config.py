"""The GRPO run's configuration: ``GRPOConfig`` and its ``rollout`` and ``algo`` sections.

Each key is checked where it is read (a bad value names the key and the allowed values); which
combinations of producers and components run is the compatibility table's business
(``rlvr.train.compat``), called once at the end of ``GRPOConfig.__post_init__``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlvr.algos.advantages import ADVANTAGES
from rlvr.algos.kl import KL_ESTIMATORS
from rlvr.algos.losses import AGGREGATIONS, POLICY_LOSSES
from rlvr.config import check_choice, check_device, check_range
from rlvr.curriculum.config import CurriculumConfig
from rlvr.envs.base import EnvConfig
from rlvr.errors import ConfigError
from rlvr.eval.evaluate import EvalConfig
from rlvr.eval.suites import get_suite
from rlvr.model.load import ModelLoadConfig
from rlvr.model.lora import LoraConfig
from rlvr.monitor.config import MonitorConfig
from rlvr.monitor.trackers import TrackerConfig
from rlvr.rewards import RewardConfig
from rlvr.rollout.async_rollout import AsyncConfig
from rlvr.rollout.engine import PRECISIONS
from rlvr.rollout.engine_registry import ROLLOUT_ENGINES
from rlvr.rollout.kv_compress import KV_CACHES
from rlvr.rollout.remote_engine import RemoteConfig
from rlvr.rollout.vllm_engine import VLLMConfig, require_vllm
from rlvr.sandbox.config import SandboxConfig
from rlvr.store import StoreConfig
from rlvr.tasks.rows import TaskFileConfig, as_file_config
from rlvr.train import compat
from rlvr.train.common import OptimConfig
from rlvr.train.critic import CriticConfig
from rlvr.train.distributed import DistributedConfig, launched
from rlvr.train.teacher import DistillConfig
from rlvr.workers.config import RayConfig

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
    prefill_chunk: int = 0
    """Chunked prefill of rlvr's engine: prompt columns this many at a time (bounded prefill
    activations, same results); 0 = the whole prompt at once (``SamplingParams.prefill_chunk``)."""
    kv_cache: str = "full"
    """full | int8 | sink_window: rlvr's engine's KV cache (``SamplingParams.kv_cache``,
    docs/rollout.md "Long prompts"). int8 and sink_window bound its memory but are lossy: the
    rollouts are slightly off-policy (the trainer recomputes exact log-probs;
    ``rollout/logprob_mismatch_kl`` shows the gap)."""
    kv_window: int = 256
    """With kv_cache int8: recent tokens kept in full precision; sink_window: recent tokens kept."""
    kv_sinks: int = 4
    """With kv_cache sink_window: first tokens of each sequence always kept (attention sinks)."""
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
        check_choice("rollout.engine", self.engine, ROLLOUT_ENGINES.names())
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
        check_choice("rollout.kv_cache", self.kv_cache, list(KV_CACHES))
        check_range("rollout.prefill_chunk", self.prefill_chunk, 0)
        check_range("rollout.kv_window", self.kv_window, 1)
        check_range("rollout.kv_sinks", self.kv_sinks, 0)
        if self.engine != "rlvr":
            for key, on in (("prefill_chunk", self.prefill_chunk != 0), ("kv_cache", self.kv_cache != "full")):
                if on:
                    raise ConfigError(f"config key 'rollout.{key}' is rlvr's engine's; 'rollout.engine: {self.engine}' "
                                      "cannot honour it: leave it at its default (the server's own settings decide)")
        check_range("rollout.tasks_per_step", self.tasks_per_step, 1)
        check_range("rollout.samples_per_task", self.samples_per_task, 1)
        check_range("rollout.temperature", self.temperature, 0.0)
        check_range("rollout.top_p", self.top_p, 0.0, 1.0)



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
    the curriculum use ``curriculum.filter.refill_rounds`` instead."""
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
    microbatch_tokens: int = 0
    """Micro-batches by a token budget instead of ``microbatch_size``: at most this many real
    tokens each (a longer sequence alone), their number a multiple of the data-parallel world size
    and their tokens balanced across ranks (``rlvr.train.token_batches``). 0: by samples."""
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
    memory_budget_mb: int = 0
    """A memory budget for the update's activations, logits and gradients (MiB): each batch's
    ``microbatch_tokens``, ``logits_chunk`` and ``gradient_checkpointing`` are chosen from its
    sequence lengths by ``rlvr.train.memory_plan`` (the rule: its docstring), each only where left
    at its default; metrics ``train/memory_plan_*``. 0: off."""

    def __post_init__(self) -> None:
        check_choice("algo.advantage", self.advantage, ADVANTAGES.names())
        check_choice("algo.policy_loss", self.policy_loss, POLICY_LOSSES.names())
        check_choice("algo.aggregation", self.aggregation, AGGREGATIONS.names())
        check_choice("algo.kl_estimator", self.kl_estimator, KL_ESTIMATORS.names())
        check_choice("algo.precision", self.precision, list(PRECISIONS))
        check_range("algo.ppo_epochs", self.ppo_epochs, 1)
        check_range("algo.microbatch_size", self.microbatch_size, 1)
        check_range("algo.microbatch_tokens", self.microbatch_tokens, 0)
        check_range("algo.minibatch_size", self.minibatch_size, 0)
        check_range("algo.logits_chunk", self.logits_chunk, 0)
        check_range("algo.memory_budget_mb", self.memory_budget_mb, 0)
        check_range("algo.kl_coef", self.kl_coef, 0.0)
        check_range("algo.dynamic_sampling_rounds", self.dynamic_sampling_rounds, 0)
        if self.kl_in_reward and not self.kl_coef > 0:
            raise ConfigError("config key 'algo.kl_in_reward' needs 'algo.kl_coef' > 0 (the weight of the KL penalty "
                              "in the reward); with algo.kl_coef: 0 there is no reference model")
        if self.dynamic_sampling_rounds and not self.drop_zero_variance:
            raise ConfigError("config key 'algo.dynamic_sampling_rounds' refills the zero-variance groups that "
                              "'algo.drop_zero_variance' drops: set algo.drop_zero_variance: true")
        if self.compile and self.memory_budget_mb:
            raise ConfigError("config keys 'algo.compile' and 'algo.memory_budget_mb' cannot both be set: the memory "
                              "plan may switch on activation checkpointing, which the compiled layers do not support")
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
    images: list[str] = field(default_factory=list)
    """Environment image specs (YAML, ``rlvr.images``; docs/images.md) found in the cache, fetched from
    ``store`` or built (then pushed there) before the run starts; a task runs its code on the image its
    spec payload names (``image``)."""
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
    """Checkpoints kept on disk (and in ``store``)."""
    store: StoreConfig = field(default_factory=StoreConfig)
    """Object storage (``rlvr.store``): every checkpoint and the final model mirrored to ``store.url``
    (s3://, file://, memory://); ``--resume`` in a directory without a checkpoint pulls the newest
    complete one from there (docs/storage.md)."""
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
        compat.check(self, launched().world)  # the one refusal path (rlvr.train.compat)



def uses_critic(cfg: GRPOConfig) -> bool:
    """PPO with a learned critic (``algo.advantage: gae``): the run builds, trains and checkpoints one."""
    return cfg.algo.advantage == compat.GAE
