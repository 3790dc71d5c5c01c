"""Typed configuration: dataclasses next to their components, YAML recipes, ``--set`` overrides.

Each component owns one dataclass (fields typed, enumerations as ``Literal``, a one-line
docstring per field). A recipe in ``configs/*.yaml`` only overrides defaults; the dataclass
is the single source of truth. ``load_config`` merges recipe and ``--set a.b=c`` overrides,
then checks every key and type and raises ``ConfigError`` naming the key and what is allowed.
The resolved config (every default written out) is saved into the run directory.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

import yaml

from rlvr.errors import ConfigError

C = TypeVar("C")


def check_choice(key: str, value: Any, allowed: typing.Iterable[Any]) -> None:
    """Raise ConfigError unless ``value`` is one of ``allowed`` (used in ``__post_init__``)."""
    allowed = list(allowed)
    if value not in allowed:
        raise ConfigError(f"config key '{key}' = {value!r} is not allowed; choose one of: {allowed}")


def check_range(key: str, value: float, lo: float | None = None, hi: float | None = None) -> None:
    """Raise ConfigError unless lo <= value <= hi."""
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        lo_s = "-inf" if lo is None else lo
        hi_s = "inf" if hi is None else hi
        raise ConfigError(f"config key '{key}' = {value!r} must be in [{lo_s}, {hi_s}]")


DEVICES = "cpu | cuda | cuda:N | auto"


def check_device(key: str, value: str) -> None:
    """Raise ConfigError unless ``value`` names a device (``DEVICES``); whether it exists here is
    checked when it is used (``resolve_device``), so a GPU recipe validates on a laptop."""
    ok = value in ("cpu", "cuda", "auto") or (
        value.startswith("cuda:") and value[5:].isdigit())
    if not ok:
        raise ConfigError(f"config key '{key}' = {value!r} is not a device; choose one of: {DEVICES}")


def resolve_device(key: str, value: str):
    """The ``torch.device`` for a checked device name: ``auto`` is cuda when torch sees a GPU;
    cuda on a machine without one raises ConfigError naming ``key``."""
    import torch

    check_device(key, value)
    if value == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(value)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"config key '{key}' = {value!r}, but torch sees no CUDA device on this machine "
                              f"(torch {torch.__version__}); use cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"config key '{key}' = {value!r}, but torch sees {torch.cuda.device_count()} "
                              "CUDA device(s)")
    return device


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def coerce(key: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against the annotation ``tp`` and convert where lossless."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce(key, value, option)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"config key '{key}' has a bad value {value!r}")
    if origin is Literal:
        check_choice(key, value, get_args(tp))
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}' must be a mapping of {tp.__name__} fields, got {value!r}")
        return from_dict(tp, value, prefix=key)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}' must be a list, got {type(value).__name__} {value!r}")
        args = get_args(tp)
        item_tp = args[0] if args else Any
        items = [coerce(f"{key}[{i}]", v, item_tp) for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}' must be a mapping, got {value!r}")
        _, vt = get_args(tp) or (Any, Any)
        return {k: coerce(f"{key}.{k}", v, vt) for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-5" as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    elif isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(
        f"config key '{key}' must be {_type_name(tp)}, got {type(value).__name__} {value!r}"
    )


def from_dict(cls: type[C], data: dict[str, Any], prefix: str = "") -> C:
    """Build dataclass ``cls`` from a (nested) dict, refusing unknown keys and wrong types."""
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            raise ConfigError(
                f"unknown config key '{full}'; allowed keys"
                f"{' in ' + repr(prefix) if prefix else ''}: {', '.join(sorted(fields))}"
            )
        f = fields[key]
        if (isinstance(value, dict) and isinstance(hints[key], type)
                and dataclasses.is_dataclass(hints[key]) and f.default_factory is not dataclasses.MISSING):
            # A nested section starts from the *parent's* default for it, not the section's class
            # defaults: `--set grpo.steps=5` on the quickstart keeps the quickstart's GRPO domains.
            value = _merged(to_dict(f.default_factory()), value)
        kwargs[key] = coerce(full, value, hints[key])
    return cls(**kwargs)


def _merged(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in update.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def to_dict(cfg: Any) -> dict[str, Any]:
    """A plain dict of every field, defaults included (tuples become lists)."""
    def plain(x: Any) -> Any:
        if dataclasses.is_dataclass(x):
            return {f.name: plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return x

    return plain(cfg)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"grpo.lr=1e-5"`` -> (["grpo", "lr"], 1e-05). Values are parsed as YAML scalars."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.path=value (e.g. --set grpo.lr=1e-5)")
    path, raw = text.split("=", 1)
    keys = [k for k in path.strip().split(".") if k]
    if not keys:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {text!r}: the value is not valid YAML ({yaml_problem(e)}); quote it, "
                          "e.g. --set 'key=\"...\"'") from None
    return keys, value


def yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error in one line: where (line, column, 1-based) and what."""
    problem = getattr(e, "problem", None) or getattr(e, "context", None) or str(e).splitlines()[0]
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + " ".join(str(problem).split())


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: '{k}' is not a section")
        node[keys[-1]] = value
    return data


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file '{path}' is not valid YAML: {yaml_problem(e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping at the top level")
    return data


def load_config(cls: type[C], path: str | Path | None = None, overrides: list[str] | None = None) -> C:
    """Defaults of ``cls``, then the YAML recipe at ``path``, then ``--set`` overrides."""
    data = read_yaml(path) if path else {}
    data = apply_overrides(data, list(overrides or []))
    return from_dict(cls, data)


def save_config(cfg: Any, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
