"""The data flywheel end to end on a tiny model: serve with capture -> users ask and judge ->
``rlvr flywheel cycle`` harvests, trains, gates and pushes -> the served model answers the users'
own held-out questions better; then a cycle on sabotaged feedback, refused by the gate.

The users' questions: "How many legs does Zor have? Zor is a bird." (bird 2, dog 4, ant 6, spider
8; names drawn at random, the held-out names disjoint from the asked ones). The served prior is a
tiny Llama (hidden 64) fitted for a few seconds on 16 questions to answer with the right count 2
times in 7 and one fixed wrong count 3 times in 7 (``PRIOR_MIX``): sampled, it is right now and
then; greedy, it is wrong. The users ask at temperature 1, and their hidden checker rates a right
answer up and corrects a wrong one. The sabotaged round re-labels every response with the wrong
count (a compromised labeller), so the second candidate learns wrong answers.

    python benchmarks/flywheel.py [--questions 96] [--heldout 48] [--steps 60] [--lr 1e-3] [--json PATH]

``tests/test_flywheel_e2e.py`` runs the same scenario, smaller.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

LEGS = {"bird": 2, "dog": 4, "ant": 6, "spider": 8}
WRONG = {"bird": 8, "dog": 2, "ant": 4, "spider": 6}
"""The sabotaged labeller's answers: a fixed wrong count per animal."""
HIDDEN = 64
ADMIN, FEEDBACK = "flywheel-admin", "flywheel-feedback"
_CLASS = re.compile(r"is an? (\w+)\.$")


def names(n: int, seed: int, exclude: set[str] = frozenset()) -> list[str]:
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        name = rng.choice("BCDFGKLMNPRSTVZ") + rng.choice("aeiou") + rng.choice("bdgklmnprstvz")
        if name not in exclude and name not in out:
            out.append(name)
    return out


def question(name: str, animal: str) -> str:
    return f"How many legs does {name} have? {name} is {'an' if animal[0] in 'aeiou' else 'a'} {animal}."


def questions(n: int, seed: int, exclude: set[str] = frozenset()) -> list[tuple[str, str]]:
    """``n`` (question, animal) pairs, animals in turn, names unique and not in ``exclude``."""
    animals = list(LEGS)
    return [(question(name, animals[i % 4]), animals[i % 4]) for i, name in enumerate(names(n, seed, exclude))]


def checker(prompt: str) -> str | None:
    """The users' hidden truth (also usable as a criteria ``checker``): the leg count, or None."""
    m = _CLASS.search(prompt)
    return f"Answer: {LEGS[m.group(1)]}" if m and m.group(1) in LEGS else None


def said(text: str) -> str | None:
    m = re.search(r"Answer:\s*(\d+)", text)
    return m.group(1) if m else None


PRIOR_MIX = {"right": 2, "wrong": 3}
"""The prior's answers per question, in copies: the right count 2, the labeller's wrong count 3, the
other two 1 each: sampled, it is right 2 times in 7; greedy, it says the wrong count."""


def fit_prior(src: str, dst: Path, prompts: list[tuple[str, str]], steps: int = 150) -> None:
    """The tiny model at ``src`` fitted to answer each (question, animal) with ``PRIOR_MIX``."""
    import torch

    from rlvr.model.checkpoint import save_model_dir
    from rlvr.model.load import load_model_and_tokenizer
    from rlvr.model.tokenizer import encode_chat_prompt, encode_completion

    model, tok = load_model_and_tokenizer(src)
    rows = []
    for p, animal in prompts:
        prompt = encode_chat_prompt(tok, [{"role": "user", "content": p}])
        for other, legs in LEGS.items():
            copies = PRIOR_MIX["right"] if other == animal else PRIOR_MIX["wrong"] if legs == WRONG[animal] else 1
            rows += [(prompt + encode_completion(tok, f"Answer: {legs}"), len(prompt))] * copies
    width = max(len(ids) for ids, _ in rows)
    pad = tok.pad_token_id
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows])
    labels = input_ids.clone()
    for i, (ids, n_prompt) in enumerate(rows):
        labels[i, :n_prompt] = -100
        labels[i, len(ids):] = -100
    attention = (labels != -100) | (torch.arange(width)[None, :] < torch.tensor([n for _, n in rows])[:, None])
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=input_ids, attention_mask=attention.long(), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_model_dir(dst, model.eval(), tok)


