"""Rows of a user's data file, each with the place it came from.

``read_rows(path, fmt)`` yields ``Row(where, data)``: ``where`` is ``FILE:LINE`` for JSONL and
CSV (the physical line a record ends on) and ``FILE:row N`` (1-based) for Parquet and Hugging Face
datasets, so every later error can say where the bad value is. Formats:

- ``jsonl``: one JSON object per line; blank lines are skipped.
- ``csv``: a header row, then one record per row (``csv.DictReader``; quoted newlines allowed).
  Every value is a string; empty cells are read as missing.
- ``parquet``: read with pyarrow.
- ``hf``: a Hugging Face ``datasets`` directory: one written by ``save_to_disk`` (read with
  ``load_from_disk``), or a directory of local data files in a dataset repository's layout (read
  with ``load_dataset(dir)``, offline). A ``DatasetDict`` needs ``hf_split`` unless it has one split.

A path may also be a URL of an object store (``s3://bucket/tasks.jsonl``, any fsspec protocol;
``file://`` is a local path): the file is read whole through fsspec, and ``where`` names the URL.

``auto`` picks by suffix (``.jsonl``/``.json``/``.ndjson``, ``.csv``/``.tsv``, ``.parquet``/``.pq``)
or, for a directory, ``hf``. Unreadable files, bytes that are not UTF-8 (with the line), invalid
JSON lines and lines that are not objects are named by file and line (``Row.error`` for a JSONL line,
``UserError`` for the rest); nothing is skipped silently.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.errors import UserError

FORMATS = ("auto", "jsonl", "csv", "parquet", "hf")
_SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "csv",
             ".parquet": "parquet", ".pq": "parquet"}


@dataclass(frozen=True)
class Row:
    """One record: ``where`` it is (``FILE:LINE`` or ``FILE:row N``) and its columns, or, for a
    JSONL line that is not a JSON object, ``error`` (reading goes on to the next line)."""

    where: str
    data: dict[str, Any]
    error: str = ""


def detect_format(path: Path, fmt: str = "auto") -> str:
    if fmt != "auto":
        if fmt not in FORMATS:
            raise UserError(f"{path}: unknown task file format {fmt!r}; choose one of: {', '.join(FORMATS)}")
        return fmt
    if path.is_dir():
        return "hf"
    found = _SUFFIXES.get(path.suffix.lower())
    if found is None:
        raise UserError(f"{path}: cannot tell the format from the suffix {path.suffix!r}; name it .jsonl, "
                        ".csv, .parquet or a datasets directory, or set the format (jsonl | csv | parquet | hf)")
    return found


class Url(str):
    """A file's URL (``s3://bucket/tasks.jsonl``) where a ``Path`` would be: its text, its suffix."""

    @property
    def name(self) -> str:
        return self.rstrip("/").rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        return "." + self.name.rsplit(".", 1)[-1] if "." in self.name else ""

    @property
    def stem(self) -> str:
        return self.name[: len(self.name) - len(self.suffix)] if self.suffix else self.name


def is_url(path: str) -> bool:
    """Whether ``path`` names an object in a store (``s3://...``); ``file://`` is a local path."""
    return "://" in path and not path.startswith("file://")


def read_rows(path: str | Path, fmt: str = "auto", hf_split: str = "") -> Iterator[Row]:
    """The rows of a task file (see the module docstring); ``UserError`` on anything unreadable."""
    if is_url(str(path)) and not isinstance(path, Path):
        yield from _url_rows(Url(path), fmt)
        return
    path = Path(str(path).removeprefix("file://"))
    if not path.exists():
        raise UserError(f"{path}: no such file or directory")
    fmt = detect_format(path, fmt)
    if fmt == "hf":
        yield from _hf_rows(path, hf_split)
        return
    if path.is_dir():
        raise UserError(f"{path}: is a directory, not a {fmt} file")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror or e}") from None
    if fmt == "parquet":
        yield from _parquet_rows(path, raw)
        return
    if fmt == "jsonl":
        yield from _jsonl_rows(path, raw)
    else:
        yield from _csv_rows(path, _decode(path, raw))


