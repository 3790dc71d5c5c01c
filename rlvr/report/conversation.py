"""One trajectory sample as HTML a person can read: the conversation by role, tool calls with
their arguments and results, code blocks, file changes as diffs, the verdict and each reward term.

Model text is untrusted: everything from the sample goes through ``html.escape`` and is shown
as text, never as markup. For ``code.repair`` episodes the workspace is rebuilt from the
episode's own tool calls: a ``read_file`` result is a file's text, and a ``write_file`` or
``replace`` is shown as a unified diff against it (a file the episode never read shows the
replaced snippet, or the whole written text, as the diff).
"""

from __future__ import annotations

import difflib
import json
import re
from html import escape

from rlvr.tool_calls import CALL_PATTERN

FENCE = re.compile(r"```([\w.+-]*)\n?(.*?)(?:```|$)", re.DOTALL)
LONG_MESSAGE = 700  # a system/user message longer than this is folded
MAX_TEXT = 20_000  # a longer text is cut here, saying so: the page stays a size a browser opens


def cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f"\n[... {len(text) - MAX_TEXT} more characters not shown]"


def render_trajectory(t: dict) -> str:
    verdict = t["verdict"]
    passed = verdict.get("passed")
    badge = ('<span class="badge pass">passed</span>' if passed else
             '<span class="badge fail">failed</span>' if passed is not None else "")
    meta = [f'<code>{escape(t["task_id"])}</code>', escape(str(t["domain"])),
            f"level {escape(str(t['level']))}" if t["level"] is not None else "",
            f'reward <b>{_num(t.get("reward"))}</b>', f'finish {escape(str(t.get("finish_reason", "?")))}']
    info = t.get("info") if isinstance(t.get("info"), dict) else {}
    if info:
        meta.append(escape(", ".join(f"{k} {v}" for k, v in info.items())))
    flags = "".join(f'<li class="sev-{escape(str(f.get("severity", "")))}"><b>{escape(str(f.get("detector", "")))}</b> '
                    f'({escape(str(f.get("severity", "")))}): {escape(str(f.get("note", "")))}</li>' for f in t["flags"])
    return (f'<article class="traj" id="traj-{escape(t["id"])}">'
            f'<header><a class="anchor" href="#traj-{escape(t["id"])}">#{escape(t["id"])}</a> {badge} '
            f'{" · ".join(m for m in meta if m)}</header>'
            + (f'<ul class="flags">{flags}</ul>' if flags else "")
            + f'<div class="conv">{render_conversation(conversation(t))}</div>'
            + f'<div class="scores">{render_verdict(verdict)}{render_terms(t)}</div></article>')


def conversation(t: dict) -> list[dict]:
    """The messages to show: the whole episode when kept, else the prompt and the completion."""
    if t["messages"]:
        return [m for m in t["messages"] if isinstance(m, dict)]
    return [m for m in t["prompt"] if isinstance(m, dict)] + [{"role": "assistant", "content": t["completion"]}]


def render_conversation(messages: list[dict]) -> str:
    diffs, net = file_changes(messages)
    out = []
    for i, m in enumerate(messages):
        role = str(m.get("role", "?"))
        content = cut(str(m.get("content", "")))
        if role == "assistant":
            body = _assistant(content, diffs.get(i))
        elif role == "tool":
            error = content.startswith("error")
            body = f'<pre class="result{" error" if error else ""}">{escape(content)}</pre>'
            role = f"tool result: {m.get('name', '?')}"
        else:
            body = render_text(content)
            if len(content) > LONG_MESSAGE:
                body = f"<details><summary>{escape(content[:120])}…</summary>{body}</details>"
        kind = role.split(":")[0].replace(" ", "-")
        out.append(f'<div class="msg {escape(kind)}"><div class="role">{escape(role)}</div>{body}</div>')
    if net:
        out.append('<div class="msg files"><div class="role">files changed over the episode</div>'
                   + "".join(render_diff(path, before, after, "") for path, (before, after) in net.items()) + "</div>")
    return "".join(out)


def render_text(text: str) -> str:
    """Prose as wrapped text, fenced code blocks as ``<pre>``."""
    out, at = [], 0
    for m in FENCE.finditer(text):
        if text[at:m.start()].strip():
            out.append(f'<div class="text">{escape(text[at:m.start()].strip())}</div>')
        lang = f'<span class="lang">{escape(m.group(1))}</span>' if m.group(1) else ""
        out.append(f'<pre class="code">{lang}{escape(m.group(2))}</pre>')
        at = m.end()
    if text[at:].strip() or not out:
        out.append(f'<div class="text">{escape(text[at:].strip()) or "<i>(empty)</i>"}</div>')
    return "".join(out)


def _assistant(content: str, diff: str | None) -> str:
    out, at = [], 0
    for m in CALL_PATTERN.finditer(content):
        if content[at:m.start()].strip():
            out.append(render_text(content[at:m.start()]))
        out.append(_call(m.group(1), diff))
        at = m.end()
    if content[at:].strip() or not out:
        out.append(render_text(content[at:]))
    return "".join(out)


