"""One full GRPO step (generate, score, update) in rlvr vs TRL's ``GRPOTrainer``, same everything.

Run it in the benchmark's own environment (TRL is not an rlvr dependency):

    make bench-trl                                   # builds .venv-trl, runs --size small and medium
    .venv-trl/bin/python benchmarks/grpo_step_vs_trl.py [--size small|medium] [--json PATH]

Both sides get the same model (one random ``bench_model`` saved once as a Hugging Face directory
and loaded by each), the same tokenizer and chat template, the same 8 prompts (rlvr ``math.arith``
train tasks) x 8 samples x at most 32 new tokens at temperature 1.0, top-p 1, no top-k, the same
reward (``digit_reward``: share of digit characters in the completion text, a cheap deterministic
format check computed by the same Python function on both sides; rlvr's verifier pipeline is not
exercised), group-normalised advantages, PPO-clip with eps 0.2 / 0.28, token-mean loss, beta = 0
(no reference model), AdamW with one optimizer step per GRPO step over all 64 completions
(rlvr: drop_zero_variance off, so both update on all 64), gradient clipping at 1.0, fp32
(``--bf16``: both sides in their bf16 mixed precision: TRL ``bf16=True``, i.e. accelerate's
autocast; rlvr ``rollout.precision`` and ``algo.precision`` = bf16; fp32 weights on both, and the
matmul fraction is then of the bf16 GEMM rate).
``--compile``: rlvr with ``algo.compile`` (compiled decoder layers in its update; the warmup
steps absorb the compile). TRL's own ``torch_compile`` option is left off (not measured).
The process keeps freed memory for reuse (``rlvr.train.allocator``, which rlvr's ``grpo.setup``
turns on): it is process-wide, so TRL's side runs with it too; ``--default-malloc`` measures both
sides with glibc's default instead (tens of thousands of page faults per step).
TRL: per_device_train_batch_size 64, gradient_accumulation 1, steps_per_generation 1,
num_iterations 1 (so no extra old-policy forward, as in rlvr), plain ``model.generate``, no vLLM,
gradient checkpointing off (TRL's GRPOConfig turns it on by default, which recomputes the forward
during the backward; ``--trl-gradient-checkpointing`` keeps that default).

``--rlvr-only``: rlvr's side alone (TRL not imported), in the process a training run has; same
steps, phases and matmul fraction, no ratio. Alone or shared, the step's time follows the
machine's fast and slow states more than the process it runs in (see ``docs/benchmarks.md``).
Timing: TRL's own ``train()`` drives the loop; a callback after every ``--per-round`` TRL steps runs
as many rlvr steps, so the two sides alternate in one process with the same threads. The first
``--warmup`` steps of each side are not counted. Phases:
  generate   rlvr: ``sources.rollout`` (chat template, sampling, decode);  TRL: ``_generate``
  score      the reward function over the 64 completions (TRL: ``_calculate_rewards``)
  forward    rlvr: ``micro_loss`` (log-probs + loss);  TRL: ``compute_loss`` (the same)
  backward   rlvr: ``loss.backward()``;  TRL: ``accelerator.backward``
  optimizer  gradient clipping + AdamW step (rlvr: ``clip_and_step``; TRL: ``_clip_grad_norm`` + step)
  other      the rest of the step (advantages, collation, TRL's bookkeeping and logging buffers)
Matmul fraction: useful forward+backward FLOPs / (forward + backward seconds) / ``matmul_rate()``
(measured between rounds in the same run). Useful FLOPs per sequence of n tokens of which c are
completion tokens: 3 x [2 x non-embedding params x n + 2 x lm-head params x c + attention], with
attention 4 x layers x hidden x n(n+1)/2 (causal). Padding is not counted; the LM head is counted at
the completion positions only, the ones both implementations compute it at (counting it at prompt
positions too, as ``model_flops_per_token`` x all tokens does, would add about 2.5% on ``small``).
rlvr's shared prompts (``algo.share_prompts``: a group's prompt runs once, in the flat layout of
``rlvr.train.sequence_attention``; once per packed row in the row layout) are counted as computed:
the fraction is of the work done, not of the work saved.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from common import (MODEL_SIZES, bench_model, bench_tokenizer, machine_note, matmul_rate, num_params,  # noqa: E402
                    print_table, spread, write_json)

PHASES = ["generate", "score", "forward", "backward", "optimizer", "other"]


def digit_reward(text: str) -> float:
    """Share of digit characters in a completion (0 for an empty one): the reward of both sides."""
    return sum(ch.isdigit() for ch in text) / max(len(text), 1)


def useful_flops(model, seq_lens: list[int], completion_lens: list[int],
                 shared: list[tuple[int, int]] = ()) -> float:
    """Forward + backward FLOPs a step needs (see the module docstring). ``shared``: (prompt
    length, copies saved) per shared prompt of rlvr's layout, whose tokens run once per row
    instead of once per sample: their FLOPs are not done, so not counted."""
    cfg = model.config
    emb = cfg.vocab_size * cfg.hidden_size
    body = num_params(model) - emb * (1 if cfg.tie_word_embeddings else 2)
    att = 4.0 * cfg.num_hidden_layers * cfg.hidden_size
    fwd = sum(2.0 * body * n + 2.0 * emb * c + att * n * (n + 1) / 2 for n, c in zip(seq_lens, completion_lens))
    fwd -= sum(k * (2.0 * body * p + att * p * (p + 1) / 2) for p, k in shared)
    return 3.0 * fwd


def shared_copies(micro, model) -> list[tuple[int, int]]:
    """(prompt length, prompt copies not computed) for rlvr's layout of ``micro``: the flat
    layout (a shared prompt once per group) where ``model`` runs attention per sequence, else the
    row layout (once per row of ``shared_width`` tokens)."""
    from rlvr.train import sequence_attention
    from rlvr.train.packing import layout_units, shared_prompts, shared_width

    lengths = micro.attention_mask.sum(1).tolist()
    groups = shared_prompts(micro.input_ids, micro.attention_mask, micro.loss_mask)
    flat = sequence_attention.supported(model, max(lengths))
    width = sum(lengths) if flat else shared_width(lengths, groups, model.config.hidden_size)
    units = layout_units(lengths, groups, width)
    return [(p, len(members) - 1) for p, members in units if p]


class Clock:
    """Phase seconds of the step in progress."""

    def __init__(self) -> None:
        self.t: dict[str, float] = {}
        self.flops = 0.0

    def add(self, phase: str, seconds: float) -> None:
        self.t[phase] = self.t.get(phase, 0.0) + seconds

    def timed(self, phase: str, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(phase, time.perf_counter() - t0)
        return wrapper


def round_speedups(trl_steps: list[float], rlvr_steps: list[float], per_round: int) -> list[float]:
    """Per alternation round, TRL's median step over rlvr's: the two sides' steps of a round ran
    back to back, so a slow spell of the machine that lasts a round moves both."""
    rounds = min(len(trl_steps), len(rlvr_steps)) // per_round
    return [statistics.median(trl_steps[i * per_round:(i + 1) * per_round])
            / statistics.median(rlvr_steps[i * per_round:(i + 1) * per_round]) for i in range(rounds)]


# --------------------------------------------------------------------------- rlvr side


class RlvrSide:
    def __init__(self, model_dir: str, out: str, tasks, seed: int, packing: bool = True,
                 share_prompts: bool = True, precision: str = "model", compile: bool = False,
                 device: str = "cpu", samples: int = 8, max_new_tokens: int = 32) -> None:
        import rlvr.train.grpo as grpo
        from rlvr.train import update
        from rlvr.train.common import OptimConfig

        self.grpo, self.tasks = grpo, tasks
        n = len(tasks) * samples
        self.cfg = grpo.GRPOConfig(
            model=model_dir, out=out, seed=seed, device=device, domains=["math.arith"], train_tasks=len(tasks),
            steps=10_000,
            rollout=grpo.RolloutConfig(tasks_per_step=len(tasks), samples_per_task=samples,
                                       max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0, batch_size=n,
                                       precision=precision),
            algo=grpo.AlgoConfig(drop_zero_variance=False, clip_low=0.2, clip_high=0.28, microbatch_size=n,
                                 packing=packing, share_prompts=share_prompts, precision=precision,
                                 compile=compile),
            optim=OptimConfig(lr=1e-6, warmup_steps=0, grad_clip=1.0), checkpoint_every=10_000,
            save_trajectories_every=10_000)
        self.run = grpo.setup(self.cfg, resume=False)
        self.clock = Clock()
        self.model = self.run.model
        on_cuda = next(self.model.parameters()).device.type == "cuda"
        sync = torch.cuda.synchronize if on_cuda else (lambda: None)  # phase edges wait for the GPU
        self.sync = sync
        # Instrument update(): forward = micro_loss, optimizer = clip_and_step, backward = between them.
        micro_loss, clip_and_step = update.micro_loss, update.clip_and_step
        side = self

        def timed_micro_loss(model, micro, *args, **kwargs):
            sync()
            t0 = time.perf_counter()
            out = micro_loss(model, micro, *args, **kwargs)
            sync()
            side.clock.add("forward", time.perf_counter() - t0)
            lens = micro.attention_mask.sum(1).tolist()
            comp = micro.loss_mask.sum(1).long().tolist()
            sharing = side.cfg.algo.packing and side.cfg.algo.share_prompts
            shared = shared_copies(micro, model) if sharing else []
            side.clock.flops += useful_flops(model, lens, comp, shared)
            side._fwd_end = time.perf_counter()  # the FLOP count above is in no phase
            return out

        def timed_clip_and_step(*args, **kwargs):
            sync()
            t0 = time.perf_counter()
            side.clock.add("backward", t0 - side._fwd_end)
            try:
                return clip_and_step(*args, **kwargs)
            finally:
                sync()
                side.clock.add("optimizer", time.perf_counter() - t0)

        update.micro_loss, update.clip_and_step = timed_micro_loss, timed_clip_and_step

    def step(self) -> tuple[float, dict, float]:
        from rlvr.train import sources
        from rlvr.types import Scored, Verdict

        grpo, run, clock = self.grpo, self.run, self.clock
        clock.t, clock.flops = {}, 0.0
        t0 = time.perf_counter()
        episodes = sources.rollout(run, self.tasks, policy_version=run.step)
        t1 = time.perf_counter()
        scored = []
        for ep in episodes:
            r = digit_reward(ep.trajectory.completion)
            scored.append(Scored(self.tasks[ep.trajectory.group_id], ep.trajectory,
                                 Verdict(passed=r == 1.0, score=r, reason="ok"), r))
        t2 = time.perf_counter()
        prepared = grpo.prepare(run, grpo.select_samples(scored, self.cfg), self.cfg)
        prepared, _ = grpo.compute_advantages(prepared, self.cfg)
        grpo.update(run, prepared, self.cfg)
        run.step += 1
        total = time.perf_counter() - t0
        clock.add("generate", t1 - t0)
        clock.add("score", t2 - t1)
        return total, dict(clock.t), clock.flops


# --------------------------------------------------------------------------- TRL side


def trl_reward(completions, **kwargs) -> list[float]:
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [digit_reward(t) for t in texts]


def build_trl(model_dir: str, out: str, tasks, seed: int, max_steps: int, callback, checkpointing: bool = False,
              bf16: bool = False):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    data = Dataset.from_list([{"prompt": [dict(m) for m in t.prompt]} for t in tasks])
    args = GRPOConfig(
        output_dir=out, seed=seed, max_steps=max_steps, learning_rate=1e-6, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.95, max_grad_norm=1.0,
        per_device_train_batch_size=64, gradient_accumulation_steps=1, steps_per_generation=1, num_generations=8,
        num_iterations=1, max_completion_length=32, temperature=1.0, top_p=1.0, top_k=0, beta=0.0,
        epsilon=0.2, epsilon_high=0.28, loss_type="dapo", scale_rewards="group", use_vllm=False,
        use_cpu=True, bf16=bf16, fp16=False, report_to="none", logging_steps=10**6, save_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0, log_completions=False,
        gradient_checkpointing=checkpointing,  # TRL's GRPOConfig defaults to True: recomputes the forward
    )
    tok = AutoTokenizer.from_pretrained(model_dir)
    return GRPOTrainer(model=model_dir, reward_funcs=trl_reward, args=args, train_dataset=data,
                       processing_class=tok, callbacks=[callback])


def instrument_trl(trainer, clock: Clock) -> None:
    t = trainer
    inner_gen, inner_score = t._generate, t._calculate_rewards
    t._generate = clock.timed("generate", inner_gen)
    t._calculate_rewards = clock.timed("score", inner_score)
    compute_loss = t.compute_loss

    def timed_compute_loss(model, inputs, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return compute_loss(model, inputs, *args, **kwargs)
        finally:
            clock.add("forward", time.perf_counter() - t0)
            n = (inputs["prompt_mask"].sum(1) + inputs["completion_mask"].sum(1)).tolist()
            c = inputs["completion_mask"].sum(1).tolist()
            clock.flops += useful_flops(t.model, n, c)

    t.compute_loss = timed_compute_loss
    t.accelerator.backward = clock.timed("backward", t.accelerator.backward)
    t._clip_grad_norm = clock.timed("optimizer", t._clip_grad_norm)


# --------------------------------------------------------------------------- the run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="small", choices=[s for s in MODEL_SIZES if s != "large"])
    ap.add_argument("--rounds", type=int, default=None, help="alternation rounds (default: 4 small, 3 medium)")
    ap.add_argument("--per-round", type=int, default=None, help="steps per side per round (default: 3 small, 2 medium)")
    ap.add_argument("--warmup", type=int, default=2, help="uncounted steps per side before the rounds")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trl-gradient-checkpointing", action="store_true",
                    help="keep TRL's default gradient checkpointing (recomputes the forward in the backward); "
                         "off by default so that neither side recomputes")
    ap.add_argument("--no-packing", action="store_true", help="rlvr with algo.packing=false (the plain padded forward)")
    ap.add_argument("--no-share-prompts", action="store_true",
                    help="rlvr with algo.share_prompts=false (each sample runs its own prompt)")
    ap.add_argument("--bf16", action="store_true",
                    help="both sides in bf16 mixed precision (TRL bf16=True; rlvr rollout/algo precision bf16)")
    ap.add_argument("--rlvr-bf16", action="store_true",
                    help="rlvr in bf16 mixed precision, TRL at its fp32 (each side's matmul fraction of its own GEMM rate)")
    ap.add_argument("--compile", action="store_true",
                    help="rlvr with algo.compile (compiled decoder layers in the update; the warmup steps "
                         "absorb the compile)")
    ap.add_argument("--default-malloc", action="store_true",
                    help="glibc's default malloc behaviour for both sides (RLVR_KEEP_FREED_MEMORY=0): freed "
                         "memory goes back to the kernel and the next step's tensors page-fault")
    ap.add_argument("--rlvr-only", action="store_true",
                    help="rlvr's side alone, TRL not imported (rlvr's own process, as a training run has it): "
                         "the same steps, phases and matmul fraction, no ratio")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rounds = a.rounds or (4 if a.size == "small" else 3)
    per_round = a.per_round or (3 if a.size == "small" else 2)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.default_malloc:
        os.environ["RLVR_KEEP_FREED_MEMORY"] = "0"
    if a.rlvr_only:
        return rlvr_only(a, rounds, per_round)
    try:
        import trl
        from transformers import TrainerCallback
    except ImportError:
        sys.exit("TRL is not installed here: run `make bench-trl` (builds .venv-trl) or "
                 ".venv-trl/bin/python benchmarks/grpo_step_vs_trl.py")

    from rlvr.train.allocator import keep_freed_memory

    tmp, model_dir, params, tasks, rl = setup_rlvr(a, "grpo_vs_trl_")
    gemm = {"trl": "bf16" if a.bf16 else "fp32", "rlvr": "bf16" if a.bf16 or a.rlvr_bf16 else "fp32"}
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    trl_clock = Clock()
    results = {"rlvr": [], "trl": []}
    rates: dict[str, list[float]] = {g: [] for g in sorted(set(gemm.values()))}

    def measure_rates() -> None:
        for g in rates:
            rates[g].append(matmul_rate(dtype=dtypes[g]))

    class Alternate(TrainerCallback):
        def __init__(self) -> None:
            self.resume = None
            self.count = 0

        def on_step_begin(self, args, state, control, **kw):
            if self.resume is None:  # first step: the loop starts
                self.resume = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kw):
            self.opt_start = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kw):  # AdamW's step (clipping: _clip_grad_norm)
            trl_clock.add("optimizer", time.perf_counter() - self.opt_start)

        def on_step_end(self, args, state, control, **kw):
            total = time.perf_counter() - self.resume
            self.count += 1
            if self.count > a.warmup:
                results["trl"].append((total, dict(trl_clock.t), trl_clock.flops))
            trl_clock.t, trl_clock.flops = {}, 0.0
            if self.count == a.warmup:
                for _ in range(a.warmup):
                    rl.step()
                measure_rates()
            elif self.count > a.warmup and (self.count - a.warmup) % per_round == 0:
                for _ in range(per_round):
                    results["rlvr"].append(rl.step())
                measure_rates()
                print(f"  round {(self.count - a.warmup) // per_round}/{rounds}: "
                      f"trl {statistics.median(r[0] for r in results['trl']):.3f} s/step, "
                      f"rlvr {statistics.median(r[0] for r in results['rlvr']):.3f} s/step", flush=True)
            self.resume = time.perf_counter()

    callback = Alternate()
    trainer = build_trl(model_dir, str(Path(tmp) / "trl"), tasks, a.seed, a.warmup + rounds * per_round, callback,
                        checkpointing=a.trl_gradient_checkpointing, bf16=a.bf16)
    instrument_trl(trainer, trl_clock)
    print(f"grpo step vs TRL {trl.__version__}: {a.size} model ({params / 1e6:.2f}M params), 8 prompts x 8 samples "
          f"x <= 32 new tokens, GEMMs: TRL {gemm['trl']}, rlvr {gemm['rlvr']}{' (compiled layers)' * a.compile}; "
          f"malloc: {'freed memory kept (both sides)' if keep_freed_memory() else 'glibc default'}; "
          f"{machine_note()}", flush=True)
    trainer.train()

    rate_of = {g: statistics.median(r) for g, r in rates.items()}
    rows, summary = [], {}
    for side in ("trl", "rlvr"):
        summary[side], row = summarise(side, results[side], gemm[side], rate_of[gemm[side]])
        rows.append(row)
    speedup = summary["trl"]["s_per_step"] / summary["rlvr"]["s_per_step"]
    by_round = round_speedups([s[0] for s in results["trl"]], [s[0] for s in results["rlvr"]], per_round)
    print()
    print_table(rows, ["side", "gemm", "s/step", *PHASES, "fwd+bwd GF/s", "of matmul"])
    print(f"\nrlvr is {speedup:.2f}x faster per step (median of {len(results['rlvr'])} steps each side; "
          f"per round {spread(by_round)}x); "
          + "; ".join(f"{g} matmul rate {rate_of[g]:.0f} GFLOP/s (median of {len(r)}: {', '.join(f'{x:.0f}' for x in r)})"
                      for g, r in rates.items()) + "; "
          f"{machine_note()}")
    write_json(a.json, {"size": a.size, "params": params, "trl_version": trl.__version__, "speedup": speedup, "round_speedups": by_round,
                        "matmul_rate_gflops": rate_of, "matmul_rates": rates, "machine": machine_note(),
                        "threads": torch.get_num_threads(), "rlvr_packing": not a.no_packing,
                        "rlvr_share_prompts": not a.no_share_prompts, "rlvr_compile": a.compile,
                        "trl_gradient_checkpointing": a.trl_gradient_checkpointing,
                        "freed_memory_kept": keep_freed_memory(),
                        "gemm": gemm, **summary})


def setup_rlvr(a, prefix: str):
    """The run's temp dir, the benchmark model saved there (both sides load it), its parameter
    count, the 8 prompts' tasks and rlvr's side built on them: (tmp, model_dir, params, tasks, rl)."""
    import rlvr.tasks  # noqa: F401
    from rlvr.model.checkpoint import save_model_dir
    from rlvr.tasks.base import generate_tasks

    tmp = tempfile.mkdtemp(prefix=prefix)
    tok = bench_tokenizer()
    model = bench_model(a.size, tok, seed=a.seed)
    model_dir = str(save_model_dir(Path(tmp) / "model", model, tok))
    params = num_params(model)
    del model
    tasks = generate_tasks(["math.arith"], "train", 8, seed=a.seed)
    torch.manual_seed(a.seed)
    rl = RlvrSide(model_dir, str(Path(tmp) / "rlvr"), tasks, a.seed, packing=not a.no_packing,
                  share_prompts=not a.no_share_prompts, precision="bf16" if a.bf16 or a.rlvr_bf16 else "model",
                  compile=a.compile)
    return tmp, model_dir, params, tasks, rl


def summarise(side: str, steps: list, gemm: str, rate: float) -> tuple[dict, dict]:
    """(JSON summary, table row) of one side's counted steps: (seconds, phase seconds, FLOPs) each."""
    med = statistics.median(s[0] for s in steps)
    phases = {p: statistics.median(s[1].get(p, 0.0) for s in steps) for p in PHASES[:-1]}
    phases["other"] = statistics.median(s[0] - sum(s[1].get(p, 0.0) for p in PHASES[:-1]) for s in steps)
    fb_rate = statistics.median(s[2] / (s[1]["forward"] + s[1]["backward"]) / 1e9 for s in steps)
    summary = {"s_per_step": med, "steps": len(steps), "phases_s": phases, "gemm": gemm,
               "fwd_bwd_gflops": fb_rate, "matmul_fraction": fb_rate / rate, "step_s_all": [s[0] for s in steps]}
    row = {"side": side, "gemm": gemm, "s/step": med, **{p: phases[p] for p in PHASES},
           "fwd+bwd GF/s": fb_rate, "of matmul": f"{fb_rate / rate:.0%}"}
    return summary, row