def _url_rows(url: Url, fmt: str) -> Iterator[Row]:
    """A file in object storage (any fsspec URL; credentials and endpoint from the environment, e.g.
    ``AWS_ACCESS_KEY_ID`` and ``AWS_ENDPOINT_URL`` for s3://), read whole into memory."""
    import fsspec

    fmt = fmt if fmt != "auto" else _SUFFIXES.get(url.suffix.lower(), "")
    if fmt not in ("jsonl", "csv", "parquet"):
        raise UserError(f"{url}: a URL must name a .jsonl, .csv or .parquet file (or set the format); datasets "
                        "directories are read from local disk")
    try:
        with fsspec.open(str(url), "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise UserError(f"{url}: no such object") from None
    except Exception as e:  # noqa: BLE001  (any client's failure: no endpoint, no credentials, denied)
        raise UserError(f"{url}: cannot read: {(str(e).splitlines() or [type(e).__name__])[0][:200]}") from None
    if fmt == "parquet":
        yield from _parquet_rows(url, raw)
    elif fmt == "jsonl":
        yield from _jsonl_rows(url, raw)
    else:
        yield from _csv_rows(url, _decode(url, raw))


def _decode(path: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise UserError(f"{path}:{line}: not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                        "re-save the file as UTF-8") from None


def _jsonl_rows(path: Path, raw: bytes) -> Iterator[Row]:
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    for lineno, data in enumerate(raw.split(b"\n"), start=1):
        where = f"{path}:{lineno}"
        try:
            line = data.decode("utf-8")
        except UnicodeDecodeError as e:
            yield Row(where, {}, f"not UTF-8 (byte 0x{data[e.start]:02x} at column {e.start + 1}); "
                                 "re-save the file as UTF-8")
            continue
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            yield Row(where, {}, f"invalid JSON: {e}")
            continue
        if not isinstance(obj, dict):
            yield Row(where, {}, f"expected a JSON object, got {type(obj).__name__}")
            continue
        yield Row(where, obj)


def _csv_rows(path: Path, text: str) -> Iterator[Row]:
    dialect = "excel-tab" if path.suffix.lower() == ".tsv" else "excel"
    reader = csv.DictReader(io.StringIO(text, newline=""), dialect=dialect)
    try:
        header = reader.fieldnames
        if not header:
            raise UserError(f"{path}:1: the CSV file has no header row")
        if len(set(header)) != len(header):
            dup = next(h for h in header if header.count(h) > 1)
            raise UserError(f"{path}:1: column {dup!r} appears twice in the header")
        for record in reader:
            where = f"{path}:{reader.line_num}"
            if None in record:  # more cells than header columns
                raise UserError(f"{where}: the row has {len(header) + len(record[None])} cells, "
                                f"the header {len(header)}")
            data = {k: v for k, v in record.items() if v not in (None, "")}
            if data:
                yield Row(where, data)
    except csv.Error as e:
        raise UserError(f"{path}:{reader.line_num}: not valid CSV: {e}") from None


def _parquet_rows(path: Path, raw: bytes) -> Iterator[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(pa.BufferReader(raw))
    except (pa.ArrowException, OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable Parquet file: {str(e).splitlines()[0][:200]}") from None
    for i, record in enumerate(table.to_pylist(), start=1):
        yield Row(f"{path}:row {i}", {k: v for k, v in record.items() if v is not None})


def _hf_rows(path: Path, hf_split: str) -> Iterator[Row]:
    import datasets

    datasets.disable_progress_bars()
    saved = (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file() \
        or (path / "state.json").is_file()
    try:
        data = datasets.load_from_disk(str(path)) if saved else datasets.load_dataset(str(path))
    except Exception as e:  # datasets raises many types (FileNotFoundError, DatasetGenerationError, ...)
        raise UserError(f"{path}: not a readable Hugging Face datasets directory: "
                        f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}") from None
    if isinstance(data, datasets.DatasetDict):
        splits = list(data)
        if not hf_split and len(splits) == 1:
            hf_split = splits[0]
        if hf_split not in data:
            raise UserError(f"{path}: the dataset has splits {splits}; choose one with hf_split "
                            f"(got {hf_split!r})")
        data = data[hf_split]
    for i, record in enumerate(data, start=1):
        yield Row(f"{path}:row {i}", {k: v for k, v in record.items() if v is not None})
