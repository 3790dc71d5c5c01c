"""The ``cad`` verifier: the answer's program builds a solid in the sandbox; trusted code measures it
against the reference part by exact mesh booleans.

Payload ``{"program": reference source defining part(), "threshold": 0.9, "bbox_tol": 0.5}``. In
order:

1. **Extraction and compile**, as the ``code`` verifier: one fenced Python block (``no_code``),
   compiled here (``syntax_error``), defining ``part`` at top level (``no_entry_point``).
2. **Job 1, the answer** (``rlvr.verifiers.cad_api`` prepended: ``box``, ``cylinder``,
   ``sphere``, ``union``, ``difference``, ``intersection``, ``translate``, ``rotate``,
   ``polyhedron``): calls
   ``part()`` and exports its mesh as JSON; only that string leaves the answer's process.
   ``timeout``; ``runtime_error`` when it raises, dies or returns no solid; ``too_large`` past
   ``cad_api.MAX_TRIANGLES``.
3. **Job 2, trusted** (no answer code in it): rebuilds the mesh with manifold3d (``not_watertight``
   for an open or self-inconsistent mesh, ``empty`` for no volume), builds the reference, and
   computes both volumes and the volumes of their intersection and union exactly (``bad_mesh``
   when what came out of job 1 is not a mesh at all).
4. **Verdict, here**: ``wrong_bbox`` when a bounding-box coordinate is off by more than
   ``bbox_tol``; else the volumetric IoU must reach the task's bar, ``max(threshold,
   1 - (1 - b) / 4)`` capped at 0.999, where ``b`` is the IoU of the reference's own bounding box
   (the "right outline, no features" answer: a plate without its holes). So a feature must be
   there, not just the outline. ``mismatch`` below the bar; its partial credit is
   ``(IoU - b) / (1 - b)`` (0 where the reference is its own box).

Exact booleans rather than voxels: manifold3d computes the intersection and union volumes of two
closed meshes exactly, so the IoU has no grid resolution to tune and costs milliseconds; the
boolean backend trimesh would call is the same library. The extra: ``pip install 'rlvr[manifold3d]'``.
"""

from __future__ import annotations

import importlib.util
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pathlib import Path

from rlvr.errors import UserError
from rlvr.types import Task, Verdict
from rlvr.verifiers.answer import check_keys
from rlvr.verifiers.base import VERIFIERS, example_task, prepare_all
from rlvr.verifiers.code import compile_check, defines_top_level, extract_code

if TYPE_CHECKING:
    from rlvr.sandbox.types import ExecResult

PAYLOAD_KEYS = ("program", "threshold", "bbox_tol")
MAX_BAR = 0.999
CHUNK = 16  # meshes measured per trusted job


def _limits(wall_s: float):
    from rlvr.sandbox.types import Limits

    return Limits(wall_s=wall_s, cpu_s=int(wall_s) + 1, memory_mb=1024, output_kb=2048, output_kill_mb=16)


def require_backend() -> None:
    if importlib.util.find_spec("manifold3d") is None:
        raise UserError("the cad verifier (cad.shapes) measures solids with manifold3d: pip install 'rlvr[manifold3d]'")


def bar(b: float, threshold: float) -> float:
    """The IoU an answer needs when the reference's bounding box alone scores ``b``."""
    return min(MAX_BAR, max(threshold, 1 - (1 - b) / 4))


def _fail(reason: str, details: dict[str, Any], score: float = 0.0) -> Verdict:
    return Verdict(False, score, reason, details)


def api_source() -> str:
    """The source of ``rlvr.verifiers.cad_api``, read as text: it runs in the sandbox only, so the
    trainer's process never imports it (nor manifold3d, the ``manifold3d`` extra)."""
    spec = importlib.util.find_spec("rlvr.verifiers.cad_api")
    return Path(spec.origin).read_text()


@dataclass
class _Pending:
    index: int
    task: Task
    details: dict[str, Any]
    export: Future | None = None
    mesh: str = ""


def _exported(p: _Pending, result: ExecResult) -> Verdict | None:
    """The verdict of a failed job 1, or None (``p.mesh`` set)."""
    d = p.details
    d["status"] = result.status
    if result.status == "timeout":
        return _fail("timeout", d)
    out = (result.outputs or [{}])[0]
    if result.status != "ok" or not result.report_ok or "ok" not in out:
        error = str(out.get("error") or result.stderr or result.error or result.status)
        if "triangles (at most" in error:
            return _fail("too_large", {**d, "error": error[-300:]})
        return _fail("sandbox_error" if result.status == "error" else "runtime_error", {**d, "error": error[-300:]})
    if not isinstance(out["ok"], str):
        return _fail("runtime_error", {**d, "error": "export returned no mesh"})
    p.mesh = out["ok"]
    return None


def _whole(result: ExecResult, n: int) -> bool:
    return result.status == "ok" and result.report_ok and len(result.outputs or []) == n


