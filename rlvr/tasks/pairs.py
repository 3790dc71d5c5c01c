"""Preference pairs for DPO: a prompt, the response preferred (``chosen``) and the other (``rejected``).

``load_pairs(cfg)`` reads a ``PairFileConfig`` (path, column mapping, system prompt) from any file
``rlvr.tasks.readers`` reads (JSONL, CSV, Parquet, a datasets directory). A row is one of:

- **text**: ``prompt``, ``chosen`` and ``rejected`` are strings (the prompt is one user message);
- **messages**: ``prompt`` is a list of chat messages ending with a user message; ``chosen`` and
  ``rejected`` are each the response text, one assistant message ``{role, content}``, or a list
  holding just that message;
- **conversations** (TRL's conversational form): ``chosen`` and ``rejected`` are whole
  conversations, the same prompt messages followed by one assistant message. Without a ``prompt``
  column the prompt is their shared prefix; with one, both must start with exactly it.

The forms mix per field: each response is either the response alone or prompt + response. A
conversation that ends with two assistant messages is refused (a response is one assistant turn;
which of the two is being preferred would be a guess), as is a prompt that does not end with a
user message. Columns other than the mapped fields are kept in ``meta`` (e.g. ``chosen_verdict``,
``model``), with ``where`` (``FILE:LINE`` or ``FILE:row N``); a ``meta`` column holding an object
is merged into it. Ids come from the ``id`` column, else ``<file stem>:<row number>``.

Problems are found as for task files (``rlvr.tasks.files``): every row is parsed, and
``load_pairs`` raises one ``UserError`` for the first problem in file order
(``pairs.jsonl:3: field 'rejected' is missing``) with a count of the others; ``parse_pairs``
returns them all. ``write_pairs`` writes JSONL (atomically) that ``load_pairs`` reads back to the
same pairs, and refuses pairs it would not read back.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.atomic import write_text_atomic
from rlvr.config import check_choice, from_dict
from rlvr.errors import ConfigError, UserError
from rlvr.tasks.conversations import check_conversation
from rlvr.tasks.files import Problem, location_order
from rlvr.tasks.readers import FORMATS, Row, Url, is_url, read_rows
from rlvr.tasks.rows import ROLES, RowError, parse_map
from rlvr.types import Message

PAIR_FIELDS = ("prompt", "chosen", "rejected", "id", "system")
RESERVED = (*PAIR_FIELDS, "meta")  # columns a written pair's meta may not use


@dataclass(frozen=True)
class PreferencePair:
    """One preference: ``prompt`` (chat messages ending with a user message), the assistant
    responses ``chosen`` (preferred) and ``rejected``, a stable ``id``, and ``meta`` (``where``
    it was read, and any other recorded fields: verdicts, model, task id)."""

    prompt: tuple[Message, ...]
    chosen: str
    rejected: str
    id: str
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "prompt": [dict(m) for m in self.prompt]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PreferencePair:
        """The inverse of ``to_dict``."""
        return cls(prompt=tuple(dict(m) for m in d["prompt"]), chosen=d["chosen"], rejected=d["rejected"],
                   id=str(d["id"]), meta=dict(d.get("meta", {})))


@dataclass
class PairFileConfig:
    """One preference-pair file and how to read it (a plain string is its path)."""

    path: str = ""
    """JSONL, CSV or Parquet file, or a Hugging Face datasets directory."""
    format: str = "auto"
    """auto | jsonl | csv | parquet | hf (auto: by suffix; a directory is hf)."""
    hf_split: str = ""
    """Split of a DatasetDict directory to read (needed when it has several)."""
    map: dict[str, str] = field(default_factory=dict)
    """Pair field (prompt, chosen, rejected, id, system) -> column, e.g. {chosen: good, rejected: bad};
    unmapped fields use the column of the same name. Text ``prompt=q,chosen=a`` is parsed too."""
    system_prompt: str = ""
    """System message put before prompts that have none (a row's ``system`` column wins)."""

    def __post_init__(self) -> None:
        check_choice("pairs.format", self.format, FORMATS)
        if isinstance(self.map, str):
            self.map = parse_map(self.map)
        for name, column in self.map.items():
            if name not in PAIR_FIELDS:
                raise ConfigError(f"config key 'map.{name}' is not a pair field; map one of: {', '.join(PAIR_FIELDS)}")
            if not isinstance(column, str) or not column:
                raise ConfigError(f"config key 'map.{name}' must name a column, got {column!r}")
        if self.map.get("chosen", "chosen") == self.map.get("rejected", "rejected"):
            raise ConfigError(f"config key 'map': chosen and rejected name the same column {self.map['chosen']!r}")


def as_pair_file_config(entry: PairFileConfig | str | dict[str, Any]) -> PairFileConfig:
    """A ``PairFileConfig`` from itself, a path, or a mapping of its keys (unknown keys refused)."""
    if isinstance(entry, PairFileConfig):
        return entry
    if isinstance(entry, dict):
        if isinstance(entry.get("map"), str):
            entry = {**entry, "map": parse_map(entry["map"])}
        return from_dict(PairFileConfig, entry, prefix="pairs")
    return PairFileConfig(path=str(entry))


# ---------------------------------------------------------------- one row


def _row_error(label: str, text: str) -> RowError:
    """A ``RowError`` of field ``label`` whose message is ``text`` as written (it names the field)."""
    out = RowError("", text)
    out.field = label
    return out


def _quoted(label: str) -> str:
    return label if label.startswith("'") else f"'{label}'"


def _prompt(value: Any, label: str, column: str) -> tuple[Message, ...]:
    """The prompt's messages: text is one user message; a list must end with a non-empty user message."""
    if isinstance(value, str):
        if not value.strip():
            raise RowError(label, "is empty")
        return ({"role": "user", "content": value},)
    if not isinstance(value, (list, tuple)) or not value:
        raise RowError(label, "is empty" if isinstance(value, (list, tuple)) else "is not text or a list of messages")
    last = value[-1]
    if isinstance(last, dict) and last.get("role") in ROLES and last["role"] != "user":
        raise RowError(label, "does not end with a user message")
    try:  # prompt + a response is a conversation: check_conversation checks the roles and contents
        messages = check_conversation([*value, {"role": "assistant", "content": ""}], column)[:-1]
    except ValueError as e:
        raise _row_error(label, str(e)) from None
    if not messages[-1]["content"].strip():
        raise RowError(label, "ends with an empty user message")
    return messages


def _response(value: Any, label: str, column: str) -> tuple[tuple[Message, ...] | None, str]:
    """``(messages before the response, or None when the value is the response alone, response text)``."""
    prefix = None
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if isinstance(value, str):
        text = value
    elif isinstance(value, dict):
        if value.get("role") not in ROLES:
            raise RowError(label, f"is a message with role {value.get('role')!r}; roles are: {', '.join(ROLES)}")
        if not isinstance(value.get("content"), str):
            raise RowError(label, "is a message whose content is not a string")
        if value["role"] != "assistant":
            raise RowError(label, f"is a {value['role']!r} message; a response is an assistant message")
        text = value["content"]
    elif isinstance(value, (list, tuple)) and value:
        try:
            messages = check_conversation(value, column)
        except ValueError as e:
            raise _row_error(label, str(e)) from None
        prefix, text = messages[:-1], messages[-1]["content"]
        if prefix[-1]["role"] == "assistant":
            n = len(messages) - max(i for i, m in enumerate(messages) if m["role"] != "assistant") - 1
            raise RowError(label, f"ends with {n} assistant messages; a response is one assistant message")
        if prefix[-1]["role"] != "user":
            raise RowError(label, f"has a {prefix[-1]['role']!r} message before its response; "
                                  "the prompt must end with a user message")
    elif isinstance(value, (list, tuple)):
        raise RowError(label, "is empty")
    else:
        raise RowError(label, "is not text, an assistant message or a list of messages")
    if not text.strip():
        raise RowError(label, "is empty")
    return prefix, text


def _check_starts_with(label: str, prefix: tuple[Message, ...], prompt: tuple[Message, ...]) -> None:
    named = f"field {_quoted(label)}: its conversation"
    for i, m in enumerate(prompt):
        if i >= len(prefix) or prefix[i] != m:
            raise _row_error(label, f"{named} does not start with the prompt (message {i + 1} differs)")
    if len(prefix) > len(prompt):
        raise _row_error(label, f"{named} has {len(prefix) - len(prompt)} message(s) between the prompt "
                                "and the response")


def pair_from_row(row: Row, cfg: PairFileConfig, stem: str, index: int) -> PreferencePair:
    """The pair of one row (see the module docstring); ``RowError`` naming the field."""
    data = row.data

    def column(name: str) -> str:
        return cfg.map.get(name, name)

    def label(name: str) -> str:
        return name if column(name) == name else f"'{column(name)}' (mapped to '{name}')"

    def missing(name: str, hint: str = "") -> RowError:
        return RowError(label(name), f"is missing (the row has: {', '.join(sorted(data)) or 'nothing'}){hint}")

    for name in PAIR_FIELDS:  # a mapped column must be there (but a row may lack a system message)
        required = name in ("chosen", "rejected") or (name in cfg.map and name != "system")
        if required and column(name) not in data:
            raise missing(name)
    prompt = None
    if column("prompt") in data:
        prompt = _prompt(data[column("prompt")], label("prompt"), column("prompt"))
    responses = {name: _response(data[column(name)], label(name), column(name)) for name in ("chosen", "rejected")}
    if prompt is None:
        name = next((n for n, (prefix, _) in responses.items() if prefix is not None), None)
        if name is None:
            raise missing("prompt", "; name its column with --map prompt=COLUMN, or give chosen and rejected as "
                                    "whole conversations")
        prompt = _prompt(responses[name][0], label(name), column(name))
    for name, (prefix, _) in responses.items():
        if prefix is not None:
            _check_starts_with(label(name), prefix, prompt)
    chosen, rejected = responses["chosen"][1], responses["rejected"][1]
    if chosen.strip() == rejected.strip():
        raise RowError(label("chosen"), f"and {_quoted(label('rejected'))} are the same response")
    raw_id = data.get(column("id"))
    if raw_id is not None and (type(raw_id) not in (str, int) or not str(raw_id).strip()):  # not bool, not 2.5
        raise RowError(label("id"), "is not a non-empty string or integer")
    system = data.get(column("system"), cfg.system_prompt)
    if not isinstance(system, str):
        raise RowError(label("system"), "is not a string")
    if system and not any(m["role"] == "system" for m in prompt):
        prompt = ({"role": "system", "content": system}, *prompt)
    used = {column(name) for name in PAIR_FIELDS}
    meta = dict(data["meta"]) if isinstance(data.get("meta"), dict) and "meta" not in used else {}
    meta.update({k: v for k, v in data.items() if k not in used and not (k == "meta" and isinstance(v, dict))})
    meta["where"] = row.where
    return PreferencePair(prompt=prompt, chosen=chosen, rejected=rejected,
                          id=str(raw_id) if raw_id is not None else f"{stem}:{index}", meta=meta)


# ---------------------------------------------------------------- files


def parse_pairs(cfg: PairFileConfig | str | dict[str, Any]) -> tuple[list[PreferencePair], list[Problem]]:
    """Every pair that parses and a ``Problem`` for everything wrong (rows that do not parse,
    repeated ids; a file that cannot be read at all is one problem), in file order."""
    cfg = as_pair_file_config(cfg)
    path = Url(cfg.path) if is_url(cfg.path) else Path(cfg.path)
    try:
        rows = list(read_rows(path, cfg.format, cfg.hf_split))
    except UserError as e:  # unreadable, not UTF-8, not CSV/Parquet/datasets: the whole file
        where, _, message = str(e).partition(": ")
        return [], [Problem(where, "", message)]
    pairs: list[PreferencePair] = []
    problems: list[Problem] = []
    for index, row in enumerate((r for r in rows if not r.error), start=1):
        try:
            pairs.append(pair_from_row(row, cfg, path.stem, index))
        except RowError as e:
            problems.append(Problem(row.where, e.field, str(e)))
    problems += [Problem(r.where, "", r.error) for r in rows if r.error]
    first: dict[str, str] = {}
    id_label = "id" if cfg.map.get("id", "id") == "id" else f"'{cfg.map['id']}' (mapped to 'id')"
    for pair in pairs:
        where = pair.meta["where"]
        if pair.id in first:
            line = first[pair.id].rsplit(":", 1)[-1]
            problems.append(Problem(where, "id", str(RowError(id_label, f"repeats pair {pair.id!r} "
                                                                        f"({'line ' * line.isdigit()}{line})"))))
        first.setdefault(pair.id, where)
    return pairs, sorted(problems, key=lambda p: location_order(p.where))


def load_pairs(cfg: PairFileConfig | str | dict[str, Any]) -> list[PreferencePair]:
    """The pairs of a file; ``UserError`` naming file, line and field of the first problem (with a
    count of the others), or naming the file when it holds no pairs."""
    cfg = as_pair_file_config(cfg)
    pairs, problems = parse_pairs(cfg)
    if problems:
        more = f" ({len(problems) - 1} more problem(s) in this file)" if len(problems) > 1 else ""
        raise UserError(f"{problems[0]}{more}")
    if not pairs:
        raise UserError(f"{cfg.path}: no preference pairs")
    return pairs


def pair_row(pair: PreferencePair) -> dict[str, Any]:
    """The JSONL row ``write_pairs`` writes: ``id``, ``prompt`` (messages), ``chosen``,
    ``rejected``, then ``meta``'s fields as columns (less ``where``, a place in another file)."""
    clash = [k for k in pair.meta if k in RESERVED]
    if clash:
        raise ValueError(f"meta key {clash[0]!r} would be read back as a pair field, not as meta")
    return {"id": pair.id, "prompt": [dict(m) for m in pair.prompt], "chosen": pair.chosen,
            "rejected": pair.rejected, **{k: v for k, v in pair.meta.items() if k != "where"}}


def pair_problem(pair: PreferencePair) -> str | None:
    """Why ``load_pairs`` would refuse, or read back differently, this pair once written; None if
    it would not (callers drop such pairs before ``write_pairs``: empty or equal responses...)."""
    try:
        row = json.loads(json.dumps(pair_row(pair), ensure_ascii=False))
        back = pair_from_row(Row("", row), PairFileConfig(), "", 0)
    except (TypeError, ValueError, RowError) as e:
        return str(e)
    if _without_where(back) != _without_where(pair):
        return "it reads back differently (prompt messages must be plain {role, content}, meta JSON values)"
    return None


def _without_where(pair: PreferencePair) -> dict[str, Any]:
    """The pair as JSON values (tuples are lists), less ``meta.where``."""
    out = pair.to_dict()
    out["meta"].pop("where", None)
    return json.loads(json.dumps(out))


def write_pairs(path: str | Path, pairs: list[PreferencePair]) -> Path:
    """Write ``pairs`` as JSONL (``pair_row`` per line) atomically: a temporary file in the same
    directory, renamed over ``path`` when complete. ``load_pairs(path)`` gives the same pairs
    (``meta.where`` aside). ``ValueError`` before anything is written for a pair it would not
    read back (``pair_problem``) or a repeated id."""
    path = Path(path)
    seen: set[str] = set()
    for i, pair in enumerate(pairs, start=1):
        problem = pair_problem(pair)
        if problem is None and pair.id in seen:
            problem = "its id is used by an earlier pair"
        if problem is not None:
            raise ValueError(f"{path}: pair {i} (id {pair.id!r}): {problem}")
        seen.add(pair.id)
    return write_text_atomic(path, "".join(json.dumps(pair_row(pair), ensure_ascii=False) + "\n" for pair in pairs))
