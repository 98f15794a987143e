"""The cost curves' report: a table per axis, each axis's least-squares growth, and the plot.

Used by benchmarks/cost_curves.py on the points it measured (or read back from its --json).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

# Axis -> (x label, the work a point stands for).
UNITS = {
    "trajectories": "trajectories",
    "turns-markov": "turns",
    "turns-full": "turns",
    "answer": "generated answer tokens",
    "model": "M parameters",
}
PHASES = ("rollout_s", "update_s", "sync_s")
# "No point grows faster than its work": 256 trajectories cost at most this x 16 x the 16-trajectory figure.
LINEAR_SLACK = 1.1


def work(point: dict[str, Any]) -> float:
    """The amount of the varied thing at a point: the model's parameters in millions; on the answer axis the
    tokens a turn's answer actually had (a thinking model stops before the limit the point sets: 148 tokens
    at the 256 limit on FrozenLake); else the point's number."""
    if point["axis"] == "model":
        return point["parameters"] / 1e6
    return point["answer_tokens_mean"] if point["axis"] == "answer" else float(point["point"])


def linear_fit(xs: list[float], ys: list[float]) -> dict[str, float]:
    """Least squares y = intercept + slope x, its rms residual, and the log-log slope (1 = linear growth)."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    design = np.column_stack([np.ones_like(x), x])
    (intercept, slope), *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = float(np.sqrt(np.mean((y - design @ np.array([intercept, slope])) ** 2)))
    exponent = float(np.polyfit(np.log(x), np.log(y), 1)[0]) if (x > 0).all() and (y > 0).all() else float("nan")
    return {"intercept": float(intercept), "slope": float(slope), "rms_residual": residual, "exponent": exponent}


def growth_sentence(axis: str, fit: dict[str, float]) -> str:
    unit = UNITS[axis]
    return (
        f"{axis}: seconds/iteration = {fit['intercept']:.2f} + {fit['slope']:.4f} per {unit.rstrip('s')} "
        f"(rms residual {fit['rms_residual']:.2f} s); log-log growth exponent {fit['exponent']:.2f}"
    )


def axis_table(points: list[dict[str, Any]], ceiling: float) -> list[str]:
    """One axis's points as fixed-width rows."""
    lines = [
        f"{'point':<22}{'s/iter':>8}{'rollout':>9}{'update':>8}{'sync':>7}{'turns':>7}{'answer':>8}"
        f"{'trunc':>7}{'gen GF/s':>9}{'%ceil':>7}{'computed':>9}{'%ceil':>7}{'upd GF/s':>9}{'%ceil':>7}  peak RSS MiB"
    ]
    for point in points:
        if "error" in point:
            lines.append(f"{point['point']:<22}failed: {point['error']}")
            continue
        # Ray pads its processes' titles with spaces: one space between words reads as a list.
        peaks = ", ".join(f"{' '.join(p['role'].split())} {p['peak_mb']:.0f}" for p in point["processes"][:4])
        computed = point.get("generation_computed_gflops", float("nan"))  # points stored before the prefill count
        lines.append(
            f"{point['point']:<22}{point['seconds']:>8.2f}{point['rollout_s']:>9.2f}{point['update_s']:>8.2f}"
            f"{point['sync_s']:>7.2f}{point['turns_mean']:>7.2f}{point['answer_tokens_mean']:>8.1f}"
            f"{point['truncated_trajectories']:>7.0f}{point['generation_gflops']:>9.1f}"
            f"{point['generation_gflops'] / ceiling:>7.0%}{computed:>9.1f}{computed / ceiling:>7.0%}"
            f"{point['update_hardware_gflops']:>9.1f}"
            f"{point['update_hardware_gflops'] / ceiling:>7.0%}  {peaks}"
        )
    return lines


def linearity_line(points: list[dict[str, Any]]) -> str | None:
    """Whether 256 trajectories cost at most LINEAR_SLACK x 16 x the 16-trajectory figure (None without both)."""
    by_size = {int(p["point"]): p["seconds"] for p in points if "error" not in p}
    if not {16, 256} <= set(by_size):
        return None
    ratio, bound = by_size[256] / by_size[16], LINEAR_SLACK * 16
    verdict = "within" if ratio <= bound else "OVER"
    return f"256 vs 16 trajectories: x{ratio:.2f} the seconds per iteration ({verdict} the {bound:.1f} bound)"


def report_lines(points: list[dict[str, Any]], ceiling: float, ceiling_dtype: str) -> list[str]:
    """Per axis: its table, its fit and (trajectories) the linearity check; the ceiling first."""
    lines = [
        f"{ceiling_dtype} matmul ceiling (measured once, alone, on the machine of the points): {ceiling:.0f} GFLOP/s",
        "s/iter = rollout + update + sync (medians of iterations 2+); turns, answer: means per trajectory and "
        "turn; trunc: trajectories ended by a prompt over max_model_len per iteration; GF/s: generation "
        "(sampled tokens; computed: with the prompt positions prefilled) and update (positions run), as "
        "benchmarks/iteration_breakdown.py counts them",
    ]
    for axis in dict.fromkeys(p["axis"] for p in points):
        ran = [p for p in points if p["axis"] == axis]
        lines += ["", f"== {axis} ==", *axis_table(ran, ceiling)]
        measured = [p for p in ran if "error" not in p]
        if len({work(p) for p in measured}) >= 2:
            lines.append(
                growth_sentence(axis, linear_fit([work(p) for p in measured], [p["seconds"] for p in measured]))
            )
            for phase in PHASES:
                fit = linear_fit([work(p) for p in measured], [p[phase] for p in measured])
                lines.append(
                    f"  {phase}: {fit['intercept']:.2f} + {fit['slope']:.4f} x, exponent {fit['exponent']:.2f}"
                )
        if axis == "trajectories" and (line := linearity_line(ran)):
            lines.append(line)
    return lines


def plot(points: list[dict[str, Any]], path: Path) -> None:
    """One panel per axis: each phase's seconds and the total against the work, with the total's line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_names = list(dict.fromkeys(p["axis"] for p in points))
    figure, panels = plt.subplots(1, len(axes_names), figsize=(4.2 * len(axes_names), 3.6), squeeze=False)
    for panel, axis in zip(panels[0], axes_names):
        measured = sorted((p for p in points if p["axis"] == axis and "error" not in p), key=work)
        xs = [work(p) for p in measured]
        for key, label in (("seconds", "iteration"), *((phase, phase[:-2]) for phase in PHASES)):
            panel.plot(xs, [p[key] for p in measured], marker="o", label=label)
        if len(set(xs)) >= 2:
            fit = linear_fit(xs, [p["seconds"] for p in measured])
            grid = np.linspace(min(xs), max(xs), 50)
            panel.plot(grid, fit["intercept"] + fit["slope"] * grid, "k--", linewidth=0.8, label="least squares")
        panel.set(title=axis, xlabel=UNITS[axis], ylabel="seconds per iteration")
        panel.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def publish(
    lines: list[str], points: list[dict[str, Any]], *, output: Path | None, plot_path: Path | None, provenance: str
) -> None:
    """Prints the report; with `output`, writes it there under its provenance; with `plot_path`, draws it."""
    print("\n".join(lines))
    if output:
        Path(output).write_text(provenance + "\n```text\n" + "\n".join(lines) + "\n```\n")
    if plot_path and any("error" not in p for p in points):
        plot(points, plot_path)
