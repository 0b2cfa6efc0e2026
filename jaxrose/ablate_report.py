"""An ablation's outputs: the tidy table (one row per preset × arm × seed) as CSV and JSON, a
markdown summary (medians over seeds) and per-arm plots of speedup and SM activity."""

from __future__ import annotations

import csv
import json
import os
import statistics
import textwrap
from typing import Optional

from jaxrose.run_folder import write_atomically

# Summary columns: (row field, header, format); None reads "n/a".
_SUMMARY = (("seconds_per_iteration", "ms / iteration", lambda v: f"{v * 1e3:.2f}"),
            ("env_steps_per_second", "env steps / s", lambda v: f"{v:,.0f}"),
            ("speedup", "speedup", lambda v: f"{v:.3f}x"),
            ("sm_activity_pct", "SM activity %", lambda v: f"{v:.1f}"),
            ("tuning_seconds", "tuning s", lambda v: f"{v:.1f}"),
            ("candidates_kept", "kept", lambda v: f"{v:g}"),
            ("candidates_tried", "tried", lambda v: f"{v:g}"),
            ("measurements_reused", "reused", lambda v: f"{v:g}"))

REPORT_FILES = ("table.csv", "table.json", "summary.md", "speedup.png", "sm_activity.png", "plans.json")


def write_report(rows: list[dict], out_dir: str, note: Optional[str] = None,
                 plans: Optional[dict[str, dict]] = None) -> dict[str, str]:
    """Writes table.csv, table.json, summary.md, speedup.png and sm_activity.png, and plans.json when
    `plans` (each run's chosen plan) is given; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {name: os.path.join(out_dir, name) for name in REPORT_FILES if name != "plans.json"}
    with open(paths["table.csv"], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)  # None is written as an empty cell; floats as repr, so they read back exactly
    write_atomically(paths["table.json"], json.dumps(rows, indent=2))
    with open(paths["summary.md"], "w") as f:
        f.write(summary_markdown(rows, note))
    if plans is not None:
        paths["plans.json"] = os.path.join(out_dir, "plans.json")
        with open(paths["plans.json"], "w") as f:
            json.dump(plans, f, indent=1)
    plot_per_arm(rows, "speedup", "speedup vs sequential (x)", paths["speedup.png"], reference=1.0)
    plot_per_arm(rows, "sm_activity_pct", "SM activity (%)", paths["sm_activity.png"], note=note)
    return paths


def medians(rows: list[dict]) -> list[dict]:
    """One record per preset × arm (in run order): the median over seeds of each summary field,
    over the seeds where it was measured (None where it never was)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["preset"], row["arm"]), []).append(row)
    out = []
    for (preset, arm), group in groups.items():
        record = {"preset": preset, "arm": arm, "seeds": len(group)}
        for field, _, _ in _SUMMARY:
            values = [r.get(field) for r in group if r.get(field) is not None]  # older tables lack newer fields
            record[field] = statistics.median(values) if values else None
        out.append(record)
    return out


def summary_markdown(rows: list[dict], note: Optional[str] = None) -> str:
    seeds = sorted({r["seed"] for r in rows})
    lines = [f"# Ablation: {', '.join(dict.fromkeys(r['preset'] for r in rows))}", "",
             f"Medians over {len(seeds)} seed(s) ({', '.join(map(str, seeds))}), {rows[0]['iterations']} timed "
             f"iterations per measurement. Speedup: the sequential arm's seconds per iteration over the arm's, "
             f"same preset and seed. Tuning time includes compilation. Reused: tuning measurements read from an "
             f"earlier arm of the same preset and seed (the same plan measured once), so that arm's tuning time is "
             f"shorter than a tune of its own would be."]
    if note:
        lines += ["", note]
    records = medians(rows)
    for preset in dict.fromkeys(r["preset"] for r in records):
        lines += ["", f"## {preset}", "", "| arm | " + " | ".join(h for _, h, _ in _SUMMARY) + " |",
                  "|---|" + "---:|" * len(_SUMMARY)]
        for record in (r for r in records if r["preset"] == preset):
            cells = ["n/a" if record[f] is None else fmt(record[f]) for f, _, fmt in _SUMMARY]
            lines.append(f"| {record['arm']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_per_arm(rows: list[dict], field: str, ylabel: str, path: str, reference: Optional[float] = None,
                 note: Optional[str] = None) -> str:
    """One panel per preset: a bar per arm at the median over seeds, a dot per seed; where no row
    has the field (SM activity on a CPU), the panel says why instead of drawing a number."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = list(dict.fromkeys(r["preset"] for r in rows))
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    fig, axes = plt.subplots(1, len(presets), figsize=(max(4.0, 0.8 * len(arms) + 1.5) * len(presets), 4.2),
                             squeeze=False)
    for ax, preset in zip(axes[0], presets):
        present = [r for r in rows if r["preset"] == preset and r[field] is not None]
        ax.set_title(preset)
        ax.set_ylabel(ylabel)
        ax.set_xticks(range(len(arms)), arms, rotation=30, ha="right")
        ax.set_xlim(-0.5, len(arms) - 0.5)
        if not present:
            ax.text(0.5, 0.5, textwrap.fill(note or f"no {field} measured", 40), ha="center", va="center",
                    transform=ax.transAxes, fontsize=9)
            ax.set_yticks([])
            continue
        for x, arm in enumerate(arms):
            values = [r[field] for r in present if r["arm"] == arm]
            if values:
                ax.bar(x, statistics.median(values), color="C0", alpha=0.6)
                ax.plot([x] * len(values), values, "o", color="C1", ms=4)
        if reference is not None:
            ax.axhline(reference, color="0.3", ls="--", lw=1)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
