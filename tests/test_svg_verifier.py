"""``render.svg`` and the ``svg`` verifier: references pass, equivalent drawings pass, wrong ones
fail with a partial score, and hostile SVGs fail cleanly within a time bound without touching the
host (checked on the text first, and bounded by the sandbox when rendered anyway)."""

from __future__ import annotations

import dataclasses
import io
import random
import time

import numpy as np
import pytest

import rlvr.tasks  # noqa: F401  (registration)
import rlvr.verifiers  # noqa: F401
from rlvr.tasks.base import DOMAINS
from rlvr.tasks.render_svg import COLORS, VIEWBOX
from rlvr.verifiers.base import check_all, get_verifier
from rlvr.verifiers.svg_attacks import HEAD, hostile_svgs as hostile, svg
from rlvr.verifiers.svg import COLOR_TOL, MAX_CHARS, SVG_NS, extract_svg, hard_check, hex_rgb, pixels, render_job, similarity

pytest.importorskip("resvg_py", reason="the resvg_py extra is not installed")

DOMAIN = DOMAINS.get("render.svg")
PAYLOAD = {"viewbox": VIEWBOX, "size": 100}


def task(level: int = 1, i: int = 0):
    return DOMAIN.generate("train", level, i, 0)


@pytest.fixture(scope="module")
def tasks():
    return [DOMAIN.generate(split, level, i, 0) for split in ("train", "eval") for level in DOMAIN.levels
            for i in range(4)]


@pytest.mark.slow  # the conformance suite plays every domain's references by default
def test_references_pass_and_another_scene_fails(sandbox, tasks):
    verdicts = check_all([(t, t.reference) for t in tasks])
    assert all(v.passed for v in verdicts), [v.details for v in verdicts if not v.passed]
    others = check_all([(t, tasks[(i + 5) % len(tasks)].reference) for i, t in enumerate(tasks)])
    assert not any(v.passed for v in others)
    assert all(v.reason == "mismatch" and v.score < 0.9 for v in others)


def test_the_same_picture_written_another_way_passes(sandbox):
    t = task(2, 3)
    named = t.reference
    for name, hex_code in COLORS.items():
        named = named.replace(f'fill="{hex_code}"', f'fill="{name}"')
    rewritten = [
        named,
        t.reference.replace(HEAD, f'<svg xmlns="{SVG_NS}" width="100" height="100" viewBox="0,0,100,100">'),
        t.reference.replace(HEAD, HEAD + '<g transform="translate(0 0)" stroke="none">').replace("</svg>", "</g></svg>"),
        f"Here is the picture:\n```svg\n{t.reference}\n```\nDone.",
    ]
    verdicts = check_all([(t, c) for c in rewritten])
    assert all(v.passed for v in verdicts), [v.reason for v in verdicts]


def test_wrong_drawings_fail_with_partial_credit(sandbox):
    t = task(1, 0)  # one shape
    colour = t.spec.payload["colors"][0]
    other = next(c for c in COLORS.values() if c != colour)
    flooded = svg(f'<rect width="100" height="100" fill="{colour}"/>')
    recoloured = t.reference.replace(colour, other)
    shifted = t.reference.replace(HEAD, HEAD + '<g transform="translate(3 2)">').replace("</svg>", "</g></svg>")
    stripes = svg(f'<rect width="100" height="50" fill="{colour}"/><rect y="50" width="100" height="50" fill="{other}"/>')
    verdicts = check_all([(t, flooded), (t, recoloured), (t, shifted), (t, svg("")), (t, stripes)])
    assert [v.reason for v in verdicts] == ["mismatch"] * 5
    # partial credit is beyond the best drawing without shapes: flooded, blank and striped earn 0
    assert verdicts[0].score == verdicts[3].score == 0.0
    assert verdicts[2].score > 0.2  # nearly the shape: credit
    assert verdicts[1].score <= 0.5  # the ink is right, the colour is not


