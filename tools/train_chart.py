"""Where a training step's time goes, per optimizer implementation: one stacked horizontal bar per impl
of the mean data / forward / backward / optimizer / zero_grad times, labelled with the step time and the
speedup over torch's for-loop optimizer.

    python tools/train_chart.py REPORT.json OUT.png

REPORT.json is what `scripts/bench-train --json` or `fusedopt train --compare --json` writes
({"model", "optimizer", "batch_size", "impls": {impl: {"step_ms", "phases_ms": {...}, ...}}});
any subset of the impls torch / foreach / torch_fused / fused is drawn, in that order.
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

PHASES = ("data", "forward", "backward", "optimizer", "zero_grad")
COLORS = {"data": "#9e9e9e", "forward": "#4c72b0", "backward": "#55a868", "optimizer": "#c44e52",
          "zero_grad": "#dd8452"}
ORDER = ("torch", "foreach", "torch_fused", "fused")
LABELS = {"torch": "torch for-loop", "foreach": "torch foreach", "torch_fused": "torch fused=True",
          "fused": "fusedopt"}


def phase_ms(impl: dict) -> dict:
    """The phase times of one impl; a phase a writer does not time (e.g. data) counts 0."""
    return {p: float(impl["phases_ms"].get(p) or 0.0) for p in PHASES}


def plot_breakdown(report: dict, path: str) -> None:
    impls = report["impls"]
    names = [n for n in ORDER if n in impls] + [n for n in impls if n not in ORDER]
    if not names:
        raise ValueError("report has no impls to plot")
    baseline = impls.get("torch", {}).get("step_ms")
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.7 * len(names)))
    rows = range(len(names))[::-1]  # first impl on top
    for phase in PHASES:
        left = [sum(phase_ms(impls[n])[p] for p in PHASES[:PHASES.index(phase)]) for n in names]
        widths = [phase_ms(impls[n])[phase] for n in names]
        ax.barh(list(rows), widths, left=left, color=COLORS[phase], label=phase, height=0.6)
    longest = max(max(impls[n]["step_ms"], sum(phase_ms(impls[n]).values())) for n in names)
    for row, n in zip(rows, names):
        step_ms = impls[n]["step_ms"]
        text = f"{step_ms:.1f} ms"
        if baseline:
            text += f"  ({baseline / step_ms:.2f}x)"
        ax.text(sum(phase_ms(impls[n]).values()) + 0.01 * longest, row, text, va="center", fontsize=9)
    ax.set_yticks(list(rows), [impls[n].get("label") or LABELS.get(n, n) for n in names])
    ax.set_xlim(0, longest * 1.3)
    ax.set_xlabel("ms per training step (trimmed mean)")
    title = f"{report.get('model', '?')} / {report.get('optimizer', '?')}"
    if report.get("batch_size") is not None:
        title += f", batch {report['batch_size']}"
    if report.get("threads") is not None:
        title += f", {report['threads']} threads"
    ax.set_title(title)
    # Below the axis: inside, it would cover the shortest bar's label.
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18 - 0.1 / len(names)), fontsize=8, ncol=len(PHASES),
              frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python tools/train_chart.py REPORT.json OUT.png", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        plot_breakdown(json.load(f), argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
