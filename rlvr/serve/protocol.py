"""OpenAI request schemas for ``rlvr serve`` (pydantic, validated by FastAPI), and the rlvr
extensions. Responses are plain dicts built in ``rlvr/serve/responses.py``.

Fields OpenAI defines that are not listed here (``frequency_penalty``, ``logit_bias``, ...) are
ignored. Limits: ``top_logprobs`` (chat, with ``logprobs: true``) and ``logprobs``
(completions) take 0 to 20 alternatives per generated token (the fast mode's speculative engine:
0 only); ``tool_choice`` is ``auto`` or ``none``; ``response_format`` is ``text`` only (a JSON format is refused with a 400, never
answered with unconstrained text).

rlvr extensions (send them in the JSON body; with the ``openai`` client, ``extra_body``):
- ``return_token_ids: true``: the response carries the prompt's token ids (``prompt_token_ids``:
  on the response for chat, on each choice for completions) and each choice's generated ids
  (``token_ids``), as vLLM names them.
- ``ignore_eos: true``: generation does not stop on the EOS token (fixed-length outputs for a
  load test); ``stop_token_ids: [...]``: stop on these ids too (vLLM's names).
- ``echo: true`` with ``logprobs: 0`` on ``/v1/completions`` (``max_tokens: 0`` allowed) returns
  the prompt tokens' log-probs too (the first token's is null, as OpenAI's).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


TOP_LOGPROBS = 20
"""Most alternatives a request may ask for per token (``top_logprobs``; ``logprobs`` of completions)."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionDef(_Body):
    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolDef(_Body):
    type: Literal["function"] = "function"
    function: FunctionDef


class FunctionCall(_Body):
    name: str
    arguments: str = "{}"
    """A JSON object as a string (OpenAI's format)."""


class ToolCallIn(_Body):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    """What chat and completions requests share."""

    model: str
    n: int = Field(1, ge=1, le=64)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    return_token_ids: bool = False
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        return v

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    response_format: ResponseFormat | None = None
    """``text`` only: structured output (``json_object``, ``json_schema``) would need decoding
    constrained to a grammar, which is not built; such a request gets a 400 naming the field."""
    max_completion_tokens: int | None = Field(None, ge=0)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["auto", "none"] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=TOP_LOGPROBS)


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)
    logprobs: int | None = Field(None, ge=0, le=TOP_LOGPROBS)
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, list) and (not v or any(isinstance(p, list) and not p for p in v)):
            raise ValueError("prompt must not be empty")
        if v == "":
            raise ValueError("prompt must not be empty")
        return v


class WeightsRequest(_Body):
    path: str = Field(min_length=1)
    """A Hugging Face model directory of the served architecture (e.g. a training checkpoint's)."""


class FeedbackRequest(_Body):
    """``POST /v1/feedback``: a judgement of a captured response (at least one of rating,
    correction and label)."""

    id: str = Field(min_length=1)
    """The response's ``id`` (``chatcmpl-...`` / ``cmpl-...``)."""
    choice: int = Field(0, ge=0)
    rating: Literal["up", "down"] | None = None
    correction: str | None = Field(None, min_length=1)
    """The answer the response should have given."""
    label: str | None = Field(None, min_length=1, max_length=200)
    reason: str | None = Field(None, max_length=4000)
