"""Evaluation suites: every built-in suite builds its tasks, fingerprints identify a task set,
suite YAML files are checked key by key, ``rlvr eval --suite`` records the suite, and the radar
chart is a real PNG for any number of domains."""

from __future__ import annotations

import dataclasses
import json

import pytest
from matplotlib.image import imread

import rlvr.tasks  # noqa: F401  (registers the built-in domains)
from rlvr.cli import main
from rlvr.errors import ConfigError, UserError
from rlvr.eval.evaluate import EvalConfig
from rlvr.eval.plots import radar
from rlvr.eval.suites import (
    SUITES,
    Suite,
    fingerprint,
    get_suite,
    load_suite_file,
    report_fingerprint,
    tasks_of,
)
from rlvr.tasks.base import DOMAINS


def test_the_default_suite_is_what_rlvr_eval_ran_before():
    cfg, suite = EvalConfig(), SUITES.get("default")
    assert suite.eval_fields() == {"domains": cfg.domains, "tasks": cfg.tasks, "levels": cfg.levels,
                                   "seed": cfg.seed, "task_files": cfg.task_files}


def test_the_all_suite_takes_every_builtin_domain_registered():
    builtin = [n for n in DOMAINS.names() if not n.startswith("rg.")]
    assert SUITES.get("all").resolved_domains() == builtin
    with DOMAINS.temporary("zz.extra", DOMAINS.get("math.arith")):
        assert "zz.extra" in SUITES.get("all").resolved_domains()


def test_fingerprint_is_of_the_set_of_ids_and_keys():
    tasks = tasks_of(dataclasses.replace(SUITES.get("default"), tasks=6))
    assert fingerprint(tasks) == fingerprint(list(reversed(tasks)))
    assert fingerprint(tasks[:-1]) != fingerprint(tasks)
    renamed = [dataclasses.replace(tasks[0], key=tasks[0].key + " "), *tasks[1:]]
    assert fingerprint(renamed) != fingerprint(tasks)
    items = [{"id": t.id, "task": t.to_dict()} for t in tasks]
    assert report_fingerprint({"tasks": items}) == fingerprint(tasks)  # reports written before fingerprints
    assert report_fingerprint({"fingerprint": "x", "tasks": items}) == "x"
    assert report_fingerprint({}) is None


def write_suite(tmp_path, text: str):
    path = tmp_path / "suite.yaml"
    path.write_text(text)
    return path


def test_a_suite_file_with_domains_and_a_relative_task_file(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "qa.csv").write_text("question,answer\nWhat is 2 + 3?,5\nWhat is 4 + 4?,8\n")
    path = write_suite(tmp_path, "name: mine\nversion: '2'\ndomains: [math.arith]\ntasks: 4\nlevels: [1, 2]\n"
                                 "seed: 7\ntask_files:\n  - {path: data/qa.csv, map: {prompt: question}, "
                                 "verifier: number}\n")
    suite = get_suite(str(path))
    assert (suite.name, suite.version, suite.seed, suite.source) == ("mine", "2", 7, str(path))
    tasks = tasks_of(suite)
    assert len(tasks) == 6 and {t.domain for t in tasks} == {"math.arith", "file.number"}
    assert suite.record() == {"name": "mine", "version": "2", "source": str(path)}


@pytest.mark.parametrize("text, message", [
    ("name: x\nversion: v1\ndomains: [math.arith]\ntasks: 4\ncount: 3\n", "key 'count' is unknown"),
    ("name: x\ndomains: [math.arith]\ntasks: 4\n", "key 'version' is missing"),
    ("name: x\nversion: v1\ndomains: [math.arith]\ntasks: many\n", "key 'tasks' must be a int"),
    ("name: x\nversion: v1\ndomains: math.arith\ntasks: 4\n", "key 'domains' must be a list"),
    ("name: x\nversion: v1\ndomains: [math.nope]\ntasks: 4\n", "key 'domains\\[0\\]' names no domain"),
    ("name: x\nversion: v1\ndomains: [math.arith]\n", "key 'tasks' is missing"),
    ("name: x\nversion: v1\ndomains: [math.arith]\ntasks: 0\n", "key 'tasks' must be >= 1"),
    ("name: x\nversion: v1\ndomains: [math.arith]\ntasks: 4\nlevels: [0]\n", "key 'levels\\[0\\]' must be a level"),
    ("name: math\nversion: v1\ndomains: [math.arith]\ntasks: 4\n", "key 'name' 'math' is a built-in suite"),
    ("name: x\nversion: v1\ntask_files: [nowhere.csv]\n", "key 'task_files\\[0\\]' names no file"),
    ("name: x\nversion: v1\ntask_files: [{path: a.csv, colour: red}]\n", "task_files\\[0\\].colour"),
    ("name: x\nversion: v1\n", "'domains' and 'task_files' are both empty"),
    ("- just a list\n", "must hold a mapping"),
])
def test_suite_file_errors_name_the_key(tmp_path, text, message):
    (tmp_path / "a.csv").write_text("question,answer\nq,1\n")
    with pytest.raises(ConfigError, match=message):
        load_suite_file(write_suite(tmp_path, text))


