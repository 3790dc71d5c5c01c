r"""Math equivalence both ways on an outside set: Math-Verify's own test tables.

    python benchmarks/math_agreement.py [--source DIR] [--json PATH] [--misses]

The set is the ``(gold, pred, expected)`` rows of the parametrized tests in Math-Verify's
``tests/`` (its source distribution on PyPI, of the version installed here; ``--source`` names an
unpacked copy or a checkout instead). It is read at run time, never copied into this repository.
Rows a test runs with settings other than math-verify's defaults (another float precision,
``strict=False``, set/relation comparison allowed) are left out and counted, since their label is
about that setting.

Each row is one verdict of rlvr's ``math`` verifier, the way a task file would put it:
  * the gold is the task's ``answer``: the gold string without its ``$``/``\(``/``\[``
    delimiters and with ``\boxed{X}`` written as ``X`` (a task author writes the bare answer);
  * the pred is the completion, read by rlvr's own locator: ``answer_at: final`` when it has a
    ``\boxed`` or an ``Answer:`` line, else ``answer_at: whole`` (the pred is the answer alone).

Reported: agreement (rlvr's verdict equals the table's ``expected``), false positives (rlvr
passes a row the table marks 0: the number that must be 0), misses (rlvr refuses a row marked
1), and each miss's reason, so refusals by design (prose, several answers) are told apart from
notation. ``rlvr audit rewards`` is the other direction's check: it pays no hack.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlvr.atomic import write_text_atomic  # noqa: E402
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse  # noqa: E402

from rlvr.types import Spec, Task  # noqa: E402
from rlvr.verifiers.answer import locate_answer, unwrap_boxed  # noqa: E402
from rlvr.verifiers.math import MathVerifier, is_final_form, is_prose  # noqa: E402

CACHE = Path(__file__).resolve().parents[1] / ".cache" / "math-verify-sdist"
_ANSWER_LINE = re.compile(r"(?m)^[ \t]*Answer:")
DEFAULTS = {"precision": 6, "strict": True, "allow_set_relation_comp": False}


@dataclass
class Row:
    source: str  # file::test[index]
    gold: str
    pred: str
    expected: int


def fetch_sdist(dest: Path = CACHE) -> Path:
    """The unpacked source distribution of the installed math-verify (downloaded once)."""
    ver = version("math-verify")
    root = dest / f"math_verify-{ver}"
    if not (root / "tests").is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", f"math-verify=={ver}", "--no-binary", ":all:",
                            "--no-deps", "--quiet", "-d", tmp], check=True)
            (archive,) = Path(tmp).glob("math_verify-*.tar.gz")
            with tarfile.open(archive) as tar:
                tar.extractall(dest, filter="data")
    return root


def _call_settings(fn: ast.FunctionDef) -> dict[str, ast.expr] | None:
    """The keyword arguments of the test's ``compare_strings``/``verify`` call, or None if none."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("compare_strings", "verify"):
            return {kw.arg: kw.value for kw in node.keywords if kw.arg}
    return None


def _parametrize(fn: ast.FunctionDef) -> tuple[list[str], list[ast.expr]] | None:
    for dec in fn.decorator_list:
        if isinstance(dec, ast.Call) and getattr(dec.func, "attr", None) == "parametrize" and len(dec.args) >= 2:
            names = ast.literal_eval(dec.args[0])
            names = [n.strip() for n in (names.split(",") if isinstance(names, str) else names)]
            if isinstance(dec.args[1], (ast.List, ast.Tuple)):
                return names, list(dec.args[1].elts)
    return None


def table_rows(tests_dir: Path) -> tuple[list[Row], int]:
    """Rows with default settings, and how many rows were left out for other settings."""
    rows, left_out = [], 0
    for path in sorted(tests_dir.glob("test_*.py")):
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(fn, ast.FunctionDef):
                continue
            params, settings = _parametrize(fn), _call_settings(fn)
            if params is None or settings is None:
                continue
            names, elts = params
            label = "expected" if "expected" in names else "result" if "result" in names else None
            if label is None or "gold" not in names or "pred" not in names:
                continue
            for i, elt in enumerate(elts):
                try:
                    values = dict(zip(names, ast.literal_eval(elt)))
                except ValueError:
                    left_out += 1
                    continue
                chosen = {}
                for key, default in DEFAULTS.items():
                    node = settings.get(key)
                    chosen[key] = (default if node is None else values[node.id] if isinstance(node, ast.Name)
                                   else ast.literal_eval(node))
                if chosen != DEFAULTS or not isinstance(values["gold"], str) or not isinstance(values["pred"], str):
                    left_out += 1
                    continue
                rows.append(Row(f"{path.name}::{fn.name}[{i}]", values["gold"], values["pred"],
                                int(values[label])))
    return rows, left_out


