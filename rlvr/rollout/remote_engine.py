"""A remote OpenAI-compatible server as the rollout engine (``rollout.engine: remote``).

The trainer generates through any server whose ``/v1/completions`` takes a prompt as token ids
and returns token ids and the sampled tokens' log-probs: ``rlvr serve`` (docs/serve.md), vLLM's
``vllm serve``, SGLang. Keys: ``rollout.remote.*`` (``RemoteConfig``); docs/rollout.md, "Remote
engines".

What it does:
- ``generate`` follows ``rlvr.rollout.engine.generate``'s contract: one ``/v1/completions``
  request per prompt (``prompt`` = its token ids, ``n``, ``temperature``, ``top_p``,
  ``max_tokens``, ``stop_token_ids`` (vLLM's name), ``logprobs: 0``, ``return_token_ids: true``,
  and at temperature > 0 a ``seed`` drawn from the caller's generator), at most
  ``max_concurrency`` in flight, answers put back prompt-major. Each choice becomes a
  ``Completion``: its ``token_ids``, ``logprobs.token_logprobs`` (the server's log-prob of each
  sampled token: rlvr serve and vLLM give ``log pi`` at temperature 1 without top-p, as rlvr's
  engine records it; the trainer's ``rollout/logprob_mismatch_kl`` shows where a server differs)
  and its finish reason. At temperature 0 no seed is drawn: the run's generator moves exactly as
  with rlvr's engine, so a greedy run through the server repeats the in-process run.
- At start a probe request (two tokens of the canary) refuses a server whose answer lacks
  per-choice ``token_ids`` or numeric ``logprobs.token_logprobs``, naming what is missing.
- ``push`` (``weight_push: disk``) saves the trainer's weights with ``save_model_dir``
  (safetensors + config + tokenizer) to ``weights_dir`` (default ``<run>/remote_weights``; the
  server must read the same path) and POSTs ``/v1/weights`` ``{"path": DIR}`` with the admin token
  (rlvr serve's route; it answers after the swap). At start it pushes the trainer's starting
  weights the same way, so a resumed run, a server started from another checkpoint, a wrong
  token or a directory the server cannot read fail before the first batch.
- The canary, after every push and at start: the server's log-probs of ``canary_ids`` (``echo:
  true``, ``logprobs: 0``, ``max_tokens: 1``, temperature 0: the prompt tokens' log-probs, the
  first one null) against the trainer's ``probe``; more than ``canary_tolerance`` apart raises
  ``StaleWeightsError`` (``compare_canary``). A push that did not happen fails there, right after
  the update, so the next batch never starts. Before each batch the server's version
  (``/v1/models``' ``version``, rlvr serve's extension) must still be the one the push returned,
  and rlvr serve's ``system_fingerprint`` (``rlvr-v<version>``) must name only it: weights pushed
  by someone else in between are refused too.
- ``weight_push: none``: the server's weights are never changed, so it serves one fixed policy
  while the trainer moves away from it; allowed only when the config says so, it warns once, and
  the canary still runs at start (the server must serve the trainer's starting weights). The
  version the engine reports follows the trainer's (no push to wait for): the run is off-policy
  and its ``rollout/logprob_mismatch_kl`` grows.

What it does not do: stop strings (``SamplingParams.stop``; use ``stop_token_ids``), prefix reuse
across turns (``past``/``keep_cache`` are ignored), streaming, retries other than of HTTP 429 (the
server's queue is full: retried with backoff until ``timeout_s``; any other HTTP error or a timeout
ends the run with one line naming ``base_url``), or weight transfer other than through a shared
directory (NCCL broadcast, vLLM's and SGLang's own update routes: not built).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from rlvr.config import check_choice, check_range
from rlvr.errors import ConfigError
from rlvr.http_json import Client, RemoteError
from rlvr.rollout.engine import Completion, SamplingParams, model_stop_ids
from rlvr.rollout.weights import StaleWeightsError, canary_ids, compare_canary, probe

PUSHES = ("disk", "none")


@dataclass
class RemoteConfig:
    """``rollout.remote.*``: the remote server's settings (used only with ``rollout.engine: remote``)."""

    base_url: str = ""
    """The server's root, e.g. http://127.0.0.1:8000 (``/v1/...`` is appended; a trailing /v1 is
    accepted too)."""
    api_key: str = ""
    """Bearer key of the generation routes; empty: the environment variable ``api_key_env``."""
    api_key_env: str = "RLVR_API_KEY"
    """Environment variable holding the API key when ``api_key`` is empty (unset: no key sent)."""
    model: str = ""
    """The model name sent with each request; empty: the first one ``/v1/models`` lists."""
    timeout_s: float = 300.0
    """Most seconds one HTTP request may take."""
    max_concurrency: int = 8
    """Requests in flight at once (one per prompt, each with ``n`` choices)."""
    weight_push: str = "disk"
    """disk | none: after each update save the weights to ``weights_dir`` and POST /v1/weights;
    or never change the server's weights (a fixed policy: off-policy training, set explicitly)."""
    weights_dir: str = ""
    """Where ``disk`` saves the weights (a path the server reads too); empty: <run>/remote_weights."""
    admin_token: str = ""
    """Bearer token of POST /v1/weights; empty: the environment variable ``admin_token_env``."""
    admin_token_env: str = "RLVR_ADMIN_TOKEN"
    """Environment variable holding the admin token when ``admin_token`` is empty."""
    canary_tolerance: float = 0.05
    """Most the canary's per-token log-probs may differ between the server and the trainer's
    forward. 1e-3 is ample for rlvr serve in float32 on the trainer's device type; bf16 or other
    kernels (vLLM, SGLang) need more (the vLLM engine's 0.05, not calibrated on a GPU)."""

    def __post_init__(self) -> None:
        check_choice("rollout.remote.weight_push", self.weight_push, PUSHES)
        check_range("rollout.remote.timeout_s", self.timeout_s, 0.001)
        check_range("rollout.remote.max_concurrency", self.max_concurrency, 1)
        check_range("rollout.remote.canary_tolerance", self.canary_tolerance, 0.0)
        if self.base_url and not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"config key 'rollout.remote.base_url' = {self.base_url!r} must start with http:// or "
                              "https://")

    def require(self) -> None:
        """Raise ``ConfigError`` naming ``rollout.engine: remote`` where the engine cannot start."""
        if not self.base_url:
            raise ConfigError("rollout.engine: remote needs config key 'rollout.remote.base_url' (the server's root, "
                              "e.g. http://127.0.0.1:8000)")

    def secret(self, value: str, env: str) -> str:
        return value or os.environ.get(env, "")


