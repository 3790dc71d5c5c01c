"""``render.svg``: write an SVG that draws a described scene; checked by rendering it.

The canvas is ``viewBox="0 0 100 100"`` on white. Shapes are rectangles, circles and triangles in
``COLORS`` (CSS names the model may also write as hex), at integer coordinates:

    L1  one shape, its geometry stated                 "a red circle centred at (30, 40), radius 15"
    L2  two or three shapes that do not overlap        each stated
    L3  two or three shapes that overlap, the order    "... The blue rectangle is drawn on top."
        stated (the later one covers the earlier)
    L4  a composed scene placed relative to a base     "a house: a brown square ...; a red roof whose
        shape: the model computes the coordinates      base is the square's top edge and whose apex
                                                       is 20 above it; a yellow sun ..."

The ``svg`` verifier renders the answer and the reference in the sandbox and scores the overlap of
every colour's pixels (``rlvr.verifiers.svg``). The reference is a minimal SVG, shapes in drawing
order. The key is the scene (shapes, colours, order): the wording is decoration.

Not here: rendering and scoring (``rlvr.verifiers.svg``).
"""

from __future__ import annotations

import json
import random

from rlvr.tasks.base import DOMAINS, Domain, Problem
from rlvr.types import Spec
from rlvr.verifiers.svg import SVG_NS

NAME = "render.svg"
SIZE = 100
VIEWBOX = f"0 0 {SIZE} {SIZE}"
COLORS = {"red": "#ff0000", "green": "#008000", "blue": "#0000ff", "yellow": "#ffff00", "orange": "#ffa500",
          "purple": "#800080", "brown": "#a52a2a", "black": "#000000", "gray": "#808080"}
THRESHOLD = 0.9

Shape = dict  # {"kind": "rect"|"circle"|"triangle", "color": name, geometry...}


def bbox(shape: Shape) -> tuple[int, int, int, int]:
    if shape["kind"] == "rect":
        return shape["x"], shape["y"], shape["x"] + shape["w"], shape["y"] + shape["h"]
    if shape["kind"] == "circle":
        return shape["cx"] - shape["r"], shape["cy"] - shape["r"], shape["cx"] + shape["r"], shape["cy"] + shape["r"]
    xs, ys = [p[0] for p in shape["points"]], [p[1] for p in shape["points"]]
    return min(xs), min(ys), max(xs), max(ys)


def overlaps(a: Shape, b: Shape, gap: int = 2) -> bool:
    ax0, ay0, ax1, ay1 = bbox(a)
    bx0, by0, bx1, by1 = bbox(b)
    return not (ax1 + gap <= bx0 or bx1 + gap <= ax0 or ay1 + gap <= by0 or by1 + gap <= ay0)


def element(shape: Shape) -> str:
    fill = COLORS[shape["color"]]
    if shape["kind"] == "rect":
        return f'<rect x="{shape["x"]}" y="{shape["y"]}" width="{shape["w"]}" height="{shape["h"]}" fill="{fill}"/>'
    if shape["kind"] == "circle":
        return f'<circle cx="{shape["cx"]}" cy="{shape["cy"]}" r="{shape["r"]}" fill="{fill}"/>'
    points = " ".join(f"{x},{y}" for x, y in shape["points"])
    return f'<polygon points="{points}" fill="{fill}"/>'


def describe(shape: Shape) -> str:
    c = shape["color"]
    if shape["kind"] == "rect":
        return (f"a {c} rectangle {shape['w']} wide and {shape['h']} tall with its top-left corner at "
                f"({shape['x']}, {shape['y']})")
    if shape["kind"] == "circle":
        return f"a {c} circle centred at ({shape['cx']}, {shape['cy']}) with radius {shape['r']}"
    corners = ", ".join(f"({x}, {y})" for x, y in shape["points"])
    return f"a {c} triangle with corners {corners}"


