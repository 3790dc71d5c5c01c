"""The tool-call text format: what an assistant turn that calls a tool looks like.

    <tool_call>{"name": "read_file", "arguments": {"path": "ops.py"}}</tool_call>

(the widely used Hermes/Qwen format). Shared by the task generators, whose reference
transcripts contain calls, and the environments (``rlvr.envs.tools``), which parse and run them;
it sits below both so that ``rlvr.tasks`` never imports ``rlvr.envs``.
"""

from __future__ import annotations

import json
import re
from typing import Any

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
CALL_PATTERN = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)


def format_call(name: str, arguments: dict[str, Any] | None = None) -> str:
    """The canonical text of a call (what reference demonstrations contain)."""
    return CALL_OPEN + json.dumps({"name": name, "arguments": arguments or {}}) + CALL_CLOSE


def find_tool_calls(text: str) -> list[str]:
    """The raw bodies of every closed ``<tool_call>...</tool_call>`` block in ``text``."""
    return [m.group(1) for m in CALL_PATTERN.finditer(text)]
