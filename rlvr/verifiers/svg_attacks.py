"""Hostile SVGs: what a policy (or a user's file) could hand the ``svg`` verifier to reach outside
the renderer or exhaust it. The tests check each fails cleanly, on the text and when rendered
anyway in the sandbox; ``benchmarks/render_svg.py`` measures the worst case."""

from __future__ import annotations

from rlvr.verifiers.svg import SVG_NS

HEAD = f'<svg xmlns="{SVG_NS}" viewBox="0 0 100 100">'


def svg(body: str, head: str = HEAD) -> str:
    return f"{head}{body}</svg>"


def hostile_svgs(host_file: str = "/etc/hostname") -> dict[str, str]:
    """Name -> SVG. ``host_file``: a picture on the host an ``<image>`` tries to read."""
    laughs = "".join(f'<!ENTITY l{i} "{"&l%d;" % (i - 1) * 10 if i else "lol"}">' for i in range(10))
    return {
        "image from a host file": svg(f'<image href="{host_file}" width="100" height="100"/>'),
        "image by xlink from a URL": svg('<image xmlns:xlink="http://www.w3.org/1999/xlink" '
                                         'xlink:href="http://127.0.0.1:9/x.png" width="100" height="100"/>'),
        "use of an external file": svg('<use href="file:///etc/passwd#x"/>'),
        "fill from a URL": svg('<rect width="100" height="100" fill="url(http://127.0.0.1:9/p.svg#g)"/>'),
        "style importing a URL": svg('<rect width="9" height="9" style="fill:blue;@import url(http://x/)"/>'),
        "entity expansion": f'<?xml version="1.0"?><!DOCTYPE svg [{laughs}]>' + svg("<desc>&l9;</desc>"),
        "external entity": '<!DOCTYPE svg [<!ENTITY x SYSTEM "file:///etc/passwd">]>' + svg("<desc>&x;</desc>"),
        "script": svg("<script>while(1){}</script>"),
        "event attribute": svg('<rect width="9" height="9" onload="alert(1)"/>'),
        "foreign object": svg('<foreignObject width="9" height="9"><p xmlns="http://www.w3.org/1999/xhtml">x</p>'
                              "</foreignObject>"),
        "enormous canvas": svg('<rect width="10" height="10"/>', f'<svg xmlns="{SVG_NS}" width="1000000000" '
                                                                 f'height="1000000000" viewBox="0 0 100 100">'),
        "zero canvas": svg('<rect width="10" height="10"/>', f'<svg xmlns="{SVG_NS}" viewBox="0 0 0 0">'),
        "deeply nested groups": svg("<g>" * 3000 + '<rect width="9" height="9"/>' + "</g>" * 3000),
        "thousands of elements": svg('<rect width="1" height="1"/>' * 1500),
        "nesting within the size cap": svg("<g>" * 40 + '<rect width="9" height="9"/>' + "</g>" * 40),
        "elements within the size cap": svg("<g/>" * 400),
        "huge file": svg("<desc>" + "x" * 20_000_000 + "</desc>"),
        "huge path": svg('<path d="M0 0' + " L1 1" * 4000 + '"/>'),
        "blur over a huge region": svg('<filter id="f"><feGaussianBlur stdDeviation="1000000"/></filter>'
                                       '<rect width="100" height="100" filter="url(#f)"/>'),
        "not svg": '<svg viewBox="0 0 100 100"><rect width="9" height="9"/></svg>',
    }