def choice_completion(choice: dict, prompt_index: int, stop_ids: Sequence[int] | None, where: str) -> Completion:
    """One ``/v1/completions`` choice as a ``Completion`` (``where`` names the server in errors;
    ``stop_ids`` None: the stop rule is not checked)."""
    ids = choice.get("token_ids")
    lps = (choice.get("logprobs") or {}).get("token_logprobs")
    if not isinstance(ids, list):
        raise RemoteError(f"rollout.engine: remote: {where} returned no per-choice token_ids (the request asks for "
                          "return_token_ids: true; rlvr serve and vLLM >= 0.10.2 answer it)")
    if not isinstance(lps, list) or len(lps) != len(ids) or any(not isinstance(x, (int, float)) for x in lps):
        got = "none" if not isinstance(lps, list) else f"{len(lps)} for {len(ids)} tokens"
        raise RemoteError(f"rollout.engine: remote: {where} returned no log-prob per sampled token "
                          f"(logprobs.token_logprobs: {got}; the request asks for logprobs: 0)")
    reason = choice.get("finish_reason")
    if reason not in ("stop", "length"):
        raise RemoteError(f"rollout.engine: remote: {where} finished a completion with {reason!r} (not stop or length)")
    stopped_at = [i for i, t in enumerate(ids) if stop_ids is not None and t in stop_ids]
    if stop_ids is not None and (reason == "stop") != (stopped_at == [len(ids) - 1]):
        raise RemoteError(f"rollout.engine: remote: {where} returned finish_reason {reason!r} with stop tokens at "
                          f"{stopped_at} of {len(ids)}: it does not stop on stop_token_ids exactly (keeping the "
                          "stop token), as the trainer needs")
    return Completion(prompt_index, [int(t) for t in ids], [float(x) for x in lps], reason)


