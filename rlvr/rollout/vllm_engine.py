"""vLLM as the rollout engine (``rollout.engine: vllm``; the optional ``vllm`` extra, CUDA only).

What it does:
- ``VLLMEngine`` holds a ``vllm.LLM`` in the trainer's process, on the trainer's GPU, built from a
  model directory: the run's ``model`` when that is a directory and the run starts at step 0,
  else the trainer's current weights and tokenizer saved to ``<run>/vllm_init/``.
- ``generate`` follows ``rlvr.rollout.engine.generate``'s contract: prompts go in as token ids
  (``{"prompt_token_ids": ...}``), one ``vllm.SamplingParams`` per prompt with ``n``,
  ``temperature``, ``top_p``, ``max_tokens``, ``stop_token_ids`` (and ``ignore_eos``, so only
  those stop it, as in rlvr's engine), ``logprobs=0`` and a seed drawn from the caller's
  ``generator``. ``completions`` turns vLLM's ``RequestOutput``s into ``Completion``s: token ids
  as vLLM returns them, the sampled token's log-prob at each step, finish reason ``stop`` /
  ``length``.
- ``push`` loads the trainer's state dict into vLLM's model after each update (the model's own
  ``load_weights`` on (name, tensor) pairs, through ``LLM.apply_model``), drops vLLM's prefix
  cache (its K/V were computed by the old weights), then runs the canary: vLLM's prompt
  log-probs (``prompt_logprobs=0``) of ``rlvr.rollout.weights.canary_ids`` against the trainer's
  ``probe`` of the same version; more than ``rollout.vllm.canary_tolerance`` apart raises
  ``StaleWeightsError``. The same check runs once when the engine starts.

Why the log-probs match rlvr's engine: vLLM's V1 sampler computes the returned log-probs from the
raw logits, before temperature, penalties and top-k/top-p (``logprobs_mode`` default
``raw_logprobs``), and ``logprobs=0`` returns only the sampled token's; rlvr's engine records
``log pi`` at temperature 1 without top-p too. The trainer's ``rollout/logprob_mismatch_kl``
compares them with its own forward (nothing here computes it).

vLLM sources this follows (read through the docs and code search, not run here):
``vllm/v1/sample/sampler.py`` (log-probs from the raw logits; ``logprobs_mode``),
``vllm/sampling_params.py`` (``logprobs``: the top ``k`` plus the sampled token; ``prompt_logprobs``;
``ignore_eos``, ``stop_token_ids``, ``seed``, ``detokenize``; prompt log-probs skip reading the
prefix cache), ``vllm/outputs.py`` (``RequestOutput.outputs`` / ``prompt_logprobs``,
``CompletionOutput.index`` / ``token_ids`` / ``logprobs`` / ``finish_reason``),
``vllm/v1/engine/logprobs.py`` (prompt log-probs start with ``None`` for the first token),
``vllm/entrypoints/llm.py`` (``LLM.generate`` returns outputs in prompt order;
``LLM.apply_model``; ``LLM.reset_prefix_cache``), ``vllm/v1/engine/llm_engine.py`` and
``vllm/v1/worker/worker_base.py`` (``apply_model`` runs ``fn(worker.get_model())`` on each
worker). With ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (set here) the engine core runs in this
process, so ``apply_model`` hands the tensors over without pickling them; TRL's colocate mode
and verl reach the same model object through ``llm.llm_engine.model_executor.driver_worker``.

What it does not do: a separate vLLM server (in-process only), tensor parallelism, LoRA adapters,
the asynchronous producer or Ray workers (the config refuses those with ``engine: vllm``), stop
strings, ``rollout.precision: bf16`` (``rollout.vllm.dtype`` sets vLLM's dtype), and prefix reuse
across turns of an episode beyond vLLM's own prefix cache. Eval keeps rlvr's engine. Sampling is
reproducible only as far as vLLM's seeded sampling is (same seeds, same batch). Not run on a GPU
in this project yet: ``tests/test_vllm_engine.py``'s ``gpu`` test is written but unrun.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from rlvr.config import check_choice, check_range
from rlvr.errors import ConfigError
from rlvr.rollout.engine import Completion, SamplingParams, model_stop_ids
from rlvr.rollout.weights import canary_ids, compare_canary, probe

DTYPES = ("model", "float32", "bfloat16", "float16")
NEEDS = "rollout.engine: vllm needs the vllm extra (pip install 'rlvr[vllm]') and a CUDA GPU"


@dataclass
class VLLMConfig:
    """``rollout.vllm.*``: the vLLM engine's settings (used only with ``rollout.engine: vllm``)."""

    gpu_memory_utilization: float = 0.3
    """Share of the GPU's memory vLLM may take (its weights + KV cache). The trainer shares the
    GPU, so leave it what the update needs."""
    dtype: str = "model"
    """model | float32 | bfloat16 | float16: vLLM's compute dtype; ``model`` = the trainer's
    parameter dtype (vLLM's own "auto" would run an fp32 model in fp16)."""
    enforce_eager: bool = False
    """True: no CUDA graphs in vLLM (less memory, slower decoding)."""
    max_model_len: int = 0
    """Longest prompt + completion vLLM serves (its KV cache is sized for it); 0 = the model's
    ``max_position_embeddings``."""
    canary_tolerance: float = 0.05
    """Most the canary's per-token log-probs may differ between vLLM and the trainer's forward.
    Looser than the asynchronous engine copy's 1e-4: vLLM's kernels are not the trainer's (bf16
    more so). Not calibrated on a GPU yet."""

    def __post_init__(self) -> None:
        check_range("rollout.vllm.gpu_memory_utilization", self.gpu_memory_utilization, 0.01, 1.0)
        check_choice("rollout.vllm.dtype", self.dtype, DTYPES)
        check_range("rollout.vllm.max_model_len", self.max_model_len, 0)
        check_range("rollout.vllm.canary_tolerance", self.canary_tolerance, 0.0)


