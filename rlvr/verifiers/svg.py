"""The ``svg`` verifier: strict hard checks here, a headless render in the sandbox, then a
colour-by-colour overlap score against the reference rendering.

Payload ``{"svg": reference, "viewbox": "0 0 100 100", "size": 100, "colors": ["#ff0000", ...],
"threshold": 0.9}``. In order:

1. **Extraction**: exactly one ``<svg ...>...</svg>`` element in the completion (text around it is
   allowed, except a DOCTYPE, entity or processing instruction anywhere); none, several, or an
   unclosed one is ``no_svg``. Over ``MAX_CHARS`` is ``too_large``.
2. **Hard checks on the text** (parsed with the standard library's XML parser, after any
   ``<!DOCTYPE``/``<!ENTITY``, so no entity is ever expanded): ``forbidden`` for a DOCTYPE, an
   entity or a processing instruction, any element outside ``ELEMENTS`` (``script``,
   ``foreignObject``, ``image``, ``use``, ``style``, ``text``, filters ...), any ``href``, event
   attribute (``on*``) or ``url(``/``@import``/``javascript:`` in a value; ``malformed`` when it
   does not parse or the root is not an SVG-namespace ``svg``; ``too_complex`` past
   ``MAX_DEPTH`` nesting or ``MAX_ELEMENTS`` elements; ``wrong_canvas`` when the root's
   ``viewBox`` is not the task's or a ``width``/``height`` differs from its size.
3. **Render in the sandbox** (``rlvr.verifiers.svg_render`` as an io job): resvg draws the
   candidate and the reference on a white ``size`` x ``size`` canvas within the job's limits,
   ``CHUNK`` answers and their distinct references a job (a job that does not finish whole is
   run again one answer a job, so one answer never costs another its verdict);
   ``render_error`` when resvg refuses the document (zero size, node limits), ``timeout`` or
   ``sandbox_error`` for the run.
4. **Score** (here, on the pixels that come back): for each reference colour, the pixels within
   ``COLOR_TOL`` of it in either image, and their intersection over union; plus the same for
   "ink" (any pixel not white). The similarity is the mean of these IoUs; ``ok`` at ``threshold``
   or more, else ``mismatch``. Its partial credit is chance-corrected like code's: the similarity
   beyond the best drawing without shapes (the canvas flooded with one of the colours, or
   stripes of them: ``trivial_baseline``), ``(s - b) / (1 - b)``, so a blank, flooded or striped canvas scores 0.

The renderer is resvg (``pip install 'rlvr[resvg_py]'``): a maintained, memory-safe renderer with no
scripting or network access and no system libraries to install; CairoSVG needs the system
cairo library and fetches external URLs unless told not to.
"""

from __future__ import annotations

import base64
import dataclasses
import importlib.util
import inspect
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rlvr.errors import UserError
from rlvr.types import Task, Verdict
from rlvr.verifiers import svg_render
from rlvr.verifiers.answer import check_keys
from rlvr.verifiers.base import VERIFIERS, example_task, prepare_all

if TYPE_CHECKING:
    from rlvr.sandbox.types import ExecResult, Job

PAYLOAD_KEYS = ("svg", "viewbox", "size", "colors", "threshold")
SVG_NS = "http://www.w3.org/2000/svg"
MAX_CHARS = 20_000
MAX_DEPTH = 16
MAX_ELEMENTS = 256
CHUNK = 16  # answers rendered per sandbox job (a process start and imports cost ~100x one render)
RENDER_S = 0.25  # wall seconds a job's limit grows by per render
COLOR_TOL = 40  # largest per-channel difference of a pixel "of" a colour (anti-aliased edges fall out)
ELEMENTS = {"svg", "g", "rect", "circle", "ellipse", "line", "polyline", "polygon", "path", "title", "desc"}
_OPEN = re.compile(r"<svg\b", re.IGNORECASE)
_CLOSE = re.compile(r"</svg\s*>", re.IGNORECASE)
_DECLARATION = re.compile(r"<!|<\?(?!xml\s)", re.IGNORECASE)  # DOCTYPE, ENTITY, CDATA, PIs
_BAD_VALUE = re.compile(r"url\s*\(|@import|javascript:|expression\s*\(", re.IGNORECASE)
_NUMBER = re.compile(r"^\s*([0-9.]+)\s*(px)?\s*$")


