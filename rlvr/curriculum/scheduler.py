"""The curriculum scheduler: a domain mix, easy-to-hard stages, filtering, recycling, seesaw control.

A drop-in for ``TaskPool`` (``next``, ``state_dict``, ``load_state_dict``) that also learns from
what happened: ``observe`` takes each verified batch, ``on_eval`` each periodic eval. One draw:

    recycled   failed tasks that are due come first (at most ``recycle.max_share`` of the draw)
    group      a weight key (domain or family) by its weight x seesaw factor
    domain     uniformly within the group
    level      the domain's frontier level, or (review) an unlocked level below it
    task       the next available task of that (domain, level) in a seeded shuffled cycle

What ``observe`` does with a group of samples of one task (``k`` of ``n`` passed):

    k == n     solved streak + 1; ``filter.solved_after`` streaks retire it (always solved)
    k == 0     queued for a retry ``recycle.delay_steps`` later, ``recycle.retry_limit`` times at
               most, then retired (never solved)
    frontier   a domain's frontier level whose rolling pass rate reaches ``stages.promote_at``
               unlocks the next level; levels never lock again (no promotion/demotion loop)

All randomness comes from ``seeded_rng(seed, "curriculum", draw number)`` and all state is plain
lists and dicts (``state_dict``), so a resumed run draws exactly the tasks an uninterrupted one
would. A (domain, level) whose tasks are all retired or waiting is drawn from its retired tasks
(counted as ``exhausted``) rather than stalling.
"""

from __future__ import annotations

import math
from collections import defaultdict

from rlvr.curriculum.config import CurriculumConfig
from rlvr.curriculum.rules import (choose_level, eval_noise, learnability_level, normalised, recycle_accepts,
                                   seesaw_step, should_promote, weight_groups, weighted_pick)
from rlvr.errors import UserError
from rlvr.tasks.base import seeded_rng
from rlvr.types import Scored, Task

ACTIVE, SOLVED, UNSOLVED = "active", "solved", "unsolved"