def test_stacking_order_matters_where_shapes_overlap(sandbox):
    checked = 0
    for i in range(12):
        t = DOMAIN.generate("train", 3, i, 0)
        body = t.reference[len(HEAD): -len("</svg>")]
        elements = [e + "/>" for e in body.split("/>") if e]
        swapped = HEAD + "".join(reversed(elements)) + "</svg>"
        v = get_verifier(t).check(t, swapped)
        ious = v.details.get("iou", {})
        if ious and min(ious.values()) < 0.8:
            assert not v.passed
            checked += 1
    assert checked >= 3


@pytest.mark.parametrize("name", sorted(hostile()))
def test_hostile_svgs_fail_on_the_text_without_rendering(name):
    text = hostile()[name]
    started = time.perf_counter()
    completion = text if len(text) < 1000 else text
    document = extract_svg(completion)
    failed = hard_check(document, PAYLOAD) if document is not None else ("no_svg", "")
    assert failed is not None, name
    assert failed[0] in ("forbidden", "too_large", "too_complex", "wrong_canvas", "malformed"), failed
    assert time.perf_counter() - started < 2.0


def test_hostile_svgs_get_failing_verdicts(sandbox):
    t = task()
    verdicts = check_all([(t, text) for text in hostile().values()])
    assert not any(v.passed for v in verdicts)
    assert all(v.details.get("format_ok") is not None for v in verdicts)


def test_rendered_anyway_hostile_svgs_stay_in_the_sandbox(sandbox, tmp_path):
    """Defence in depth: the hard checks bypassed, each hostile SVG rendered in the sandbox ends
    within the limits, and a picture on the host's disk never reaches the canvas."""
    from PIL import Image

    red = tmp_path / "red.png"
    Image.new("RGB", (100, 100), (255, 0, 0)).save(red)
    cases = {name: text for name, text in hostile(str(red)).items() if name != "huge file"}
    started = time.perf_counter()
    results = [sandbox.submit(render_job([text], 100)).result() for text in cases.values()]
    for (name, _), r in zip(cases.items(), results):
        assert r.status in ("ok", "timeout", "killed", "output_limit"), (name, r.status, r.error)
        assert r.duration_s < 6.0, name
        out = (r.outputs or [{}])[0]
        if "ok" in out:  # rendered: nothing from the host file, nothing fetched
            assert not (np.abs(pixels(out["ok"], 100) - np.array([255, 0, 0])).max(axis=2) <= COLOR_TOL).any(), name
    assert time.perf_counter() - started < 60
    probe = sandbox.submit(render_job([svg(f'<image href="{red}" width="100" height="100"/>')], 100)).result()
    assert probe.status == "ok" and "ok" in probe.outputs[0]


def test_the_host_file_probe_would_show_red_outside_the_sandbox(tmp_path):
    """The probe above is meaningful: resvg itself does load a host file an <image> names."""
    import resvg_py
    from PIL import Image

    red = tmp_path / "red.png"
    Image.new("RGB", (100, 100), (255, 0, 0)).save(red)
    png = resvg_py.svg_to_bytes(svg_string=svg(f'<image href="{red}" width="100" height="100"/>'), width=100,
                                height=100, background="white", skip_system_fonts=True)
    image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(np.int16)
    assert (np.abs(image - np.array([255, 0, 0])).max(axis=2) <= COLOR_TOL).mean() > 0.9


def test_extraction_is_strict():
    one = svg('<rect width="9" height="9"/>')
    assert extract_svg(f"text {one} text") == one
    assert extract_svg(one + one) is None
    assert extract_svg(one[:-6]) is None
    assert extract_svg("no picture") is None
    assert hard_check("x" * (MAX_CHARS + 1), PAYLOAD)[0] == "too_large"