def _limits():
    from rlvr.sandbox.types import Limits

    return Limits(wall_s=5.0, cpu_s=5, memory_mb=1024, output_kb=256)


def extract_svg(text: str) -> str | None:
    """The one ``<svg ...>...</svg>`` element of ``text``, or None (none, several, unclosed)."""
    opens, closes = list(_OPEN.finditer(text)), list(_CLOSE.finditer(text))
    if len(opens) != 1 or len(closes) != 1 or closes[0].start() < opens[0].start():
        return None
    return text[opens[0].start(): closes[0].end()]


def _local(name: str) -> str:
    return name.rsplit("}", 1)[-1]


def hard_check(svg: str, payload: dict) -> tuple[str, str] | None:
    """``(reason, detail)`` for the first hard check ``svg`` fails, or None."""
    if len(svg) > MAX_CHARS:
        return "too_large", f"{len(svg)} characters (at most {MAX_CHARS})"
    declaration = _DECLARATION.search(svg)
    if declaration:
        return "forbidden", f"declaration or processing instruction at {declaration.start()}"
    try:
        root = ET.fromstring(svg)
    except ET.ParseError as e:
        return "malformed", str(e)[:200]
    if root.tag != f"{{{SVG_NS}}}svg":
        return "malformed", f"the root is {root.tag!r}, not an svg element in the {SVG_NS} namespace"
    count, stack = 0, [(root, 1)]
    while stack:
        element, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH or count > MAX_ELEMENTS:
            return "too_complex", f"deeper than {MAX_DEPTH} or more than {MAX_ELEMENTS} elements"
        tag = _local(element.tag) if isinstance(element.tag, str) else "?"
        if tag not in ELEMENTS or (element.tag.startswith("{") and not element.tag.startswith(f"{{{SVG_NS}}}")):
            return "forbidden", f"element {tag!r} (allowed: {', '.join(sorted(ELEMENTS))})"
        for name, value in element.attrib.items():
            attr = _local(name).lower()
            if attr == "href" or attr.startswith("on") or _BAD_VALUE.search(value):
                return "forbidden", f"attribute {attr}={value[:60]!r} on {tag}"
        stack += [(child, depth + 1) for child in element]
    if " ".join(root.get("viewBox", "").replace(",", " ").split()) != payload["viewbox"]:
        return "wrong_canvas", f"viewBox {root.get('viewBox')!r}, not {payload['viewbox']!r}"
    for side in ("width", "height"):
        value = root.get(side)
        if value is not None:
            m = _NUMBER.match(value)
            if not m or float(m.group(1)) != payload["size"]:
                return "wrong_canvas", f"{side}={value!r}, not {payload['size']}"
    return None


def hex_rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def pixels(encoded: str, size: int) -> np.ndarray:
    return np.frombuffer(base64.b64decode(encoded), dtype=np.uint8).reshape(size, size, 3).astype(np.int16)


def similarity(candidate: np.ndarray, reference: np.ndarray, colors: list[str]) -> tuple[float, dict[str, float]]:
    """The mean over ``colors`` and "ink" of the IoU of their pixel masks (see the module docstring)."""
    ious: dict[str, float] = {}
    masks = {c: lambda img, rgb=np.array(hex_rgb(c)): np.abs(img - rgb).max(axis=2) <= COLOR_TOL for c in colors}
    masks["ink"] = lambda img: np.abs(img - 255).max(axis=2) > COLOR_TOL
    for name, mask in masks.items():
        a, b = mask(candidate), mask(reference)
        union = int((a | b).sum())
        ious[name] = 1.0 if union == 0 else int((a & b).sum()) / union
    return sum(ious.values()) / len(ious), ious