def _call(body: str, diff: str | None) -> str:
    call = parse_call(body)
    if call is None:
        return f'<div class="call bad"><div class="fn">unparsable tool call</div><pre>{escape(body)}</pre></div>'
    name, args = call
    rows = []
    for key, value in args.items():
        text = cut(value if isinstance(value, str) else json.dumps(value))
        cell = f"<pre>{escape(text)}</pre>" if "\n" in text or len(text) > 80 else f"<code>{escape(text)}</code>"
        rows.append(f"<tr><th>{escape(str(key))}</th><td>{cell}</td></tr>")
    args_html = f"<table class='args'>{''.join(rows)}</table>" if rows else ""
    return f'<div class="call"><div class="fn">call <b>{escape(name)}</b></div>{args_html}{diff or ""}</div>'


def parse_call(body: str) -> tuple[str, dict] | None:
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    return obj["name"], args if isinstance(args, dict) else {"arguments": args}


def file_changes(messages: list[dict]) -> tuple[dict[int, str], dict[str, tuple[str, str]]]:
    """``{message index: diff HTML}`` for the ``write_file`` / ``replace`` calls of an episode,
    against the workspace as its ``read_file`` results and earlier successful changes show it;
    and ``{path: (first read text, final text)}`` of the files those calls changed."""
    files: dict[str, str] = {}
    first: dict[str, str] = {}
    out: dict[int, str] = {}
    for i, m in enumerate(messages):
        bodies = CALL_PATTERN.findall(str(m.get("content", ""))) if m.get("role") == "assistant" else []
        call = parse_call(bodies[0]) if len(bodies) == 1 else None
        if call is None:
            continue
        name, args = call
        reply = messages[i + 1] if i + 1 < len(messages) and messages[i + 1].get("role") == "tool" else {}
        result = str(reply.get("content", ""))
        ok = bool(reply) and not result.startswith("error")
        path = args.get("path")
        if not isinstance(path, str):
            continue
        if name == "read_file" and ok and "[... cut:" not in result:
            files[path] = result
            first.setdefault(path, result)
        elif name == "write_file" and isinstance(args.get("content"), str):
            before = files.get(path)
            note = "" if before is not None else "not read earlier in the episode: the whole written text"
            out[i] = render_diff(path, before or "", args["content"], note)
            if ok:
                files[path] = args["content"]
        elif name == "replace" and isinstance(args.get("old"), str) and isinstance(args.get("new"), str):
            before = files.get(path)
            if before is not None and before.count(args["old"]) == 1:
                after = before.replace(args["old"], args["new"], 1)
                out[i] = render_diff(path, before, after, "")
                if ok:
                    files[path] = after
            else:
                out[i] = render_diff(path, args["old"], args["new"], "the file's text is unknown here: the replaced snippet")
    net = {p: (first[p], files[p]) for p in first if files[p] != first[p]}
    return out, net


def render_diff(path: str, before: str, after: str, note: str) -> str:
    lines = difflib.unified_diff(before.splitlines(), after.splitlines(), f"a/{path}", f"b/{path}", lineterm="", n=2)
    rows = []
    for line in lines:
        kind = ("hunk" if line.startswith("@@") else "file" if line.startswith(("---", "+++"))
                else "add" if line.startswith("+") else "del" if line.startswith("-") else "ctx")
        rows.append(f'<span class="{kind}">{escape(line)}</span>')
    note_html = f'<div class="note">{escape(note)}</div>' if note else ""
    return f'<div class="diff">{note_html}<pre>{"".join(rows) or "(no change)"}</pre></div>'


def render_verdict(verdict: dict) -> str:
    if not verdict:
        return '<div class="verdict"><i>no verdict recorded</i></div>'
    head = (f"<b>{'passed' if verdict.get('passed') else 'failed'}</b> · score {_num(verdict.get('score'))} · "
            f"reason <code>{escape(str(verdict.get('reason', '')))}</code>")
    details = verdict.get("details") if isinstance(verdict.get("details"), dict) else {}
    rows = []
    for key, value in details.items():
        text = cut(value if isinstance(value, str) else json.dumps(value))
        cell = f"<pre>{escape(text)}</pre>" if "\n" in text or len(text) > 100 else escape(text)
        rows.append(f"<tr><th>{escape(str(key))}</th><td>{cell}</td></tr>")
    table = f"<table class='kv'>{''.join(rows)}</table>" if rows else ""
    return f'<div class="verdict"><div class="h">verdict</div>{head}{table}</div>'


def render_terms(t: dict) -> str:
    rows = "".join(f"<tr><th>{escape(str(k))}</th><td>{_num(v)}</td></tr>" for k, v in t["terms"].items())
    return (f'<div class="terms"><div class="h">reward terms</div><table class="kv">{rows}'
            f'<tr class="total"><th>reward</th><td>{_num(t.get("reward"))}</td></tr></table></div>')


def _num(v) -> str:
    return f"{v:.4g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else escape(str(v))