def gold_answer(gold: str) -> str:
    """The task file's ``answer`` for a table gold: the answer math-verify itself extracts from it
    (its second parse result), so the gold means what the table's label is about."""
    parsed = parse(gold, [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()])
    return parsed[1] if len(parsed) > 1 else ""


def located(pred: str) -> tuple[str | None, str, str]:
    """rlvr's reading of a pred: ``(answer or None, status, answer_at)``. ``final`` when the pred
    has a box or an ``Answer:`` line, else ``whole`` (the pred is the answer alone)."""
    where = "final" if "\\boxed" in pred or _ANSWER_LINE.search(pred) else "whole"
    answer, status = locate_answer(pred, where)
    if answer is not None and unwrap_boxed(answer) is None:
        return None, "box inside text", where
    return (unwrap_boxed(answer) if answer is not None else None), status, where


def judge(row: Row) -> dict:
    """rlvr's verdict on a row, and its class: ``final`` (one answer, neither side prose) or why not."""
    gold = gold_answer(row.gold)
    answer, status, where = located(row.pred)
    if not gold:
        kind = "gold has no answer"
    elif answer is None:
        kind = f"pred: {status.replace('_', ' ')}"
    elif is_prose(answer):
        kind = "pred: prose"
    else:
        kind = "final"
    task = Task(id=row.source, domain="outside", level=1, prompt=(),
                spec=Spec("math", {"answer": gold or "?", "answer_at": where}))
    v = MathVerifier().check(task, row.pred)
    why = "ok" if v.passed else "not in final form" if answer and not is_final_form(answer, gold) else v.reason
    return {"source": row.source, "gold": gold, "answer": answer, "pred": row.pred[:300], "expected": row.expected,
            "passed": v.passed, "kind": kind, "why": why}


def summary(judged: list[dict]) -> dict:
    n = len(judged)
    agree = sum(j["passed"] == bool(j["expected"]) for j in judged)
    return {"rows": n, "equivalent": sum(j["expected"] for j in judged), "agree": agree,
            "agreement": round(agree / n, 4) if n else None,
            "false_positives": sum(j["passed"] and not j["expected"] for j in judged),
            "misses": sum(j["expected"] and not j["passed"] for j in judged)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", type=Path, help="an unpacked Math-Verify source tree (default: its sdist, fetched)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--misses", action="store_true", help="print every disagreement")
    args = ap.parse_args(argv)
    root = args.source or fetch_sdist()
    rows, left_out = table_rows(root / "tests")
    judged = [judge(row) for row in rows]
    final = [j for j in judged if j["kind"] == "final"]
    kinds = sorted({j["kind"] for j in judged})
    result = {"source": f"math-verify {version('math-verify')} tests/ (sdist from PyPI, read at run time)",
              "left_out_for_settings": left_out, "all": summary(judged), "final_answer_pairs": summary(final),
              "by_kind": {k: summary([j for j in judged if j["kind"] == k]) for k in kinds},
              "disagreements": [j for j in judged if j["passed"] != bool(j["expected"])]}
    for name in ("final_answer_pairs", "all"):
        s = result[name]
        print(f"{name:18} {s['rows']:4} rows ({s['equivalent']} equivalent): agreement {s['agree']}/{s['rows']} = "
              f"{s['agreement']:.1%}, false positives {s['false_positives']}, misses {s['misses']}")
    for k in kinds:
        s = result["by_kind"][k]
        print(f"  {k:28} {s['rows']:4} rows, agreement {s['agreement']:.1%}, false positives {s['false_positives']}")
    print(f"left out (settings other than math-verify's defaults): {left_out} rows")
    if args.misses:
        for j in result["disagreements"]:
            label = "FALSE POSITIVE" if j["passed"] else "MISS"
            print(f"{label} [{j['kind']}] {j['source']}: gold={j['gold']!r} answer={j['answer']!r} ({j['why']})")
    if args.json:
        write_text_atomic(args.json, json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
