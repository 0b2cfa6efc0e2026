"""Slack-aware SM quotas: give SMs to the critical path, take them from branches with slack.

Between a fork and the join that waits for all of them, each branch (a worker process) does its
work at the SM share it gets. A branch's time as a function of its share follows a fitted
`ScalingModel`; the iteration waits for the slowest branch, and every other branch has slack.
Quotas are caps under MPS that are fixed for a process's life, so they come from a few discrete
levels (a pool of workers per level, or a restart with a warm compile cache per change), and they
sum to at most 100% so that every branch really gets its share.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class ScalingModel:
    """t(share) = serial + parallel / min(share, saturation): work that scales with SMs up to a
    point (`saturation`), plus a part that does not (launch latency, host work)."""

    serial: float
    parallel: float
    saturation: float = 1.0

    def seconds(self, share: float) -> float:
        return self.serial + self.parallel / min(max(share, 1e-9), self.saturation)

    @staticmethod
    def fit(points: Iterable[tuple[float, float]]) -> "ScalingModel":
        """Least squares over (share, seconds) measurements, saturation searched on a grid."""
        points = list(points)
        if len(points) < 2:
            raise ValueError("Fitting a scaling model needs measurements at two SM shares at least.")
        shares, seconds = np.array([p[0] for p in points]), np.array([p[1] for p in points])
        best = None
        for saturation in np.linspace(0.05, 1.0, 96):
            x = 1.0 / np.minimum(shares, saturation)
            design = np.stack([np.ones_like(x), x], axis=1)
            (serial, parallel), *_ = np.linalg.lstsq(design, seconds, rcond=None)
            serial, parallel = max(serial, 0.0), max(parallel, 0.0)
            error = float(np.sum((serial + parallel * x - seconds) ** 2))
            if best is None or error < best[0] - 1e-15:
                best = (error, ScalingModel(float(serial), float(parallel), float(saturation)))
        return best[1]


@dataclasses.dataclass(frozen=True)
class Allocation:
    quotas: dict[str, float]
    seconds: dict[str, float]

    @property
    def iteration_seconds(self) -> float:
        return max(self.seconds.values())

    @property
    def critical(self) -> str:
        return max(self.seconds, key=self.seconds.get)

    @property
    def slack(self) -> dict[str, float]:
        return {name: self.iteration_seconds - t for name, t in self.seconds.items()}


def evaluate(models: dict[str, ScalingModel], quotas: dict[str, float]) -> Allocation:
    return Allocation(dict(quotas), {name: models[name].seconds(quotas[name]) for name in models})


def allocate(models: dict[str, ScalingModel], step: float = 0.05, minimum: float = 0.05) -> Allocation:
    """Slack-aware search: start from equal shares; repeatedly move one `step` of SMs from the
    branch with the most slack to the critical branch while that shortens the iteration. Branches
    tied as critical are shortened one after the other: a move counts as progress when it lowers the
    branch times sorted slowest first (compared in order), not only the slowest."""
    names = list(models)
    levels = round(1.0 / step)
    units = {name: levels // len(names) for name in names}
    current = evaluate(models, {n: units[n] * step for n in names})
    while True:
        critical = current.critical
        donors = sorted((n for n in names if n != critical and units[n] * step > minimum + 1e-12),
                        key=lambda n: -current.slack[n])
        for donor in donors:
            trial_units = {**units, donor: units[donor] - 1, critical: units[critical] + 1}
            trial = evaluate(models, {n: trial_units[n] * step for n in names})
            if _slower_first(trial) < _slower_first(current):
                units, current = trial_units, trial
                break
        else:
            # Nothing to take: hand any unused SMs to the critical branch, then stop.
            spare = levels - sum(units.values())
            if spare > 0:
                units[critical] += spare
                current = evaluate(models, {n: units[n] * step for n in names})
                continue
            return current


def _slower_first(allocation: Allocation) -> tuple[float, ...]:
    # Rounded so that float noise in equal times neither makes nor blocks progress.
    return tuple(round(t, 12) for t in sorted(allocation.seconds.values(), reverse=True))


def brute_force(models: dict[str, ScalingModel], step: float = 0.05, minimum: float = 0.05) -> Allocation:
    """Every quota combination on the grid with shares summing to at most 1 (a reference for tests)."""
    names = list(models)
    grid: Sequence[float] = [k * step for k in range(round(minimum / step), round(1.0 / step) + 1)]
    best = None
    for combo in itertools.product(grid, repeat=len(names)):
        if sum(combo) > 1.0 + 1e-9:
            continue
        allocation = evaluate(models, dict(zip(names, combo)))
        if best is None or allocation.iteration_seconds < best.iteration_seconds - 1e-12:
            best = allocation
    return best