class RemoteEngine:
    """Generation on a remote server serving ``version`` (``rlvr.rollout.engine_registry.RolloutEngine``)."""

    name = "remote"

    def __init__(self, cfg: RemoteConfig, trainer: torch.nn.Module, tokenizer, *, version: int,
                 weights_dir: Path) -> None:
        cfg.require()
        self.cfg, self.tokenizer, self.weights_dir = cfg, tokenizer, Path(weights_dir)
        self.client = Client(cfg.base_url, cfg.secret(cfg.api_key, cfg.api_key_env), cfg.timeout_s)
        self.pool = ThreadPoolExecutor(cfg.max_concurrency, thread_name_prefix="rlvr-remote")
        self.stop_ids = model_stop_ids(trainer)
        self.canary = canary_ids(trainer.config.vocab_size)
        self.model = cfg.model or self.served_model()
        self.server_version: int | None = None
        self.check_features()
        self.version = version
        if cfg.weight_push == "disk":
            self.push(trainer, version)  # the trainer's starting weights (also checks the route and the token)
        else:
            warnings.warn("rollout.remote.weight_push: none: the server keeps its weights, so every batch comes "
                          "from the starting policy (off-policy training)", stacklevel=2)
            self.server_version = self.models_version()
            self.check(trainer, version, version)

    @property
    def where(self) -> str:
        return self.client.root

    # -- what the server offers ------------------------------------------------------------------
    def served_model(self) -> str:
        data = self.client.call("/v1/models").get("data") or []
        if not data or "id" not in data[0]:
            raise RemoteError(f"rollout.engine: remote: {self.where}/v1/models lists no model; set "
                              "rollout.remote.model")
        return str(data[0]["id"])

    def models_version(self) -> int | None:
        """The served weights' version where the server reports one (rlvr serve), else None."""
        for m in self.client.call("/v1/models").get("data") or []:
            if m.get("id") == self.model and isinstance(m.get("version"), int):
                return m["version"]
        return None

    def check_features(self) -> None:
        """Refuse a server whose completions lack token ids or sampled-token log-probs."""
        answer = self.complete(self.canary[:2], max_tokens=1, temperature=0.0, stop_ids=())
        choice_completion(answer["choices"][0], 0, None, self.where)

    def complete(self, prompt: Sequence[int], **kw) -> dict:
        body = {"model": self.model, "prompt": list(prompt), "n": kw.get("n", 1), "max_tokens": kw["max_tokens"],
                "temperature": kw["temperature"], "top_p": kw.get("top_p", 1.0), "logprobs": 0,
                "return_token_ids": True, "stop_token_ids": list(kw["stop_ids"]), "ignore_eos": True,
                "skip_special_tokens": False, **({"seed": kw["seed"]} if kw.get("seed") is not None else {}),
                **({"echo": True} if kw.get("echo") else {})}
        answer = self.client.call("/v1/completions", body)
        if not isinstance(answer.get("choices"), list) or len(answer["choices"]) != body["n"]:
            raise RemoteError(f"rollout.engine: remote: {self.where} answered {len(answer.get('choices') or [])} "
                              f"choices for n = {body['n']}")
        return answer

    # -- the rollout contract --------------------------------------------------------------------
    def generate(self, model, prompts, params: SamplingParams, *, generator=None, pad_token_id=None,
                 batch_size=None, past=None, keep_cache=False) -> list[Completion]:
        """rlvr's ``generate`` contract on the server; ``model``, ``pad_token_id``,
        ``batch_size`` (``max_concurrency`` bounds the load), ``past`` and ``keep_cache`` are not used."""
        if params.stop:
            raise ValueError("the remote engine does not take stop strings (SamplingParams.stop); use stop_token_ids")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        self.check_version()
        if params.max_new_tokens == 0:
            return [Completion(i, [], [], "length") for i in range(len(prompts)) for _ in range(params.n)]
        stop_ids = params.stop_token_ids if params.stop_token_ids is not None else self.stop_ids
        seeds: list[int | None] = [None] * len(prompts)
        if params.temperature > 0 and generator is not None:  # greedy draws nothing, as rlvr's engine
            seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator,
                                  device=generator.device).tolist()

        def one(i: int) -> list[Completion]:
            answer = self.complete(prompts[i], n=params.n, max_tokens=params.max_new_tokens,
                                   temperature=params.temperature, top_p=params.top_p, stop_ids=stop_ids,
                                   seed=seeds[i])
            self.check_fingerprint(answer)
            choices = sorted(answer["choices"], key=lambda c: c.get("index", 0))
            return [choice_completion(c, i, stop_ids, self.where) for c in choices]

        return [c for group in self.pool.map(one, range(len(prompts))) for c in group]

    def push(self, model: torch.nn.Module, version: int) -> None:
        """Serve ``model``'s weights as ``version`` (``weight_push: disk``), then the canary."""
        previous = self.version
        if self.cfg.weight_push == "disk":
            from rlvr.model.checkpoint import save_model_dir

            save_model_dir(self.weights_dir, model, self.tokenizer)
            self.server_version = self.upload(self.weights_dir)
        self.version = version
        if self.cfg.weight_push == "disk":
            self.check(model, version, previous)

    def upload(self, directory: Path) -> int | None:
        """POST /v1/weights {"path": directory}; the server's new version (None if it names none)."""
        token = self.cfg.secret(self.cfg.admin_token, self.cfg.admin_token_env)
        if not token:
            raise ConfigError("rollout.remote.weight_push: disk needs the server's admin token: config key "
                              f"'rollout.remote.admin_token' or env {self.cfg.admin_token_env} (or weight_push: none "
                              "for a server whose weights never change)")
        answer = self.client.call("/v1/weights", {"path": str(Path(directory).resolve())}, token=token)
        return answer.get("version") if isinstance(answer.get("version"), int) else None

    # -- the version checks ----------------------------------------------------------------------
    def canary_logprobs(self) -> torch.Tensor:
        """The server's log-probs of the canary sequence, laid out as ``probe``'s (0.0 first)."""
        answer = self.complete(self.canary, max_tokens=1, temperature=0.0, stop_ids=(), echo=True)
        lps = (answer["choices"][0].get("logprobs") or {}).get("token_logprobs")
        if not isinstance(lps, list) or len(lps) < len(self.canary):
            raise RemoteError(f"rollout.engine: remote: {self.where} returned no prompt log-probs for the canary "
                              "(echo: true with logprobs: 0 must return the prompt tokens' log-probs)")
        return torch.tensor([0.0 if x is None else float(x) for x in lps[:len(self.canary)]], dtype=torch.float32)

    def check(self, trainer: torch.nn.Module, version: int, previous: int) -> None:
        """``StaleWeightsError`` unless the server's canary log-probs match the trainer's ``probe``."""
        compare_canary(self.canary_logprobs(), probe(trainer, self.canary), version, previous,
                       self.cfg.canary_tolerance)

    def check_version(self) -> None:
        """Before a batch: the server still serves the version this engine's last push gave it."""
        if self.server_version is None:
            return
        now = self.models_version()
        if now is not None and now != self.server_version:
            raise StaleWeightsError(f"rollout engine 'remote' at {self.where}: the server serves weights version "
                                    f"{now}, the trainer's last push gave it {self.server_version} (someone else "
                                    "changed its weights)")

    def check_fingerprint(self, answer: dict) -> None:
        """rlvr serve names the versions that produced an answer (``rlvr-v3``): only the pushed one."""
        fp = answer.get("system_fingerprint")
        if self.server_version is None or not isinstance(fp, str) or not fp.startswith("rlvr-v"):
            return
        if fp != f"rlvr-v{self.server_version}":
            raise StaleWeightsError(f"rollout engine 'remote' at {self.where}: an answer came from weights {fp}, the "
                                    f"trainer's last push gave the server version {self.server_version}")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def remote_engine(setup) -> RemoteEngine:
    """The engine for a run (``rlvr.rollout.engine_registry.EngineSetup``)."""
    cfg: RemoteConfig = setup.rollout.remote
    cfg.require()
    weights_dir = Path(cfg.weights_dir) if cfg.weights_dir else setup.run_dir / "remote_weights"
    return RemoteEngine(cfg, setup.model, setup.tokenizer, version=setup.version, weights_dir=weights_dir)
