"""Tool calling: tool definitions, parsing ``<tool_call>`` blocks, and running a call safely.

The assistant calls a tool in the format of ``rlvr.tool_calls`` and the result comes back as a ``{"role": "tool", "name": ..., "content": ...}`` message.
``Tool.schema()`` is the OpenAI/Hugging Face function schema that ``apply_chat_template(...,
tools=[...])`` renders. Model output is untrusted: ``parse_tool_call`` never raises on it; a
malformed call is a ``ToolCallError`` whose message becomes the error observation.

Not here: what a tool does (each environment binds its own functions), where code runs (the
sandbox, called by the environment's tools).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlvr.tool_calls import CALL_CLOSE, CALL_OPEN, find_tool_calls
_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool,
               "object": dict, "array": list}
MAX_RESULT_CHARS = 2000  # a tool result longer than this is cut (head kept, marked)


@dataclass(frozen=True)
class Tool:
    """One callable tool: a name, a description, its parameters (name -> (JSON type, doc)) and
    the trusted function that implements it (called with the parsed arguments as keywords)."""

    name: str
    description: str
    fn: Callable[..., str]
    parameters: dict[str, tuple[str, str]] = field(default_factory=dict)
    required: tuple[str, ...] | None = None  # None: every parameter is required
    grant: Any = None
    """What the tool may touch (``rlvr.envs.grants.Grant``); None: a control tool that runs no
    code of its own (``submit``), or a test environment's in-process tool."""
    paths: dict[str, str] = field(default_factory=dict)
    """Arguments that name a workspace path -> ``read`` | ``write``: checked against the grant
    before the tool runs."""

    def schema(self) -> dict[str, Any]:
        """The function schema ``apply_chat_template(tools=...)`` renders (OpenAI format)."""
        props = {n: {"type": t, "description": d} for n, (t, d) in self.parameters.items()}
        required = list(self.parameters) if self.required is None else list(self.required)
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "properties": props, "required": required}}}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


class ToolCallError(Exception):
    """A malformed or invalid call; ``str(e)`` is shown to the model as the tool result."""


def parse_tool_call(text: str) -> ToolCall | None:
    """The one tool call in an assistant turn; None when the turn has no ``<tool_call>`` at all.

    Raises ``ToolCallError`` for an unclosed block, more than one call, invalid JSON, or a body
    that is not ``{"name": str, "arguments": {...}}``.
    """
    if CALL_OPEN not in text:
        return None
    bodies = find_tool_calls(text)
    if not bodies:
        raise ToolCallError(f"error: unclosed {CALL_OPEN}; write {CALL_OPEN}{{\"name\": ..., \"arguments\": {{...}}}}{CALL_CLOSE}")
    if len(bodies) > 1:
        raise ToolCallError(f"error: {len(bodies)} tool calls in one turn; call one tool per turn")
    try:
        obj = json.loads(bodies[0])
    except (json.JSONDecodeError, RecursionError) as e:
        raise ToolCallError(f"error: the tool call is not valid JSON ({e.msg if hasattr(e, 'msg') else e})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ToolCallError('error: a tool call is {"name": "<tool>", "arguments": {...}}')
    args = obj.get("arguments", {})
    if not isinstance(args, dict):
        raise ToolCallError('error: "arguments" must be a JSON object')
    extra = set(obj) - {"name", "arguments"}
    if extra:
        raise ToolCallError(f"error: unexpected key(s) {sorted(extra)} in the tool call")
    return ToolCall(obj["name"], args)


def run_tool(tools: dict[str, Tool], call: ToolCall,
             check: Callable[[Tool, dict[str, Any]], None] | None = None) -> str:
    """Check ``call`` against the tool's parameters (then ``check(tool, arguments)``, the
    grant's path check) and run it. Raises ``ToolCallError`` for an unknown tool or wrong
    arguments; the tool's own ``ToolCallError`` passes through. The result is cut to
    ``MAX_RESULT_CHARS``."""
    tool = tools.get(call.name)
    if tool is None:
        raise ToolCallError(f"error: unknown tool {call.name!r}; tools: {', '.join(sorted(tools))}")
    required = tool.parameters if tool.required is None else tool.required
    missing = [p for p in required if p not in call.arguments]
    if missing:
        raise ToolCallError(f"error: {call.name} needs argument(s) {', '.join(missing)}")
    unknown = [a for a in call.arguments if a not in tool.parameters]
    if unknown:
        raise ToolCallError(f"error: {call.name} has no argument(s) {', '.join(unknown)}")
    for arg, value in call.arguments.items():
        want = _JSON_TYPES.get(tool.parameters[arg][0], object)
        if not isinstance(value, want) or (want is not bool and isinstance(value, bool)):
            raise ToolCallError(f"error: argument {arg} of {call.name} must be a {tool.parameters[arg][0]}")
    if check is not None:
        check(tool, call.arguments)
    return cut_result(tool.fn(**call.arguments))


def cut_result(text: str) -> str:
    """``text`` cut to ``MAX_RESULT_CHARS`` (head kept, marked): what any observation may carry,
    a tool's result or an error message that quotes the model's call."""
    if len(text) <= MAX_RESULT_CHARS:
        return text
    return text[:MAX_RESULT_CHARS] + f"\n[... cut: {len(text) - MAX_RESULT_CHARS} more characters]"


def tool_message(name: str, content: str) -> dict[str, str]:
    return {"role": "tool", "name": name, "content": content}
