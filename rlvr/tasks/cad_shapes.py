"""``cad.shapes``: write a short program that builds a described 3D part; checked by measuring it.

The answer defines ``part()`` with the ``cad`` verifier's API (``rlvr.verifiers.cad_api``: ``box``,
``cylinder``, ``sphere``, ``union``, ``difference``, ``intersection``, ``translate``,
``rotate``, ``polyhedron``). Units are millimetres, z is up, and every stated number is an integer:

    L1  one primitive, its geometry stated           "a cylinder of radius 6 and height 10 whose base is
                                                      centred at (8, 8, 0)"
    L2  two primitives joined (a union), both stated  a box with a second box or a cylinder on it
    L3  a plate with one or two through holes         hole centres stated from the plate's corner
    L4  a part to derive: a flange or a bracket       "four holes of radius 2, each 4 mm in from two
                                                      edges", "a boss centred on the top face"

The ``cad`` verifier runs the answer in the sandbox and compares the solid with the reference by
exact volumes, watertightness and bounding box. Each task's ``threshold`` (``threshold``) sits halfway
into its smallest feature's share of the volume (a hole, a boss, the second body), so an answer
without that feature fails; the verifier also raises the bar above what the reference's bounding
box alone scores. The reference is the program below the
description; the key is the part's specification (JSON), the wording is decoration.

Not here: building and measuring solids (``rlvr.verifiers.cad``).
"""

from __future__ import annotations

import json
import math
import random

from rlvr.tasks.base import DOMAINS, Domain, Problem
from rlvr.types import Spec

NAME = "cad.shapes"
THRESHOLD = 0.9
MAX_THRESHOLD = 0.999  # an answer built with the API as the reference is scores 1.0 (float error aside)
BBOX_TOL = 0.5


def primitive(rng: random.Random, at_z: int = 0) -> tuple[str, str, dict]:
    """(description, expression, spec) of one stated primitive."""
    kind = rng.choice(("box", "cylinder", "sphere"))
    if kind == "box":
        w, d, h = (rng.randint(2, 15) * 2 for _ in range(3))
        x, y = rng.randint(0, 10), rng.randint(0, 10)
        return (f"a box {w} mm along x, {d} mm along y and {h} mm tall with its lowest corner at ({x}, {y}, {at_z})",
                f"box({w}, {d}, {h}, at=({x}, {y}, {at_z}))", {"box": [w, d, h, x, y, at_z]})
    if kind == "cylinder":
        r, h = rng.randint(2, 10), rng.randint(2, 20)
        x, y = rng.randint(r, r + 10), rng.randint(r, r + 10)
        return (f"a cylinder of radius {r} mm and height {h} mm standing on z with its base centred at "
                f"({x}, {y}, {at_z})", f"cylinder({r}, {h}, at=({x}, {y}, {at_z}))", {"cylinder": [r, h, x, y, at_z]})
    r = rng.randint(3, 10)
    x, y, z = rng.randint(r, r + 10), rng.randint(r, r + 10), at_z + r
    return (f"a sphere of radius {r} mm centred at ({x}, {y}, {z})", f"sphere({r}, at=({x}, {y}, {z}))",
            {"sphere": [r, x, y, z]})


def level_1(rng: random.Random) -> tuple[str, str, dict, float]:
    text, expr, spec = primitive(rng)
    return f"The part is {text}.", expr, spec, 0.0


