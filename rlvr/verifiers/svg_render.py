"""The ``svg`` verifier's renderer. Its source runs inside the sandbox as an io job (entry point
``render``); it is never called in the trainer's process.

resvg (the ``resvg-py`` binding of the Rust renderer) draws the SVG onto a white ``size`` x ``size``
canvas; Pillow decodes the PNG; the raw RGB bytes come back base64-encoded. resvg has no
scripting, no network and refuses entity loops and node floods itself; the sandbox bounds its time
and memory and hides the host's files. System fonts are skipped (text draws nothing): loading them
costs more than the render.
"""

import base64
import io


def render(svg, size):
    import resvg_py
    from PIL import Image

    png = resvg_py.svg_to_bytes(svg_string=svg, width=size, height=size, background="white",
                                skip_system_fonts=True)
    image = Image.open(io.BytesIO(png)).convert("RGB")
    if image.size != (size, size):
        raise ValueError(f"rendered {image.size}, not {size}x{size}")
    return base64.b64encode(image.tobytes()).decode()
