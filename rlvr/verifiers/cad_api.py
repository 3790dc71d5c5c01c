"""The ``cad`` verifier's solid-modelling API and measuring code. Its source runs inside the sandbox
(two io jobs); it is never called in the trainer's process.

What a ``cad.shapes`` answer may call (units are millimetres; z is up)::

    box(w, d, h, at=(x, y, z))        w along x, d along y, h along z; ``at`` is its lowest corner
    cylinder(r, h, at=(x, y, z))      axis along z; ``at`` is the centre of its base
    sphere(r, at=(x, y, z))           ``at`` is its centre
    union(a, b, ...)  difference(a, b, ...)  intersection(a, b, ...)
    translate(solid, x, y, z)
    rotate(solid, x_deg, y_deg, z_deg)  about the origin, x first, then y, then z
    polyhedron(vertices, faces)       a raw mesh: [[x, y, z], ...] and [[i, j, k], ...] (outward,
                                      counter-clockwise); it must be closed to be measured

The answer defines ``part()`` returning one solid. Job 1 runs the answer with this module
prepended and calls ``export``: the part as a mesh in JSON (at most ``MAX_TRIANGLES``), which is
all that leaves the answer's process. Job 2 is trusted code only: ``measure`` rebuilds that mesh,
builds the reference part, and returns volumes, the volume of their intersection and union (exact
mesh booleans by manifold3d), bounding boxes and whether the mesh is a closed manifold.
"""

import json

import manifold3d as _m

SEGMENTS = 48  # facets of a full circle, for cylinders and spheres alike (answer and reference)
MAX_TRIANGLES = 20_000
_m.set_circular_segments(SEGMENTS)
_M = _m.Manifold


def _at(at):
    x, y, z = (float(v) for v in at)
    return [x, y, z]


def box(w, d, h, at=(0, 0, 0)):
    return _M.cube([float(w), float(d), float(h)]).translate(_at(at))


def cylinder(r, h, at=(0, 0, 0)):
    return _M.cylinder(float(h), float(r), float(r), SEGMENTS).translate(_at(at))


def sphere(r, at=(0, 0, 0)):
    return _M.sphere(float(r), SEGMENTS).translate(_at(at))


def union(*solids):
    out = solids[0]
    for s in solids[1:]:
        out = out + s
    return out


def difference(a, *others):
    for s in others:
        a = a - s
    return a


def intersection(*solids):
    out = solids[0]
    for s in solids[1:]:
        out = out ^ s
    return out


def translate(solid, x, y, z):
    return solid.translate([float(x), float(y), float(z)])


def rotate(solid, x_deg, y_deg, z_deg):
    return solid.rotate([float(x_deg), float(y_deg), float(z_deg)])


def polyhedron(vertices, faces):
    """A raw mesh, kept as given (it is measured as it is: open or inconsistent meshes fail)."""
    return ("mesh", [[float(c) for c in v] for v in vertices], [[int(i) for i in f] for f in faces])


def _mesh_of(solid):
    if isinstance(solid, tuple) and len(solid) == 3 and solid[0] == "mesh":
        return solid[1], solid[2]
    if not isinstance(solid, _M):
        raise TypeError(f"part() returned {type(solid).__name__}, not a solid")
    mesh = solid.to_mesh()
    return mesh.vert_properties[:, :3].tolist(), mesh.tri_verts.tolist()


def export():
    """Job 1: the answer's part as JSON ``[vertices, triangles]``."""
    vertices, faces = _mesh_of(part())  # noqa: F821  (the answer defines part)
    if len(faces) > MAX_TRIANGLES:
        raise ValueError(f"the part has {len(faces)} triangles (at most {MAX_TRIANGLES})")
    return json.dumps([vertices, faces])


def _solid(vertices, faces):
    """The mesh as a manifold, or ``(None, why)``."""
    import numpy as np

    if not faces:
        return None, "empty"
    v = np.asarray(vertices, dtype=np.float32)
    f = np.asarray(faces, dtype=np.uint32)
    if v.ndim != 2 or v.shape[1] != 3 or f.ndim != 2 or f.shape[1] != 3 or f.max() >= len(v):
        return None, "bad_mesh"
    solid = _M(_m.Mesh(vert_properties=v, tri_verts=f))
    if solid.status() != _m.Error.NoError:
        return None, "not_watertight"
    if solid.is_empty() or solid.volume() <= 1e-9:
        return None, "empty"
    return solid, ""


def measure(mesh_json, reference_program):
    """Job 2 (trusted): the answer's mesh against the reference part."""
    try:
        vertices, faces = json.loads(mesh_json)
        answer, why = _solid(vertices, faces)
    except Exception:  # noqa: BLE001 - whatever the answer's process exported, it is not a mesh
        answer, why = None, "bad_mesh"
    namespace = {name: value for name, value in globals().items() if not name.startswith("__")}
    try:
        exec(reference_program, namespace)
        reference = namespace["part"]()
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"the reference part: {type(e).__name__}: {e}") from None
    out = {"ref_volume": reference.volume(), "ref_bbox": list(reference.bounding_box())}
    if answer is None:
        return {**out, "problem": why}
    return {**out, "problem": "", "volume": answer.volume(), "bbox": list(answer.bounding_box()),
            "intersection": (answer ^ reference).volume(), "union": (answer + reference).volume()}
