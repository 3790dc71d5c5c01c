"""The ``json`` verifier: the answer is one JSON value that satisfies a JSON Schema.

Payload ``{"schema": {...}, "answer": {...}, "example": ..., "answer_at": "whole"}``. The text at
``answer_at`` (default ``whole``: the whole completion) is read as JSON; one fenced block
(```` ```json ... ``` ````) around it is allowed. It must be exactly one JSON value (``json.loads``
refuses trailing text, so two objects fail; ``NaN``/``Infinity`` are not JSON and fail; an object
that names a key twice fails too, since ``json.loads`` would keep the last value and a hedge such as
``{"age": 35, "age": 36}`` would pass as 36), valid
against ``schema`` (jsonschema, the schema's own draft, default 2020-12), and, when ``answer`` is
given (an object), equal to it on each of its keys: the key present, the value equal with the same
JSON types at every depth (``36.0`` is not ``36``, ``true`` is not ``1``). ``example`` (optional) is
a value that must pass; ``rlvr tasks validate`` checks it, or ``answer`` itself when that alone
satisfies the schema (``gold_completion`` is None otherwise). Reasons: ``ok``, ``no_answer``, ``invalid_json``,
``schema_violation``, ``mismatch`` (a field value), ``too_long``.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from rlvr.types import Task, Verdict
from rlvr.verifiers.answer import check_keys, format_instruction, locate_answer, place_answer
from rlvr.verifiers.base import VERIFIERS, example_task

MAX_CHARS = 100_000
_FENCED = re.compile(r"```(?:json)?[ \t]*\n(.*?)\n[ \t]*```", re.DOTALL)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) < len(keys):
        raise ValueError(f"duplicate key {next(k for k in keys if keys.count(k) > 1)!r}")
    return dict(pairs)


def read_json(text: str) -> tuple[Any, str | None]:
    """``(value, None)`` or ``(None, why)``."""
    s = text.strip()
    m = _FENCED.fullmatch(s)
    if m:
        s = m.group(1)
    try:
        return json.loads(s, parse_constant=_reject_constant, object_pairs_hook=_unique_keys), None
    except (ValueError, RecursionError) as e:
        return None, str(e)[:200]


def same_value(a: Any, b: Any) -> bool:
    """JSON equality that also compares types at every depth (Python's ``1 == 1.0 == True``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return a == b


@functools.lru_cache(maxsize=256)
def _validator(schema_text: str):
    import jsonschema

    schema = json.loads(schema_text)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


class JsonVerifier:
    """Spec kind ``json`` (see the module docstring)."""

    name = "json"

    def check(self, task: Task, completion: str) -> Verdict:
        p = task.spec.payload
        extracted, status = locate_answer(completion, p.get("answer_at", "whole"))
        details: dict[str, Any] = {"extracted": extracted, "format_ok": extracted is not None}
        if extracted is None:
            return Verdict(False, 0.0, status, details)
        if len(extracted) > MAX_CHARS:
            return Verdict(False, 0.0, "too_long", {**details, "extracted": extracted[:200]})
        value, error = read_json(extracted)
        if error is not None:
            return Verdict(False, 0.0, "invalid_json", {**details, "format_ok": False, "error": error})
        violation = next(iter(_validator(json.dumps(p["schema"], sort_keys=True)).iter_errors(value)), None)
        if violation is not None:
            where = "/".join(str(x) for x in violation.absolute_path) or "(root)"
            return Verdict(False, 0.0, "schema_violation", {**details, "error": f"{where}: {violation.message[:200]}"})
        wrong = [k for k, v in (p.get("answer") or {}).items()
                 if not isinstance(value, dict) or k not in value or not same_value(value[k], v)]
        if wrong:
            return Verdict(False, 0.0, "mismatch", {**details, "fields": wrong})
        return Verdict(True, 1.0, "ok", details)

    def validate_payload(self, payload: dict) -> None:
        check_keys(payload, ("schema", "answer", "example", "answer_at"))
        schema = payload.get("schema")
        if not isinstance(schema, (dict, bool)):
            raise ValueError("'schema' is missing" if schema is None else "'schema' must be a JSON Schema object")
        try:
            _validator(json.dumps(schema, sort_keys=True))
        except Exception as e:  # jsonschema.SchemaError and friends
            raise ValueError(f"'schema' is not a valid JSON Schema: {str(e).splitlines()[0][:200]}") from None
        if "answer" in payload and not isinstance(payload["answer"], dict):
            raise ValueError("'answer' must be an object of field values")

    def gold_completion(self, payload: dict) -> str | None:
        where = payload.get("answer_at", "whole")
        if "example" in payload:
            return place_answer(json.dumps(payload["example"]), where)
        answer = payload.get("answer")
        schema = _validator(json.dumps(payload["schema"], sort_keys=True))
        if answer is None or not schema.is_valid(answer):
            return None  # the field values alone are not a whole answer
        return place_answer(json.dumps(answer), where)

    def instruction(self, payload: dict) -> str:
        where = payload.get("answer_at", "whole")
        if where == "whole":
            return "Reply with one JSON value that follows this JSON Schema, and nothing else:\n" + json.dumps(
                payload["schema"])
        return (format_instruction(where).replace("your final answer", "one JSON value")
                + " It must follow this JSON Schema:\n" + json.dumps(payload["schema"]))

    def examples(self) -> list[tuple[Task, str]]:
        person = {"type": "object", "required": ["name", "age"], "additionalProperties": False,
                  "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}}}
        rows = [("Describe Ada, aged 36.", person, {"name": "Ada", "age": 36}),
                ("Describe Bob, aged 7.", person, {"name": "Bob", "age": 7}),
                ("List three primes.", {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 3},
                 None),
                ("Is 7 prime? Give {\"prime\": bool}.", {"type": "object", "required": ["prime"],
                                                         "properties": {"prime": {"type": "boolean"}}}, {"prime": True})]
        out = []
        for i, (q, schema, answer) in enumerate(rows):
            payload = {"schema": schema, **({"answer": answer} if answer else {})}
            value = answer if answer is not None else [2, 3, 5]
            out.append((example_task("json", i, q, payload), "```json\n" + json.dumps(value) + "\n```"))
        return out


VERIFIERS.register("json")(JsonVerifier())
