"""The ``judge`` reward source: an LLM judge reached over an OpenAI-compatible endpoint.

For each sample the judge gets one user message: the rubric with ``{prompt}`` (the task's prompt
text) and ``{response}`` (the response text) filled in, re-templated by the *judge's* server with
its own tokenizer and chat template (nothing of the policy's tokenisation is sent); ``model`` names
the judge, else the first model the server lists (``GET /v1/models``). Greedy (temperature 0),
``max_tokens`` short. The score is read one of two ways (``parse``):

    number     the first number in the answer; outside [min_score, max_score] it is a failure
    logprobs   the expected score over the digit tokens among the first answer token's
               ``top_logprobs`` (20 asked for), renormalised over the digits in range: a score
               whatever the judge writes, as long as one digit is among its top tokens

and mapped to [0, 1] by the score range. Requests run ``concurrency`` at a time; each has
``timeout_s`` per try and ``retries`` more tries (backoff 0.5 s, doubling), so a step never waits
more than about (retries + 1) x timeout_s per request round. A request still failing after them
(unreachable server, HTTP error, malformed body, an answer with no score) follows ``on_failure``:
``fail`` ends the run with one line naming the source and the cause; ``zero`` scores that sample
0, counts it in ``rollout/score/<name>_failed`` and prints the first cause once.

Structured output: rlvr's own server refuses ``response_format`` json_schema with a 400 (no
constrained decoding yet), so the judge does not send it; ``logprobs`` parsing is the way to a
score on every answer.
"""

from __future__ import annotations

import math
import os
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from rlvr.errors import UserError
from rlvr.http_json import Client, RemoteError
from rlvr.reward_source_config import SourceConfig
from rlvr.reward_sources.registry import REWARD_SOURCES, response_of
from rlvr.types import Scored

DEFAULT_RUBRIC = ("Rate how correct and complete the response is, from {min_score} (wrong) to {max_score} "
                  "(fully correct). Reply with the number only.\n\nTask:\n{prompt}\n\nResponse:\n{response}\n\nScore:")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
TOP_LOGPROBS = 20


class JudgeFailure(Exception):
    """One request's failure after its retries (its message is one line)."""


def prompt_text(messages: tuple) -> str:
    """The task's prompt as text: the user turn alone, else the turns as ``role: content`` lines."""
    if len(messages) == 1:
        return str(messages[0]["content"])
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


def parse_number(text: str, lo: float, hi: float) -> float:
    m = NUMBER.search(text or "")
    if not m:
        raise JudgeFailure(f"no score in the judge's answer {text[:60]!r}")
    value = float(m.group())
    if not lo <= value <= hi:
        raise JudgeFailure(f"score {value:g} outside [{lo:g}, {hi:g}]")
    return value


def parse_logprobs(choice: dict, lo: int, hi: int) -> float:
    """Expected digit over the first token's top alternatives that are digits in [lo, hi]."""
    content = ((choice.get("logprobs") or {}).get("content") or [])
    if not content:
        raise JudgeFailure("the judge's answer has no logprobs (does the server serve top_logprobs?)")
    weights: dict[int, float] = {}
    for alt in content[0].get("top_logprobs") or []:
        token = str(alt.get("token", "")).strip()
        if token.isdigit() and lo <= int(token) <= hi:
            weights[int(token)] = weights.get(int(token), 0.0) + math.exp(float(alt["logprob"]))
    total = sum(weights.values())
    if total <= 0:
        raise JudgeFailure("no score digit among the judge's top tokens")
    return sum(d * w for d, w in weights.items()) / total


class JudgeSource:
    can_fail = True

    def __init__(self, cfg: SourceConfig) -> None:
        self.name, self.cfg = cfg.name, cfg
        key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        if cfg.api_key_env and not key:
            raise UserError(f"reward.sources.{cfg.name}.api_key_env: environment variable {cfg.api_key_env} is not set")
        self.client = Client(cfg.url, key, cfg.timeout_s, label=f"reward.sources.{cfg.name} (judge)")
        self.pool = ThreadPoolExecutor(cfg.concurrency, thread_name_prefix=f"judge-{cfg.name}")
        self.rubric = cfg.rubric or DEFAULT_RUBRIC
        self.warned = False
        self.model = cfg.model
        self.model_lock = threading.Lock()

    def served_model(self) -> str:
        """``model``, else the first model the server lists (``GET /v1/models``), asked once."""
        with self.model_lock:
            if not self.model:
                listed = self.client.call("/v1/models").get("data") or []
                if not listed or not isinstance(listed[0], dict) or not listed[0].get("id"):
                    raise JudgeFailure("the server lists no model (GET /v1/models); set the source's model")
                self.model = str(listed[0]["id"])
            return self.model

    def request(self, s: Scored) -> dict:
        prompt, response = response_of(s)
        text = self.rubric.format(prompt=prompt_text(prompt), response=response,
                                  min_score=f"{self.cfg.min_score:g}", max_score=f"{self.cfg.max_score:g}")
        body = {"model": self.served_model(), "messages": [{"role": "user", "content": text}],
                "max_tokens": self.cfg.max_tokens, "temperature": 0.0}
        if self.cfg.parse == "logprobs":
            body.update(logprobs=True, top_logprobs=TOP_LOGPROBS)
        return body

    def judge_one(self, s: Scored) -> float:
        """One sample's score in [0, 1], trying ``retries`` more times; ``JudgeFailure`` after them."""
        c, wait, cause = self.cfg, 0.5, ""
        for attempt in range(c.retries + 1):
            if attempt:
                time.sleep(wait)
                wait *= 2
            try:
                answer = self.client.call("/v1/chat/completions", self.request(s))
                choice = (answer.get("choices") or [{}])[0]
                if c.parse == "logprobs":
                    value = parse_logprobs(choice, int(c.min_score), int(c.max_score))
                else:
                    value = parse_number((choice.get("message") or {}).get("content") or "", c.min_score, c.max_score)
                return (value - c.min_score) / (c.max_score - c.min_score)
            except (RemoteError, JudgeFailure, KeyError, TypeError, ValueError, AttributeError) as e:
                cause = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise JudgeFailure(f"{cause} (after {c.retries + 1} tries)")

    def score(self, batch: list[Scored]) -> list[float | None]:
        futures = [self.pool.submit(self.judge_one, s) for s in batch]
        out: list[float | None] = []
        for f in futures:
            try:
                out.append(f.result())
            except JudgeFailure as e:
                if self.cfg.on_failure == "fail":
                    for rest in futures:
                        rest.cancel()
                    raise UserError(f"reward.sources.{self.name} (judge at {self.cfg.url}): {e}; on_failure is "
                                    f"'fail' (set it to 'zero' to score such samples 0 and go on)") from None
                if not self.warned:
                    print(f"reward.sources.{self.name}: judge failed ({e}); scoring 0 and counting it in "
                          f"rollout/score/{self.name}_failed", file=sys.stderr)
                    self.warned = True
                out.append(None)
        return out


REWARD_SOURCES.register("judge")(JudgeSource)