def require_vllm() -> None:
    """Raise ``ConfigError`` unless vllm is importable and CUDA is there (checked when the config
    is read, without importing vllm)."""
    has_vllm = importlib.util.find_spec("vllm") is not None
    has_cuda = torch.cuda.is_available()
    if has_vllm and has_cuda:
        return
    missing = [] if has_vllm else ["vllm is not installed here"]
    if not has_cuda:
        missing.append("this machine has no CUDA device (torch.cuda.is_available() is False)")
    raise ConfigError(f"{NEEDS}; {' and '.join(missing)}")


def completions(outputs: Sequence) -> list[Completion]:
    """vLLM's ``RequestOutput``s (one per prompt, in prompt order) as ``Completion``s, prompt-major:
    ``CompletionOutput.token_ids`` as they are, ``logprobs[i]`` the log-prob vLLM recorded for
    ``token_ids[i]`` (each step's dict maps token id -> ``Logprob``; with ``logprobs=0`` it holds
    the sampled token only), finish reason ``stop`` or ``length``."""
    out = []
    for i, request in enumerate(outputs):
        for c in sorted(request.outputs, key=lambda c: c.index):
            ids = [int(t) for t in c.token_ids]
            if c.logprobs is None or len(c.logprobs) != len(ids):
                raise ValueError(f"vLLM returned {0 if c.logprobs is None else len(c.logprobs)} log-prob steps for "
                                 f"{len(ids)} tokens (SamplingParams(logprobs=0) asks for one per token)")
            if c.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM finished a completion with {c.finish_reason!r} (not stop or length)")
            logprobs = [float(step[t].logprob) for t, step in zip(ids, c.logprobs)]
            out.append(Completion(i, ids, logprobs, c.finish_reason))
    return out


def prompt_logprobs(output, ids: Sequence[int]) -> torch.Tensor:
    """A ``RequestOutput``'s prompt log-probs of ``ids`` as rlvr's ``probe`` lays them out: [T]
    float32, 0.0 at position 0 (vLLM gives ``None`` there: the first token has no context)."""
    steps = output.prompt_logprobs
    if steps is None or len(steps) != len(ids):
        raise ValueError(f"vLLM returned {0 if steps is None else len(steps)} prompt log-probs for {len(ids)} tokens")
    return torch.tensor([0.0 if s is None else float(s[t].logprob) for t, s in zip(ids, steps)], dtype=torch.float32)


def vllm_sampling_params(vllm, params: SamplingParams, stop_ids: Sequence[int], seed: int | None):
    """rlvr's ``SamplingParams`` as vLLM's, for one prompt (see the module docstring)."""
    if params.stop:
        raise ValueError("the vllm engine does not take stop strings (SamplingParams.stop); use stop_token_ids")
    return vllm.SamplingParams(n=params.n, temperature=params.temperature, top_p=params.top_p,
                               max_tokens=params.max_new_tokens, stop_token_ids=list(stop_ids), ignore_eos=True,
                               logprobs=0, seed=seed, detokenize=False)