def plain_similarity(candidate, reference, colors):
    """A pixel-by-pixel loop: the reference the vectorised ``similarity`` must equal."""
    size = len(candidate)
    ious = []
    for c in [*colors, "ink"]:
        inter = union = 0
        for y in range(size):
            for x in range(size):
                a, b = candidate[y][x], reference[y][x]
                if c == "ink":
                    in_a = max(abs(int(v) - 255) for v in a) > COLOR_TOL
                    in_b = max(abs(int(v) - 255) for v in b) > COLOR_TOL
                else:
                    rgb = hex_rgb(c)
                    in_a = max(abs(int(v) - w) for v, w in zip(a, rgb)) <= COLOR_TOL
                    in_b = max(abs(int(v) - w) for v, w in zip(b, rgb)) <= COLOR_TOL
                inter += in_a and in_b
                union += in_a or in_b
        ious.append(1.0 if union == 0 else inter / union)
    return sum(ious) / len(ious)


def test_vectorised_similarity_equals_the_plain_loop():
    rng = random.Random(0)
    palette = [hex_rgb(c) for c in COLORS.values()] + [(255, 255, 255)]
    for _ in range(5):
        a = np.array([[rng.choice(palette) for _ in range(16)] for _ in range(16)], dtype=np.int16)
        b = np.array([[rng.choice(palette) for _ in range(16)] for _ in range(16)], dtype=np.int16)
        colors = rng.sample(sorted(COLORS.values()), 3)
        assert similarity(a, b, colors)[0] == pytest.approx(plain_similarity(a.tolist(), b.tolist(), colors))
        assert similarity(a, a, colors)[0] == 1.0


def test_payload_validation_names_the_key():
    v = get_verifier(task())
    good = dict(task().spec.payload)
    v.validate_payload(good)
    for bad, word in (({**good, "size": 0}, "size"), ({**good, "colors": ["red"]}, "colors"),
                      ({**good, "threshold": 2}, "threshold"), ({**good, "svg": "<svg/>"}, "svg")):
        with pytest.raises(ValueError, match=word):
            v.validate_payload(bad)


def test_scenes_are_deterministic_and_levels_grow():
    assert task(2, 1) == task(2, 1)
    sizes = [np.mean([len(DOMAIN.generate("train", level, i, 0).reference) for i in range(20)])
             for level in DOMAIN.levels]
    assert sizes[0] < sizes[1] < sizes[3]


def test_without_resvg_the_error_is_one_line_naming_the_extra(monkeypatch):
    import importlib.util

    from rlvr.errors import UserError
    from rlvr.verifiers import svg as svg_module

    real = importlib.util.find_spec
    monkeypatch.setattr(svg_module.importlib.util, "find_spec",
                        lambda name, *a: None if name == "resvg_py" else real(name, *a))
    t = task()
    with pytest.raises(UserError, match=r"pip install 'rlvr\[resvg_py\]'"):
        get_verifier(t).check(t, t.reference)
    assert get_verifier(t).check(t, "no picture").reason == "no_svg"  # nothing to render: no need for it


def test_chunked_verdicts_equal_one_at_a_time_and_a_broken_job_is_rerun_alone(sandbox, tasks, monkeypatch):
    from rlvr.verifiers import svg as svg_module

    pairs = [(t, c) for t in tasks[:12] for c in (t.reference, tasks[0].reference, svg(""))]
    batched = check_all(pairs)
    alone = [get_verifier(t).check(t, c) for t, c in pairs[:9]]
    assert [v.to_dict() | {"details": {}} for v in batched[:9]] == [v.to_dict() | {"details": {}} for v in alone]
    assert [v.score for v in batched[:9]] == [v.score for v in alone]

    real = svg_module._chunk_job

    def starved(chunk):  # a job of several answers runs out of time; alone, each is fine
        job, slots = real(chunk)
        if len(chunk) > 1:
            job = dataclasses.replace(job, limits=dataclasses.replace(job.limits, wall_s=0.01))
        return job, slots

    monkeypatch.setattr(svg_module, "_chunk_job", starved)
    rerun = check_all(pairs)
    assert [v.reason for v in rerun] == [v.reason for v in batched]