def write_eval_file(path: Path, pairs: list[tuple[str, str]]) -> None:
    """The users' held-out questions as a task file (the acceptance suite)."""
    path.write_text("".join(json.dumps({"id": f"heldout-{i}", "prompt": q, "answer": str(LEGS[a]),
                                        "domain": "users.heldout"}) + "\n" for i, (q, a) in enumerate(pairs)))


EVAL_ENTRY = {"verifier": "number", "instruction": ""}
"""How the flywheel reads the held-out file (a ``task_files`` entry's keys besides ``path``)."""
LR = 1e-3
CRITERIA = "verifier: number\noptions: {answer_at: final}\ndomain: legs\n"


# -- the server and its users ------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, token: str = "") -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={
        "Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def start_server(model_dir: str, capture: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RLVR_ADMIN_TOKEN": ADMIN, "RLVR_FEEDBACK_TOKEN": FEEDBACK,
           "OMP_NUM_THREADS": "1"}
    rlvr = str(Path(sys.executable).parent / "rlvr")
    proc = subprocess.Popen([rlvr, "serve", "--model", model_dir, "--port", str(port), "--model-name", "legs",
                             "--device", "cpu", "--capture", str(capture)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    end = time.monotonic() + 120
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stdout.read()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise TimeoutError("the server did not become ready")


def ask(url: str, prompt: str, temperature: float = 0.0, seed: int | None = None) -> tuple[str, str]:
    """(response id, text) of one chat request."""
    status, body = post(url + "/v1/chat/completions", {
        "model": "legs", "messages": [{"role": "user", "content": prompt}], "temperature": temperature,
        "max_tokens": 12, **({"seed": seed} if seed is not None else {})})
    assert status == 200, body
    return body["id"], body["choices"][0]["message"]["content"]


def users(url: str, pairs: list[tuple[str, str]], labels: dict[str, int], *, seed: int = 0) -> list[str]:
    """Users ask each question (sampled, as a chat app does) and judge the answer with ``labels``:
    up when it says the labelled count, else a correction. The response ids."""
    ids = []
    for i, (q, animal) in enumerate(pairs):
        rid, text = ask(url, q, temperature=1.0, seed=seed * 100_000 + i)
        judge(url, rid, text, labels[animal])
        ids.append(rid)
    return ids


def judge(url: str, rid: str, text: str, legs: int) -> None:
    right = said(text) == str(legs)
    body = {"id": rid, "rating": "up"} if right else {"id": rid, "rating": "down", "correction": f"Answer: {legs}"}
    status, answer = post(url + "/v1/feedback", body, FEEDBACK)
    assert status == 200, answer


def accuracy(url: str, pairs: list[tuple[str, str]]) -> float:
    """Greedy accuracy of the served model on ``pairs`` (the users' own check)."""
    return sum(said(ask(url, q)[1]) == str(LEGS[a]) for q, a in pairs) / len(pairs)


def flywheel_yaml(path: Path, *, root: Path, port: int, heldout: Path, steps: int, regression_tasks: int,
                  lr: float = LR) -> Path:
    data = {"server": f"http://127.0.0.1:{port}", "traffic": str(root / "traffic"), "criteria": str(root / "criteria.yaml"),
            "dir": str(root / "flywheel"), "admin_token": ADMIN, "eval_files": [{"path": str(heldout), **EVAL_ENTRY}],
            "regression_suite": "default", "regression_tasks": regression_tasks, "min_tasks": 8,
            "gate": {"margin": 5.0, "tolerance": 2.0},
            "train": {"steps": steps, "checkpoint_every": 5, "save_trajectories_every": 1000,
                      "rollout": {"tasks_per_step": 8, "samples_per_task": 8, "max_new_tokens": 8},
                      "optim": {"lr": lr, "warmup_steps": 2}},
            "eval": {"max_new_tokens": 8}}
    import yaml

    path.write_text(yaml.safe_dump(data))
    (root / "criteria.yaml").write_text(CRITERIA)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=96, help="questions the users ask in each round")
    ap.add_argument("--heldout", type=int, default=48, help="the users' held-out questions")
    ap.add_argument("--steps", type=int, default=60, help="GRPO steps per cycle")
    ap.add_argument("--lr", type=float, default=LR, help="GRPO learning rate")
    ap.add_argument("--out", default="runs/bench_flywheel")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = run_scenario(Path(args.out), n_questions=args.questions, n_heldout=args.heldout, steps=args.steps,
                          lr=args.lr)
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if result["cycle1"]["pushed"] and not result["cycle2"]["pushed"] else 1


def tiny_base(root: Path) -> str:
    """The tests' tiny Llama (``tests/conftest.py``): a math-corpus tokenizer, a random model."""
    import rlvr.tasks  # noqa: F401
    from rlvr.model.checkpoint import save_model_dir
    from rlvr.model.tiny import TinyModelConfig, build_tiny_model
    from rlvr.model.tokenizer import train_tokenizer
    from rlvr.tasks.base import DOMAINS

    docs = DOMAINS.get("math.arith").corpus(0, 200) + DOMAINS.get("math.word").corpus(0, 200)
    tokenizer = train_tokenizer(docs, vocab_size=320)
    cfg = TinyModelConfig(hidden_size=HIDDEN, num_layers=2, num_heads=4, num_kv_heads=4, intermediate_size=2 * HIDDEN)
    save_model_dir(root / "base", build_tiny_model(cfg, tokenizer, seed=0), tokenizer)
    return str(root / "base")


def run_scenario(root: Path, *, n_questions: int, n_heldout: int, steps: int, regression_tasks: int = 100,
                 lr: float = LR, base: str | None = None) -> dict:
    """The whole scenario in ``root``; the numbers."""
    root.mkdir(parents=True, exist_ok=True)
    asked = questions(n_questions, seed=1)
    held = questions(n_heldout, seed=2, exclude=set(names(n_questions, seed=1)))
    fit_prior(base or tiny_base(root), root / "prior", asked[:16])
    heldout = root / "heldout.jsonl"
    write_eval_file(heldout, held)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = flywheel_yaml(root / "flywheel.yaml", root=root, port=port, heldout=heldout, steps=steps,
                           regression_tasks=regression_tasks, lr=lr)
    server = start_server(str(root / "prior"), root / "traffic", port)
    try:
        before = accuracy(url, held)
        users(url, asked, LEGS, seed=1)
        t0 = time.monotonic()
        code1 = rlvr(["flywheel", "cycle", "-c", str(config)])
        cycle1_s = time.monotonic() - t0
        after = accuracy(url, held)
        # a compromised labeller re-labels every response: the newest judgement wins in the harvest
        users(url, asked, WRONG, seed=2)
        for record in _responses(root / "traffic"):
            judge(url, record["id"], record["choices"][0]["text"], WRONG[_animal(record)])
        served_before = _models(url)
        code2 = rlvr(["flywheel", "cycle", "-c", str(config)])
        after_sabotage = accuracy(url, held)
        served_after = _models(url)
    finally:
        server.terminate()
        server.wait(timeout=30)
    history = [json.loads(line) for line in (root / "flywheel" / "history.jsonl").read_text().splitlines()]
    return {
        "heldout_questions": len(held), "asked_per_round": len(asked), "grpo_steps": steps, "lr": lr,
        "served_accuracy": {"before": before, "after_cycle1": after, "after_sabotaged_cycle2": after_sabotage},
        "cycle1": {"exit": code1, "pushed": history[0]["pushed"], "harvest": history[0]["harvest"],
                   "gate": history[0]["gate"], "seconds": round(cycle1_s, 1)},
        "cycle2": {"exit": code2, "pushed": history[1]["pushed"], "gate": history[1]["gate"],
                   "server_kept": served_before == served_after},
    }


def rlvr(argv: list[str]) -> int:
    """``rlvr ARGV`` in this process; its exit status."""
    from rlvr.cli import main

    try:
        return main(argv)
    except SystemExit as e:  # the gate's refusal exits 1
        return int(e.code or 0)


def _responses(traffic: Path):
    from rlvr.serve.capture import read_traffic

    for _, record in read_traffic(traffic):
        if record["type"] == "response" and _animal(record) is not None:
            yield record


def _animal(record: dict) -> str | None:
    m = _CLASS.search(record["request"]["messages"][-1]["content"])
    return m.group(1) if m else None


def _models(url: str) -> tuple[str, int]:
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
        model = json.loads(r.read())["data"][0]
    return model["root"], model["version"]


if __name__ == "__main__":
    sys.exit(main())
