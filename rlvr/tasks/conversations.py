"""The user's conversations for SFT: rows with a ``messages`` list, loss on assistant turns.

Each row of a JSONL, Parquet or datasets file (``rlvr.tasks.readers``) holds a list of chat
messages (``{"role", "content"}``; roles system, user, assistant, tool) under ``messages`` (or
the column ``column`` names). A conversation needs a user message before its first assistant
turn and must end with an assistant turn (the tokens after it would be trained on nothing).
A bad row is a ``UserError`` naming file, line and field.
"""

from __future__ import annotations

from pathlib import Path

from rlvr.errors import UserError
from rlvr.tasks.readers import read_rows
from rlvr.tasks.rows import ROLES
from rlvr.types import Message


def check_conversation(messages: object, field: str = "messages") -> tuple[Message, ...]:
    """The messages as a tuple, or ``ValueError`` naming the field and what is wrong."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"field {field!r} is not a non-empty list of messages")
    out = []
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
            raise ValueError(f"field '{field}[{i}]' is not a message with a role ({', '.join(ROLES)}) "
                             "and string content")
        out.append({"role": m["role"], "content": m["content"]})
    roles = [m["role"] for m in out]
    if "assistant" not in roles:
        raise ValueError(f"field {field!r} has no assistant message to train on")
    if "user" not in roles[: roles.index("assistant")]:
        raise ValueError(f"field {field!r} has no user message before the first assistant message")
    if roles[-1] != "assistant":
        raise ValueError(f"field {field!r} does not end with an assistant message")
    return tuple(out)


def load_conversations(path: str | Path, fmt: str = "auto", column: str = "messages") -> list[tuple[Message, ...]]:
    """Every conversation of the file (``UserError`` at the first bad row, or for an empty file)."""
    out = []
    for row in read_rows(path, fmt):
        if row.error:
            raise UserError(f"{row.where}: {row.error}")
        value = row.data.get(column)
        if value is None:
            raise UserError(f"{row.where}: field {column!r} is missing (the row has: "
                            f"{', '.join(sorted(row.data)) or 'nothing'})")
        try:
            out.append(check_conversation(value, column))
        except ValueError as e:
            raise UserError(f"{row.where}: {e}") from None
    if not out:
        raise UserError(f"{path}: no conversations")
    return out