def random_shape(rng: random.Random, color: str, small: bool) -> Shape:
    kind = rng.choice(("rect", "circle", "triangle"))
    span = (8, 22) if small else (12, 36)
    if kind == "rect":
        w, h = rng.randint(*span), rng.randint(*span)
        return {"kind": kind, "color": color, "x": rng.randint(2, SIZE - 2 - w), "y": rng.randint(2, SIZE - 2 - h),
                "w": w, "h": h}
    if kind == "circle":
        r = rng.randint(span[0] // 2 + 2, span[1] // 2)
        return {"kind": kind, "color": color, "cx": rng.randint(r + 2, SIZE - 2 - r), "cy": rng.randint(r + 2, SIZE - 2 - r),
                "r": r}
    w, h = rng.randint(*span), rng.randint(*span)
    x, y = rng.randint(2, SIZE - 2 - w), rng.randint(2, SIZE - 2 - h)
    return {"kind": kind, "color": color, "points": [[x, y + h], [x + w, y + h], [x + w // 2, y]]}


def scene(level: int, rng: random.Random) -> tuple[list[Shape], str]:
    """``(shapes in drawing order, description)``."""
    if level == 4:
        return house(rng)
    n = 1 if level == 1 else rng.randint(2, 3)
    colors = rng.sample(sorted(COLORS), n)
    while True:
        shapes = [random_shape(rng, c, small=n > 1) for c in colors]
        pairs = [(a, b) for i, a in enumerate(shapes) for b in shapes[i + 1:]]
        if level <= 2 and not any(overlaps(a, b) for a, b in pairs):
            break
        if level == 3 and all(overlaps(a, b, gap=-4) for a, b in zip(shapes, shapes[1:])):
            break
    text = "; ".join(describe(s) for s in shapes)
    if level == 3:
        order = ", then ".join(f"the {s['color']} {kind_word(s)}" for s in shapes)
        text += f". Draw them in this order, each later one on top: {order}"
    return shapes, text


def kind_word(shape: Shape) -> str:
    return {"rect": "rectangle", "circle": "circle", "triangle": "triangle"}[shape["kind"]]


def house(rng: random.Random) -> tuple[list[Shape], str]:
    """A square body, a triangular roof on its top edge, a door, and a sun: coordinates to derive."""
    body, roof, door, sun = rng.sample(sorted(COLORS), 4)
    s, r = rng.randint(20, 36), rng.randint(6, 10)
    x, y = rng.randint(4, SIZE - s - 2 * r - 8), rng.randint(35, SIZE - 4 - s)
    rise = rng.randint(10, min(20, y - 8))
    dw, dh = rng.randint(6, s // 3), rng.randint(s // 3, s // 2)
    sx, sy = rng.randint(x + s + r + 4, SIZE - r - 2), rng.randint(r + 2, 24)
    shapes = [
        {"kind": "rect", "color": body, "x": x, "y": y, "w": s, "h": s},
        {"kind": "triangle", "color": roof, "points": [[x, y], [x + s, y], [x + s // 2, y - rise]]},
        {"kind": "rect", "color": door, "x": x + (s - dw) // 2, "y": y + s - dh, "w": dw, "h": dh},
        {"kind": "circle", "color": sun, "cx": sx, "cy": sy, "r": r},
    ]
    text = (f"a house and a sun. The house is a {body} square of side {s} with its top-left corner at ({x}, {y}); "
            f"on it a {roof} triangular roof whose base is the square's top edge and whose apex is {rise} above "
            f"the middle of that edge; a {door} door, a rectangle {dw} wide and {dh} tall, standing on the "
            f"square's bottom edge, centred on it (left edge at x = {x} + ({s} - {dw}) // 2). The sun is a {sun} "
            f"circle of radius {r} centred at ({sx}, {sy}). Draw the body, then the roof, the door and the sun")
    return shapes, text


def to_svg(shapes: list[Shape]) -> str:
    return f'<svg xmlns="{SVG_NS}" viewBox="{VIEWBOX}">' + "".join(element(s) for s in shapes) + "</svg>"


class RenderSvgDomain(Domain):
    name = NAME
    version = "v1"
    levels = (1, 2, 3, 4)
    needs_sandbox = True  # the verifier renders model output in the sandbox

    def sample(self, level: int, rng: random.Random) -> Problem:
        shapes, text = scene(level, rng)
        svg = to_svg(shapes)
        prompt = (f"Write an SVG image on a {SIZE} by {SIZE} canvas with a white background "
                  f'(<svg xmlns="{SVG_NS}" viewBox="{VIEWBOX}">). Draw {text}. Use the CSS colour names '
                  f"or their hex codes. Answer with the SVG element only.")
        payload = {"svg": svg, "viewbox": VIEWBOX, "size": SIZE, "colors": sorted({COLORS[s["color"]] for s in shapes}),
                   "threshold": THRESHOLD}
        key = f"L{level}:" + json.dumps(shapes, sort_keys=True, separators=(",", ":"))
        return Problem(key=key, prompt=prompt, spec=Spec(kind="svg", payload=payload), reference=svg)


DOMAINS.register(NAME)(RenderSvgDomain())