def test_an_unknown_suite_name_lists_the_choices():
    with pytest.raises(UserError, match="unknown eval suite 'nope'; choose one of: agentic, all, code"):
        get_suite("nope")


def test_rlvr_eval_suites_lists_them(tmp_path, capsys):
    assert main(["eval", "suites"]) == 0
    out = capsys.readouterr().out
    for name in SUITES.names():
        assert f"\n{name} v" in "\n" + out
    path = write_suite(tmp_path, "name: mine\nversion: v3\ndomains: ['*']\ntasks: 10\n")
    assert main(["eval", "suites", str(path)]) == 0
    assert capsys.readouterr().out.startswith("mine v3: 10 tasks, levels [1, 2, 3, 4], seed 1234; domains * = ")
    assert main(["eval", "--suite", "nope", "--model", "m"]) == 2
    assert "unknown eval suite 'nope'" in capsys.readouterr().err


def test_rlvr_eval_records_the_suite_and_draws_the_radar(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "runs" / "eval.json"
    assert main(["eval", "--model", tiny_model_dir, "--suite", "math", "--set", "tasks=6",
                 "--set", "levels=[1]", "--set", "max_new_tokens=4", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["suite"] == {"name": "math", "version": "v1", "source": "builtin", "modified": ["levels", "tasks"],
                               "domains": ["math.arith", "math.word"]}
    suite = dataclasses.replace(SUITES.get("math"), tasks=6, levels=(1,))
    assert report["fingerprint"] == fingerprint(tasks_of(suite)) == report_fingerprint({"tasks": report["tasks"]})
    assert report["settings"]["max_new_tokens"] == 4 and report["overall"]["n_tasks"] == 6
    radar_png = tmp_path / "runs" / "eval_radar.png"  # beside --out, by default
    assert radar_png.is_file() and radar_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert imread(radar_png).ndim == 3
    assert f"wrote {radar_png}" in capsys.readouterr().out

    out2 = tmp_path / "plain.json"
    assert main(["eval", "--model", tiny_model_dir, "--set", "tasks=2", "--set", "max_new_tokens=2",
                 "--no-radar", "--out", str(out2)]) == 0
    assert json.loads(out2.read_text())["suite"] == {"name": "default", "version": "v1", "source": "builtin",
                                                     "modified": ["tasks"], "domains": ["math.arith", "math.word"]}
    assert not (tmp_path / "plain_radar.png").exists()


@pytest.mark.parametrize("domains", [1, 2, 3, 7])
def test_radar_is_a_png_for_any_number_of_domains(tmp_path, domains):
    now = {f"d{i}": i / 10 for i in range(domains)}
    base = {f"d{i}": 0.5 for i in range(domains)}
    path = radar({"now": now, "baseline": base}, tmp_path / "sub" / "r.png")
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_a_suite_is_a_frozen_record():
    suite = Suite("x", "v1", ("math.arith",), tasks=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        suite.tasks = 4  # type: ignore[misc]


def test_the_quickstart_suite_is_the_quickstarts_held_out_set():
    from rlvr.tasks.base import generate_tasks
    from rlvr.train.quickstart import QuickstartConfig

    e = QuickstartConfig().eval
    quickstart = generate_tasks(e.domains, "eval", e.tasks, seed=e.seed, levels=e.levels)
    assert fingerprint(quickstart) == fingerprint(tasks_of(SUITES.get("quickstart")))


def test_rlvr_eval_runs_a_suite_file(tiny_model_dir, tmp_path):
    (tmp_path / "qa.csv").write_text("question,answer\nWhat is 2 + 3?,5\nWhat is 4 + 4?,8\n")
    path = write_suite(tmp_path, "name: mine\nversion: v2\ndomains: [math.arith]\ntasks: 2\nlevels: [1]\n"
                                 "task_files: [{path: qa.csv, map: {prompt: question}, verifier: number}]\n")
    out = tmp_path / "eval.json"
    assert main(["eval", "--model", tiny_model_dir, "--suite", str(path), "--set", "max_new_tokens=2",
                 "--no-radar", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["suite"] == {"name": "mine", "version": "v2", "source": str(path), "domains": ["math.arith"]}
    assert report["overall"]["n_tasks"] == 4 and set(report["by_domain"]) == {"math.arith", "file.number"}
    assert report["fingerprint"] == fingerprint(tasks_of(get_suite(str(path))))