def shapeless_drawings(size: int, colors: list[str]) -> list[np.ndarray]:
    """Drawings that know the colours and nothing of the shapes: the canvas flooded with each
    colour, and equal stripes of all of them (across and down, in either order)."""
    rgbs = [np.array(hex_rgb(c), dtype=np.int16) for c in colors]
    out = [np.broadcast_to(rgb, (size, size, 3)) for rgb in rgbs]
    for order in (rgbs, rgbs[::-1]):
        bands = np.stack([order[min(i * len(order) // size, len(order) - 1)] for i in range(size)])
        out += [np.broadcast_to(bands[None, :, :], (size, size, 3)), np.broadcast_to(bands[:, None, :], (size, size, 3))]
    return out


def trivial_baseline(reference: np.ndarray, colors: list[str]) -> float:
    """The best similarity of a drawing without shapes (``shapeless_drawings``)."""
    return max(similarity(d, reference, colors)[0] for d in shapeless_drawings(len(reference), colors))


def require_renderer() -> None:
    if importlib.util.find_spec("resvg_py") is None or importlib.util.find_spec("PIL") is None:
        raise UserError("the svg verifier (render.svg) renders with resvg: pip install 'rlvr[resvg_py]'")


def render_job(svgs: list[str], size: int | list[int], task_id: str = "") -> Job:
    """An io job rendering each of ``svgs`` at ``size`` (one, or one per SVG); outputs: base64
    RGB, or an error. Its wall limit grows with the number of renders."""
    from rlvr.sandbox.types import Job

    sizes = size if isinstance(size, list) else [size] * len(svgs)
    limits = _limits()
    limits = dataclasses.replace(limits, wall_s=limits.wall_s + RENDER_S * len(svgs),
                                 cpu_s=limits.cpu_s + math.ceil(RENDER_S * len(svgs)))
    return Job.io(inspect.getsource(svg_render), "render", list(zip(svgs, sizes)), limits=limits, task_id=task_id)


@dataclass
class _Pending:
    """An answer past the hard checks, waiting for its render."""

    index: int
    svg: str
    payload: dict
    details: dict[str, Any]


def _chunk_job(chunk: list[_Pending]) -> tuple[Job, list[tuple[int, int]]]:
    """One job rendering every answer of ``chunk`` and each distinct reference once, and where
    each item's answer and reference sit among its outputs."""
    inputs: list[tuple[str, int]] = []
    where: dict[tuple[str, int], int] = {}
    slots = []
    for item in chunk:
        pair = []
        for text in (item.svg, item.payload["svg"]):
            key = (text, item.payload["size"])
            if key not in where:
                where[key] = len(inputs)
                inputs.append(key)
            pair.append(where[key])
        slots.append((pair[0], pair[1]))
    return render_job([t for t, _ in inputs], [n for _, n in inputs]), slots


def _whole(result: ExecResult, n: int) -> bool:
    """Whether the job ran to the end and reported an output for each of its ``n`` renders."""
    return result.status == "ok" and result.report_ok and len(result.outputs or []) == n


def _verdict(item: _Pending, result: ExecResult, slot: tuple[int, int]) -> Verdict:
    d = {**item.details, "status": result.status}
    if result.status == "timeout":
        return Verdict(False, 0.0, "timeout", d)
    if result.status != "ok" or not result.report_ok or not result.outputs:
        d["stderr"] = (result.stderr or result.error or "")[-300:]
        return Verdict(False, 0.0, "sandbox_error" if result.status == "error" else "render_error", d)
    answer, ref = result.outputs[slot[0]], result.outputs[slot[1]]
    if "error" in ref:
        raise RuntimeError(f"the reference SVG does not render: {ref['error']}")
    if "error" in answer:
        return Verdict(False, 0.0, "render_error", {**d, "error": str(answer["error"])[:300]})
    size, colors = item.payload["size"], item.payload["colors"]
    reference = pixels(ref["ok"], size)
    score, ious = similarity(pixels(answer["ok"], size), reference, colors)
    baseline = trivial_baseline(reference, colors)
    d.update(similarity=round(score, 4), iou={k: round(v, 4) for k, v in ious.items()},
             trivial_baseline=round(baseline, 4))
    if score >= item.payload.get("threshold", 0.9):
        return Verdict(True, 1.0, "ok", d)
    return Verdict(False, round(max(0.0, (score - baseline) / (1 - baseline)), 4), "mismatch", d)


class SvgVerifier:
    """Spec kind ``svg`` (see the module docstring)."""

    name = "svg"

    def _prepare(self, index: int, task: Task, completion: str) -> Verdict | _Pending:
        payload = task.spec.payload
        svg = extract_svg(completion) if isinstance(completion, str) else None
        details: dict[str, Any] = {"format_ok": svg is not None}
        if svg is None:
            return Verdict(False, 0.0, "no_svg", details)
        declaration = _DECLARATION.search(completion)  # also outside the element: a DOCTYPE before it
        failed = ("forbidden", f"declaration at {declaration.start()}") if declaration else hard_check(svg, payload)
        if failed:
            return Verdict(False, 0.0, failed[0], {**details, "detail": failed[1]})
        require_renderer()
        return _Pending(index, svg, payload, details)

    def check(self, task: Task, completion: str) -> Verdict:
        return self.check_many([(task, completion)])[0]

    def check_many(self, pairs: list[tuple[Task, str]]) -> list[Verdict]:
        """Verdicts in order. Answers past the hard checks are rendered ``CHUNK`` to a sandbox job
        (each distinct reference once), the jobs submitted at once; a job that does not finish
        whole is run again one answer a job, so one answer never fails another."""
        from rlvr.verifiers.code import current_sandbox

        verdicts, pending = prepare_all(pairs, self._prepare)
        if pending:
            sandbox = current_sandbox()
            chunks = [pending[k: k + CHUNK] for k in range(0, len(pending), CHUNK)]
            jobs = [_chunk_job(chunk) for chunk in chunks]
            futures = [sandbox.submit(job) for job, _ in jobs]
            for chunk, (job, slots), future in zip(chunks, jobs, futures):
                result = future.result()
                if len(chunk) > 1 and not _whole(result, len(job.inputs)):
                    alone = [_chunk_job([item]) for item in chunk]
                    results = [f.result() for f in [sandbox.submit(j) for j, _ in alone]]
                    for item, (_, one), r in zip(chunk, alone, results):
                        verdicts[item.index] = _verdict(item, r, one[0])
                    continue
                for item, slot in zip(chunk, slots):
                    verdicts[item.index] = _verdict(item, result, slot)
        return verdicts  # type: ignore[return-value]  (every slot is filled)

    def validate_payload(self, payload: dict) -> None:
        check_keys(payload, PAYLOAD_KEYS)
        for key in ("svg", "viewbox", "size", "colors"):
            if key not in payload:
                raise ValueError(f"'{key}' is missing")
        if not isinstance(payload["size"], int) or not 8 <= payload["size"] <= 512:
            raise ValueError("'size' must be an integer from 8 to 512 (pixels)")
        if not all(isinstance(c, str) and re.fullmatch(r"#[0-9a-fA-F]{6}", c) for c in payload["colors"]):
            raise ValueError("'colors' must be a list of #rrggbb strings")
        threshold = payload.get("threshold", 0.9)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1:
            raise ValueError("'threshold' must be a number in (0, 1]")
        failed = hard_check(str(payload["svg"]), payload)
        if failed:
            raise ValueError(f"the reference 'svg' fails its own checks: {failed[0]}: {failed[1]}")

    def gold_completion(self, payload: dict) -> str:
        return payload["svg"]

    def instruction(self, payload: dict) -> str:
        return (f'Answer with one SVG element: <svg xmlns="{SVG_NS}" viewBox="{payload["viewbox"]}">...</svg>, '
                f"using only {', '.join(sorted(ELEMENTS - {'svg'}))}.")

    def examples(self) -> list[tuple[Task, str]]:
        svg = (f'<svg xmlns="{SVG_NS}" viewBox="0 0 100 100"><rect x="10" y="10" width="30" height="20" '
               'fill="#ff0000"/></svg>')
        payload = {"svg": svg, "viewbox": "0 0 100 100", "size": 100, "colors": ["#ff0000"]}
        return [(example_task("svg", 0, "Draw a red 30x20 rectangle at (10, 10).", payload), svg)]


VERIFIERS.register("svg")(SvgVerifier())
