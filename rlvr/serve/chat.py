"""OpenAI chat messages and tool calls to and from rlvr's text conventions.

In: ``developer`` messages are ``system`` ones; an assistant message's ``tool_calls`` become
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks after its text (the format of
``rlvr/tool_calls.py`` that tool-use tasks train on), and a ``tool`` message is a
``{"role": "tool", "name": ..., "content": ...}`` message as the environments write it (its name
looked up from the call it answers). The ``tools`` definitions go to the tokenizer's chat
template as OpenAI function schemas, as ``rlvr.envs.tools.Tool.schema()`` gives them.

Out: every closed ``<tool_call>`` block of the generated text whose body is a JSON object with a
string ``name`` (and an object ``arguments``) becomes an OpenAI tool call; the text around them is
the message content. A block that does not parse stays in the content.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from jinja2 import TemplateError

from rlvr.model.tokenizer import encode_chat_prompt
from rlvr.serve.protocol import ChatMessage, ToolDef
from rlvr.tool_calls import CALL_OPEN, CALL_PATTERN, format_call


class BadField(ValueError):
    """A request field the server cannot use: ``param`` names it (``messages[2].tool_calls``)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def render_messages(messages: list[ChatMessage]) -> list[dict]:
    """The messages as rlvr's chat template takes them (see the module docstring)."""
    out, names = [], {}
    for i, m in enumerate(messages):
        text = m.text()
        if m.role == "assistant" and m.tool_calls:
            calls = []
            for j, call in enumerate(m.tool_calls):
                try:
                    args = json.loads(call.function.arguments or "{}")
                except json.JSONDecodeError as e:
                    raise BadField(f"messages[{i}].tool_calls[{j}].function.arguments",
                                   f"arguments is not valid JSON: {e.msg}") from None
                if not isinstance(args, dict):
                    raise BadField(f"messages[{i}].tool_calls[{j}].function.arguments", "arguments must be a JSON object")
                calls.append(format_call(call.function.name, args))
                names[call.id] = call.function.name
            text = text + "".join(calls)
        message = {"role": "system" if m.role == "developer" else m.role, "content": text}
        if m.role == "tool":
            name = m.name or names.get(m.tool_call_id or "")
            if name:
                message["name"] = name
        out.append(message)
    return out


def encode_chat(tokenizer, messages: list[ChatMessage], tools: list[ToolDef] | None) -> list[int]:
    """Prompt token ids: the rendered messages through the chat template, with the tools."""
    schemas = [t.model_dump() for t in tools] if tools else None
    try:
        return encode_chat_prompt(tokenizer, render_messages(messages), schemas)
    except (TemplateError, ValueError, TypeError, KeyError) as e:  # e.g. a template that refuses the roles' order
        if isinstance(e, BadField):
            raise
        raise BadField("messages", f"the chat template cannot render these messages: {e}") from None


@dataclass
class ParsedReply:
    content: str | None
    tool_calls: list[dict]


def parse_reply(text: str) -> ParsedReply:
    """Content and OpenAI ``tool_calls`` of a generated assistant text (see the module docstring)."""
    calls, kept, last = [], [], 0
    for m in CALL_PATTERN.finditer(text):
        call = _call(m.group(1))
        if call is None:
            continue
        kept.append(text[last:m.start()])
        last = m.end()
        calls.append(call)
    kept.append(text[last:])
    content = "".join(kept)
    return ParsedReply(content if content.strip() or not calls else None, calls)


def _call(body: str) -> dict | None:
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    if not isinstance(args, dict):
        return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(args)}}


TOOL_MARKERS = (CALL_OPEN,)