def _measured(p: _Pending, out: dict) -> Verdict:
    d = p.details
    payload = p.task.spec.payload
    ref_bbox = [float(x) for x in out["ref_bbox"]]
    ref_volume = float(out["ref_volume"])
    box_volume = (ref_bbox[3] - ref_bbox[0]) * (ref_bbox[4] - ref_bbox[1]) * (ref_bbox[5] - ref_bbox[2])
    b = ref_volume / box_volume if box_volume > 0 else 1.0
    d.update(ref_volume=round(ref_volume, 3), bbox_baseline=round(b, 4), bar=round(bar(b, payload.get("threshold", 0.9)), 4))
    if out["problem"]:
        return _fail(out["problem"], d)  # empty, not_watertight, bad_mesh
    bbox = [float(x) for x in out["bbox"]]
    iou = float(out["intersection"]) / float(out["union"]) if out["union"] > 0 else 0.0
    d.update(volume=round(float(out["volume"]), 3), iou=round(iou, 4), bbox=[round(x, 3) for x in bbox])
    off = max(abs(x - y) for x, y in zip(bbox, ref_bbox))
    if off > payload.get("bbox_tol", 0.5):
        return _fail("wrong_bbox", {**d, "bbox_off": round(off, 3)})
    if iou >= d["bar"]:
        return Verdict(True, 1.0, "ok", d)
    return _fail("mismatch", d, round(max(0.0, (iou - b) / (1 - b)), 4) if b < 1 else 0.0)


class CadVerifier:
    """Spec kind ``cad`` (see the module docstring)."""

    name = "cad"

    def _prepare(self, index: int, task: Task, completion: str) -> Verdict | _Pending:
        code = extract_code(completion) if isinstance(completion, str) else None
        if code is None:
            return _fail("no_code", {"format_ok": False})
        details: dict[str, Any] = {"format_ok": True}
        tree = compile_check(code)
        if isinstance(tree, str):
            return _fail("syntax_error", {**details, "error": tree})
        if not defines_top_level(tree, "part"):
            return _fail("no_entry_point", details)
        require_backend()
        return _Pending(index, task, details)

    def check(self, task: Task, completion: str) -> Verdict:
        return self.check_many([(task, completion)])[0]

    def check_many(self, pairs: list[tuple[Task, str]]) -> list[Verdict]:
        """Verdicts in order: every answer's job 1 submitted at once (one job each: answers never
        share a process), then the meshes measured ``CHUNK`` to a trusted job."""
        from rlvr.sandbox.types import Job
        from rlvr.verifiers.code import current_sandbox

        api = api_source()
        verdicts, pending = prepare_all(pairs, self._prepare)
        if not pending:
            return verdicts  # type: ignore[return-value]
        sandbox = current_sandbox()
        for p in pending:
            program = api + "\n\n# ---- the answer\n" + extract_code(pairs[p.index][1])
            p.export = sandbox.submit(Job.io(program, "export", [()], limits=_limits(10.0), task_id=p.task.id))
        ready = []
        for p in pending:
            failed = _exported(p, p.export.result())
            if failed is not None:
                verdicts[p.index] = failed
            else:
                ready.append(p)
        def measure_job(chunk: list[_Pending]):
            return sandbox.submit(Job.io(api, "measure", [(p.mesh, p.task.spec.payload["program"]) for p in chunk],
                                         limits=_limits(10.0 + 2.0 * len(chunk))))

        chunks = [ready[k: k + CHUNK] for k in range(0, len(ready), CHUNK)]
        jobs = [measure_job(chunk) for chunk in chunks]
        for chunk, job in zip(chunks, jobs):
            results = [job.result()]
            if len(chunk) > 1 and not _whole(results[0], len(chunk)):  # one mesh must not cost the others
                results = [f.result() for f in [measure_job([p]) for p in chunk]]
                groups = [[p] for p in chunk]
            else:
                groups = [chunk]
            for group, result in zip(groups, results):
                for k, p in enumerate(group):
                    out = result.outputs[k] if _whole(result, len(group)) else {}
                    if "ok" in out:
                        verdicts[p.index] = _measured(p, out["ok"])
                    elif _whole(result, len(group)):  # measure raises only for the reference
                        raise RuntimeError(f"task {p.task.id}: {out.get('error')}")
                    else:
                        reason = "timeout" if result.status == "timeout" else "sandbox_error"
                        verdicts[p.index] = _fail(reason, {**p.details, "error": str(result.error or result.status)[-300:]})
        return verdicts  # type: ignore[return-value]

    def validate_payload(self, payload: dict) -> None:
        check_keys(payload, PAYLOAD_KEYS)
        if not isinstance(payload.get("program"), str):
            raise ValueError("'program' (the reference part's source) is missing")
        tree = compile_check(payload["program"])
        if isinstance(tree, str) or not defines_top_level(tree, "part"):
            raise ValueError("'program' must compile and define part()")
        for key, top in (("threshold", 1.0), ("bbox_tol", 1e9)):
            x = payload.get(key, 0.5)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 < x <= top:
                raise ValueError(f"'{key}' must be a number in (0, {top:g}]")

    def gold_completion(self, payload: dict) -> str:
        return f"```python\n{payload['program']}```"

    def instruction(self, payload: dict) -> str:
        return ("Answer with one ```python block defining part(), which returns the solid built with box, "
                "cylinder, sphere, union, difference, intersection, translate, rotate or polyhedron.")

    def examples(self) -> list[tuple[Task, str]]:
        program = "def part():\n    return difference(box(20, 10, 4), cylinder(2, 4, at=(10, 5, 0)))\n"
        task = example_task("cad", 0, "A 20x10x4 plate with a hole of radius 2 at its centre.", {"program": program})
        return [(task, f"```python\n{program}```")]


VERIFIERS.register("cad")(CadVerifier())