class Curriculum:
    learns = True  # its draws follow the outcomes it observes (the asynchronous producer, rlvr.rollout.async_rollout)

    def __init__(self, tasks: list[Task], cfg: CurriculumConfig, seed: int) -> None:
        if not tasks:
            raise ValueError("the task pool is empty")
        self.tasks, self.cfg, self.seed = tasks, cfg, seed
        self.index = {t.id: i for i, t in enumerate(tasks)}
        domains = sorted({t.domain for t in tasks})
        self.groups = weight_groups(cfg.weights, domains)
        self.base = {g: float(cfg.weights.get(g, 1.0)) for g in self.groups}
        self.buckets: dict[str, list[int]] = defaultdict(list)  # "domain/level" -> task indices
        self.levels: dict[str, list[int]] = defaultdict(list)
        for i, t in enumerate(tasks):
            self.buckets[_bucket(t.domain, t.level)].append(i)
            if t.level not in self.levels[t.domain]:
                self.levels[t.domain].append(t.level)
        for d in self.levels:
            self.levels[d].sort()
        # --- state (plain values: state_dict) ---
        self.draws = 0
        self.step = -1
        self.frontier = {d: (lv[0] if cfg.stages.enabled else lv[-1]) for d, lv in self.levels.items()}
        self.cursors = {b: [0, 0] for b in self.buckets}  # bucket -> [epoch, cursor]
        self.windows: dict[str, list[int]] = {b: [] for b in self.buckets}
        self.status: dict[str, str] = {}  # task index -> solved | unsolved (absent: active)
        self.streak: dict[str, int] = {}
        self.tally: dict[str, list[int]] = {}  # task index -> [samples, passes] over the run
        self.retries: dict[str, int] = {}
        self.queue: list[list[int]] = []  # [due step, task index], failed tasks waiting for a retry
        self.factor = {g: 1.0 for g in self.groups}
        self.best: dict[str, float] = {}
        self.events: list[dict] = []  # promotions and seesaw triggers, in order
        self.counts = {"recycled": 0, "exhausted": 0, "retired_solved": 0, "retired_unsolved": 0}
        self._orders: dict[tuple[str, int], list[int]] = {}
        self._drawn_this_step: set[int] = set()

    # ------------------------------------------------------------------ drawing

    def weights(self) -> dict[str, float]:
        """Effective mix (normalised): configured weight x seesaw factor, per group."""
        return normalised({g: self.base[g] * self.factor[g] for g in self.groups})

    def next(self, n: int, step: int = 0) -> list[Task]:
        if step != self.step:
            self.step, self._drawn_this_step = step, set()
        rng = seeded_rng(self.seed, "curriculum", self.draws)
        self.draws += 1
        out = self._recycled(n, rng)
        weights = self.weights()
        groups = [g for g in self.groups if weights[g] > 0]
        for _ in range(50 * n):
            if len(out) == n:
                break
            group = weighted_pick(groups, [weights[g] for g in groups], rng.random())
            members = self.groups[group]
            domain = members[min(int(rng.random() * len(members)), len(members) - 1)]
            level = self._level(domain, rng.random(), rng.random())
            idx = self._take(domain, level, out)
            if idx is not None:
                out.append(idx)
        if len(out) < n:
            raise UserError(f"curriculum: drew only {len(out)} of rollout.tasks_per_step={n} distinct tasks at "
                            f"step {step}: {self._unlocked_summary()} (a pool of {len(self.tasks)}); raise "
                            "train_tasks, lower rollout.tasks_per_step, or add weight to domains with tasks unlocked")
        self._drawn_this_step.update(out)
        return [self.tasks[i] for i in out]

    def _unlocked_summary(self) -> str:
        """'math.arith L1: 1 task, ...': the tasks a draw may take now, per unlocked (domain, level)."""
        parts = []
        for domain, levels in sorted(self.levels.items()):
            for lv in levels:
                if lv <= self.frontier[domain] and self.weights().get(self._group_of(domain), 0) > 0:
                    k = len(self.buckets[_bucket(domain, lv)])
                    parts.append(f"{domain} L{lv}: {k} task{'s' * (k != 1)}")
        return "unlocked " + (", ".join(parts) or "nothing")

    def _group_of(self, domain: str) -> str | None:
        return next((g for g, members in self.groups.items() if domain in members), None)

    def _recycled(self, n: int, rng) -> list[int]:
        cap = math.ceil(self.cfg.recycle.max_share * n)
        out: list[int] = []
        due = sorted(e for e in self.queue if e[0] <= self.step)
        for entry in due:
            if len(out) >= cap:
                break
            idx = entry[1]
            if idx in self._drawn_this_step:
                continue
            self.queue.remove(entry)
            if recycle_accepts(self.retries.get(str(idx), 1), self.cfg.recycle.decay, rng.random()):
                out.append(idx)
                self.counts["recycled"] += 1
            else:
                self.queue.append([self.step + self.cfg.recycle.delay_steps, idx])
        return out

    def _level(self, domain: str, u: float, v: float) -> int:
        unlocked = [lv for lv in self.levels[domain] if lv <= self.frontier[domain]]  # all without stages
        if self.cfg.stages.level_choice == "learnability":
            return learnability_level(unlocked, {lv: self.rate(domain, lv) for lv in unlocked}, u)
        if not self.cfg.stages.enabled:
            return unlocked[min(int(u * len(unlocked)), len(unlocked) - 1)]
        return choose_level(unlocked, self.frontier[domain], self.cfg.stages.frontier_share, u, v)

    def rate(self, domain: str, level: int, min_samples: int = 8) -> float | None:
        """Rolling sample pass rate of (domain, level); None with fewer than ``min_samples`` samples."""
        window = self.windows[_bucket(domain, level)]
        return sum(window) / len(window) if len(window) >= min_samples else None

    def _take(self, domain: str, level: int, taken: list[int]) -> int | None:
        """The next available task of (domain, level), else of its other unlocked levels (nearest
        first), else a retired one; ``None`` when every task there is in this step's draw."""
        unlocked = [lv for lv in self.levels[domain] if lv <= self.frontier[domain]]
        order = sorted(unlocked, key=lambda lv: (abs(lv - level), -lv))
        waiting = {e[1] for e in self.queue}
        busy = set(taken) | self._drawn_this_step
        for allow_retired in (False, True):
            for lv in order:
                idx = self._cycle(_bucket(domain, lv), lambda i: i not in busy and (
                    allow_retired or (str(i) not in self.status and i not in waiting)))
                if idx is not None:
                    self.counts["exhausted"] += int(allow_retired)
                    return idx
        return None

    def _cycle(self, bucket: str, ok) -> int | None:
        members = self.buckets[bucket]
        for _ in range(len(members)):
            epoch, cursor = self.cursors[bucket]
            order = self._order(bucket, epoch)
            idx = order[cursor]
            self.cursors[bucket] = [epoch + 1, 0] if cursor + 1 == len(order) else [epoch, cursor + 1]
            if ok(idx):
                return idx
        return None

    def _order(self, bucket: str, epoch: int) -> list[int]:
        key = (bucket, epoch)
        if key not in self._orders:
            order = list(self.buckets[bucket])
            seeded_rng(self.seed, "curriculum-order", bucket, epoch).shuffle(order)
            self._orders = {k: v for k, v in self._orders.items() if k[0] != bucket}
            self._orders[key] = order
        return self._orders[key]

    # ------------------------------------------------------------------ feedback

    def observe(self, scored: list[Scored], step: int = 0) -> None:
        """Learn from a verified batch: pass-rate windows, retirement, recycling, promotion."""
        by_task: dict[int, list[int]] = defaultdict(list)
        for s in scored:
            by_task[self.index[s.task.id]].append(int(s.verdict.passed))
        touched = set()
        for idx, passes in by_task.items():
            task = self.tasks[idx]
            n, k = self.tally.get(str(idx), [0, 0])
            self.tally[str(idx)] = [n + len(passes), k + sum(passes)]
            bucket = _bucket(task.domain, task.level)
            self.windows[bucket] = (self.windows[bucket] + passes)[-self.cfg.stages.window:]
            touched.add(task.domain)
            if self.cfg.filter.enabled:
                self._judge_task(idx, sum(passes), len(passes), step)
        if self.cfg.stages.enabled:
            for domain in sorted(touched):
                self._maybe_promote(domain, step)

    def _judge_task(self, idx: int, k: int, n: int, step: int) -> None:
        key = str(idx)
        if k == n:
            self.streak[key] = self.streak.get(key, 0) + 1
            if self.streak[key] >= self.cfg.filter.solved_after:
                self.status[key] = SOLVED
                self.counts["retired_solved"] += 1
        elif k == 0:
            self.streak[key] = 0
            if self.retries.get(key, 0) < self.cfg.recycle.retry_limit:
                self.retries[key] = self.retries.get(key, 0) + 1
                self.queue.append([step + self.cfg.recycle.delay_steps, idx])
            else:
                self.status[key] = UNSOLVED
                self.counts["retired_unsolved"] += 1
        else:
            self.streak[key] = 0

    def _maybe_promote(self, domain: str, step: int) -> None:
        levels, frontier = self.levels[domain], self.frontier[domain]
        if frontier == levels[-1]:
            return
        s = self.cfg.stages
        if should_promote(self.windows[_bucket(domain, frontier)], min_samples=s.min_samples, promote_at=s.promote_at):
            self.frontier[domain] = levels[levels.index(frontier) + 1]
            self.events.append({"step": step, "event": "promote", "domain": domain,
                                "from_level": frontier, "to_level": self.frontier[domain]})

    def on_eval(self, step: int, by_domain: dict[str, dict]) -> list[dict]:
        """Seesaw control from a periodic eval (``by_domain``: domain -> {"pass@1", "n_tasks"}).
        Returns the alerts (a group more than ``seesaw.tolerance`` below its best eval)."""
        s = self.cfg.seesaw
        if not s.enabled:
            return []
        alerts = []
        for group, members in self.groups.items():
            stats = [by_domain[d] for d in members if d in by_domain]
            if not stats:
                continue
            n = sum(x["n_tasks"] for x in stats)
            score = sum(x["pass@1"] * x["n_tasks"] for x in stats) / n
            before = self.factor[group]
            best = self.best.get(group)
            noise = eval_noise(max(score, best or 0.0), n, s.z)
            self.factor[group], self.best[group], triggered = seesaw_step(
                score, best, before, tolerance=s.tolerance, boost=s.boost, max_factor=s.max_factor, noise=noise)
            if triggered:
                alert = {"step": step, "detector": "seesaw", "severity": "warning", "group": group,
                         "evidence": {"eval_pass@1": round(score, 4), "best": round(self.best[group], 4),
                                      "tolerance": s.tolerance, "noise": round(noise, 4), "n_tasks": n,
                                      "factor": [before, self.factor[group]]},
                         "action": "raised weight"}
                alerts.append(alert)
                self.events.append({"step": step, "event": "seesaw", "group": group, "factor": self.factor[group]})
        return alerts

    def task_report(self) -> list[dict]:
        """Every task drawn so far: id, domain, level, samples, passes, status (the per-task pass rates)."""
        out = []
        for key, (n, k) in sorted(self.tally.items(), key=lambda kv: int(kv[0])):
            t = self.tasks[int(key)]
            out.append({"id": t.id, "domain": t.domain, "level": t.level, "samples": n, "passes": k,
                        "status": self.status.get(key, ACTIVE)})
        return out

    def metrics(self) -> dict[str, float]:
        out = {f"curriculum/weight/{g}": w for g, w in self.weights().items()}
        out.update({f"curriculum/frontier/{d}": float(lv) for d, lv in self.frontier.items()})
        retired = list(self.status.values())
        out["curriculum/retired_solved"] = float(retired.count(SOLVED))
        out["curriculum/retired_unsolved"] = float(retired.count(UNSOLVED))
        out["curriculum/waiting"] = float(len(self.queue))
        out["curriculum/recycled_total"] = float(self.counts["recycled"])
        out["curriculum/exhausted_total"] = float(self.counts["exhausted"])
        return out

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        return {"draws": self.draws, "step": self.step, "frontier": dict(self.frontier),
                "cursors": {b: list(c) for b, c in self.cursors.items()},
                "windows": {b: list(w) for b, w in self.windows.items()}, "status": dict(self.status),
                "streak": dict(self.streak), "tally": {i: list(v) for i, v in self.tally.items()}, "retries": dict(self.retries), "queue": [list(e) for e in self.queue],
                "factor": dict(self.factor), "best": dict(self.best), "events": [dict(e) for e in self.events],
                "counts": dict(self.counts), "drawn_this_step": sorted(self._drawn_this_step)}

    def load_state_dict(self, state: dict) -> None:
        if "frontier" not in state:
            raise ValueError("the checkpoint holds a uniform task pool's state, not a curriculum's "
                             "(resume with the config the run started with)")
        self.draws, self.step = state["draws"], state["step"]
        self.frontier = dict(state["frontier"])
        self.cursors = {b: list(c) for b, c in state["cursors"].items()}
        self.windows = {b: list(w) for b, w in state["windows"].items()}
        self.status, self.streak, self.retries = dict(state["status"]), dict(state["streak"]), dict(state["retries"])
        self.tally = {i: list(v) for i, v in state["tally"].items()}
        self.queue = [list(e) for e in state["queue"]]
        self.factor, self.best = dict(state["factor"]), dict(state["best"])
        self.events = [dict(e) for e in state["events"]]
        self.counts = dict(state["counts"])
        self._drawn_this_step = set(state["drawn_this_step"])


def _bucket(domain: str, level: int) -> str:
    return f"{domain}/{level}"