def level_2(rng: random.Random) -> tuple[str, str, dict, float]:
    w, d, h = (rng.randint(4, 15) * 2 for _ in range(3))
    base = f"box({w}, {d}, {h})"
    if rng.random() < 0.5:
        r = rng.randint(2, min(w, d) // 2)
        t = rng.randint(2, 12)
        x, y = rng.randint(r, w - r), rng.randint(r, d - r)
        text = (f"The part is a box {w} x {d} x {h} mm (x, y, z) with its lowest corner at the origin, joined "
                f"with a cylinder of radius {r} mm and height {t} mm standing on the box's top face, its base "
                f"centred at ({x}, {y}, {h}).")
        extra = math.pi * r * r * t
        return (text, f"union({base}, cylinder({r}, {t}, at=({x}, {y}, {h})))", {"u": [w, d, h, "c", r, t, x, y]},
                extra / (w * d * h + extra))
    w2, d2, t = rng.randint(1, w // 2) * 2, rng.randint(1, d // 2) * 2, rng.randint(2, 12)
    x, y = rng.randint(0, w - w2), rng.randint(0, d - d2)
    text = (f"The part is a box {w} x {d} x {h} mm (x, y, z) with its lowest corner at the origin, joined with a "
            f"second box {w2} x {d2} x {t} mm sitting on its top face with its lowest corner at ({x}, {y}, {h}).")
    return (text, f"union({base}, box({w2}, {d2}, {t}, at=({x}, {y}, {h})))", {"u": [w, d, h, "b", w2, d2, t, x, y]},
            w2 * d2 * t / (w * d * h + w2 * d2 * t))


def holes(rng: random.Random, w: int, d: int, n: int) -> list[tuple[int, int, int]]:
    """``n`` non-overlapping holes ``(r, x, y)`` inside a ``w`` x ``d`` plate, 2 mm from its edges."""
    while True:
        out = []
        for _ in range(n):
            r = rng.randint(2, max(2, min(w, d) // 5))
            out.append((r, rng.randint(r + 2, w - r - 2), rng.randint(r + 2, d - r - 2)))
        if all((a[1] - b[1]) ** 2 + (a[2] - b[2]) ** 2 > (a[0] + b[0] + 2) ** 2
               for i, a in enumerate(out) for b in out[i + 1:]):
            return out


def level_3(rng: random.Random) -> tuple[str, str, dict, float]:
    w, d, h = rng.randint(10, 25) * 2, rng.randint(8, 20) * 2, rng.randint(2, 6)
    cut = holes(rng, w, d, rng.randint(1, 2))
    described = " and ".join(f"one of radius {r} mm centred at ({x}, {y})" for r, x, y in cut)
    text = (f"The part is a plate {w} x {d} x {h} mm (x, y, z) with its lowest corner at the origin, with "
            f"{len(cut)} round through hole{'s' if len(cut) > 1 else ''} along z: {described}.")
    cuts = ", ".join(f"cylinder({r}, {h}, at=({x}, {y}, 0))" for r, x, y in cut)
    removed = [math.pi * r * r * h for r, _, _ in cut]
    return (text, f"difference(box({w}, {d}, {h}), {cuts})", {"plate": [w, d, h], "holes": cut},
            min(removed) / (w * d * h - sum(removed)))


def level_4(rng: random.Random) -> tuple[str, str, dict, float]:
    if rng.random() < 0.5:  # a plate with a hole near each corner and a boss on top
        w, d, h = rng.randint(12, 25) * 2, rng.randint(12, 25) * 2, rng.randint(3, 6)
        r, inset = rng.randint(2, 3), rng.randint(5, 7)
        br, bh = rng.randint(3, 8), rng.randint(4, 12)
        text = (f"The part is a plate {w} x {d} x {h} mm (x, y, z) with its lowest corner at the origin. It has four "
                f"round through holes of radius {r} mm, each centred {inset} mm in from the two nearest edges, "
                f"and a cylindrical boss of radius {br} mm and height {bh} mm standing on the top face, centred on "
                f"it.")
        corners = [(inset, inset), (w - inset, inset), (inset, d - inset), (w - inset, d - inset)]
        cuts = ", ".join(f"cylinder({r}, {h}, at=({x}, {y}, 0))" for x, y in corners)
        program = (f"union(difference(box({w}, {d}, {h}), {cuts}), "
                   f"cylinder({br}, {bh}, at=({w // 2}, {d // 2}, {h})))")
        hole, boss = math.pi * r * r * h, math.pi * br * br * bh
        return text, program, {"flange": [w, d, h, r, inset, br, bh]}, min(hole, boss) / (w * d * h - 4 * hole + boss)
    # an L bracket: a base plate and an upright wall along its back edge, a hole in each
    w, d, t = rng.randint(10, 20) * 2, rng.randint(8, 15) * 2, rng.randint(2, 4)
    tall = rng.randint(8, 15) * 2
    r = rng.randint(2, 3)
    text = (f"The part is an L bracket. The base is a plate {w} x {d} x {t} mm (x, y, z) with its lowest corner at "
            f"the origin; the wall is a plate {w} mm along x, {t} mm thick along y and {tall} mm tall, standing on "
            f"the base along its back edge (the edge at y = {d}, the wall's back face flush with it). The base has "
            f"a round hole of radius {r} mm through it at the centre of the part of the base in front of the wall, "
            f"and the wall has a round hole of radius {r} mm through it along y, centred on the wall's part above "
            f"the base.")
    front = (d - t) / 2
    wall_mid = t + (tall - t) / 2
    program = (f"difference(union(box({w}, {d}, {t}), box({w}, {t}, {tall}, at=(0, {d - t}, 0))), "
               f"cylinder({r}, {t}, at=({w / 2:g}, {front:g}, 0)), "
               f"translate(rotate(cylinder({r}, {t}), -90, 0, 0), {w / 2:g}, {d - t}, {wall_mid:g}))")
    hole = math.pi * r * r * t
    return text, program, {"bracket": [w, d, t, tall, r]}, hole / (w * d * t + w * t * (tall - t) - 2 * hole)


def threshold(feature: float) -> float:
    """The IoU bar: an answer missing the smallest feature (a share ``feature`` of the part's
    volume) has IoU about ``1 - feature``, so the bar sits halfway inside it (0.9 to 0.999)."""
    if not feature:  # one primitive: the verifier's bounding-box rule sets the bar
        return THRESHOLD
    return round(min(MAX_THRESHOLD, max(THRESHOLD, 1 - feature / 2)), 4)


LEVELS = {1: level_1, 2: level_2, 3: level_3, 4: level_4}


class CadShapesDomain(Domain):
    name = NAME
    version = "v1"
    levels = (1, 2, 3, 4)
    needs_sandbox = True  # answers are programs, run in the sandbox

    def sample(self, level: int, rng: random.Random) -> Problem:
        text, expression, spec, feature = LEVELS[level](rng)
        program = f"def part():\n    return {expression}\n"
        prompt = (f"Write a Python program that builds this part with the CAD API (box, cylinder, sphere, union, "
                  f"difference, intersection, translate, rotate, polyhedron; millimetres, z up). {text} Define part() "
                  f"returning the solid, in one ```python block.")
        payload = {"program": program, "threshold": threshold(feature), "bbox_tol": BBOX_TOL}
        key = f"L{level}:" + json.dumps(spec, sort_keys=True, separators=(",", ":"))
        return Problem(key=key, prompt=prompt, spec=Spec(kind="cad", payload=payload),
                       reference=f"```python\n{program}```")


DOMAINS.register(NAME)(CadShapesDomain())