class VLLMEngine:
    """A ``vllm.LLM`` on ``model_dir`` serving ``version`` (``rlvr.rollout.engine_registry.RolloutEngine``)."""

    name = "vllm"

    def __init__(self, model_dir: str | Path, cfg: VLLMConfig, trainer: torch.nn.Module, *, version: int, seed: int,
                 max_num_seqs: int) -> None:
        require_vllm()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process: see push
        import vllm

        self.vllm, self.cfg, self.version = vllm, cfg, version
        dtype = str(next(trainer.parameters()).dtype).removeprefix("torch.") if cfg.dtype == "model" else cfg.dtype
        options = {"max_model_len": cfg.max_model_len} if cfg.max_model_len else {}
        self.llm = vllm.LLM(model=str(model_dir), dtype=dtype, gpu_memory_utilization=cfg.gpu_memory_utilization,
                            enforce_eager=cfg.enforce_eager, seed=seed, max_num_seqs=max_num_seqs,
                            skip_tokenizer_init=True, **options)
        self.stop_ids = model_stop_ids(trainer)
        self.canary = canary_ids(trainer.config.vocab_size)
        self.check(trainer, version, previous=version)  # the load from model_dir, and the tolerance

    def generate(self, model, prompts, params: SamplingParams, *, generator=None, pad_token_id=None,
                 batch_size=None, past=None, keep_cache=False) -> list[Completion]:
        """rlvr's ``generate`` contract on vLLM; ``model``, ``pad_token_id``, ``batch_size``
        (``max_num_seqs`` is set at start), ``past`` and ``keep_cache`` are not used."""
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if params.max_new_tokens == 0:  # vLLM wants max_tokens >= 1
            return [Completion(i, [], [], "length") for i in range(len(prompts)) for _ in range(params.n)]
        stop_ids = params.stop_token_ids if params.stop_token_ids is not None else self.stop_ids
        seeds = [None] * len(prompts) if generator is None else torch.randint(
            0, 2**31 - 1, (len(prompts),), generator=generator, device=generator.device).tolist()
        sampling = [vllm_sampling_params(self.vllm, params, stop_ids, s) for s in seeds]
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sampling, use_tqdm=False)
        return completions(outputs)

    def push(self, model: torch.nn.Module, version: int) -> None:
        """Load ``model``'s weights into vLLM's model as ``version``, then the canary."""
        state = model.state_dict()

        def load(vllm_model) -> None:  # runs on vLLM's worker, here in this process
            vllm_model.load_weights(iter(state.items()))  # HF names; vLLM fuses q/k/v, gate/up itself

        self.llm.apply_model(load)
        self.llm.reset_prefix_cache()
        previous, self.version = self.version, version
        self.check(model, version, previous)

    def canary_logprobs(self) -> torch.Tensor:
        """vLLM's log-probs of the canary sequence (its prompt log-probs), laid out as ``probe``'s."""
        sampling = self.vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        (output,) = self.llm.generate([{"prompt_token_ids": list(self.canary)}], sampling, use_tqdm=False)
        return prompt_logprobs(output, self.canary)

    def check(self, trainer: torch.nn.Module, version: int, previous: int) -> None:
        """``StaleWeightsError`` unless vLLM's canary log-probs match the trainer's ``probe``."""
        compare_canary(self.canary_logprobs(), probe(trainer, self.canary), version, previous,
                       self.cfg.canary_tolerance)

    def close(self) -> None:
        """Drop the ``LLM`` (its GPU memory goes when nothing else holds it)."""
        self.llm = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def vllm_engine(setup) -> VLLMEngine:
    """The engine for a run (``rlvr.rollout.engine_registry.EngineSetup``): from the run's ``model``
    directory at step 0, else from the trainer's weights saved to ``<run>/vllm_init/``."""
    require_vllm()
    source = Path(setup.model_source)
    if setup.version == 0 and source.is_dir():
        model_dir = source
    else:
        from rlvr.model.checkpoint import save_model_dir

        model_dir = setup.run_dir / "vllm_init"
        save_model_dir(model_dir, setup.model, setup.tokenizer)
    return VLLMEngine(model_dir, setup.rollout.vllm, setup.model, version=setup.version, seed=setup.seed,
                      max_num_seqs=setup.rollout.batch_size)