def rlvr_only(a, rounds: int, per_round: int) -> None:
    """``--rlvr-only``: rlvr's steps alone in this process (warm-up, then rounds with the matmul
    rate measured between them), no TRL imported."""
    _, _, params, _, rl = setup_rlvr(a, "grpo_rlvr_only_")
    dtype, gemm = (torch.bfloat16, "bf16") if a.bf16 or a.rlvr_bf16 else (torch.float32, "fp32")
    print(f"rlvr GRPO step alone: {a.size} model ({params / 1e6:.2f}M params), 8 prompts x 8 samples x <= 32 new "
          f"tokens, GEMMs {gemm}{' (compiled layers)' * a.compile}; {machine_note()}", flush=True)
    for _ in range(a.warmup):
        rl.step()
    steps, rates = [], [matmul_rate(dtype=dtype)]
    for r in range(rounds):
        steps += [rl.step() for _ in range(per_round)]
        rates.append(matmul_rate(dtype=dtype))
        print(f"  round {r + 1}/{rounds}: rlvr {statistics.median(s[0] for s in steps):.3f} s/step", flush=True)
    rate = statistics.median(rates)
    summary, row = summarise("rlvr", steps, gemm, rate)
    print()
    print_table([row], ["side", "gemm", "s/step", *PHASES, "fwd+bwd GF/s", "of matmul"])
    print(f"\n{gemm} matmul rate {rate:.0f} GFLOP/s (median of {len(rates)}: {', '.join(f'{x:.0f}' for x in rates)}); "
          f"{machine_note()}")
    write_json(a.json, {"size": a.size, "params": params, "rlvr_only": True, "matmul_rate_gflops": {gemm: rate},
                        "matmul_rates": {gemm: rates}, "machine": machine_note(), "threads": torch.get_num_threads(),
                        "rlvr_compile": a.compile, "rlvr": summary})


if __name__ == "__main__":
    main()
