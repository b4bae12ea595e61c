"""Plots of the benchmark: the flash-sale run's latency percentiles and issued uses over
time; with --soak, the soak's resident memory over time.

    python3 loadtest/plot.py reports/bench
    python3 loadtest/plot.py --soak reports/soak
"""
import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def percentile(values, p):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def finish(fig, ax, path: Path, title: str, xlabel: str, ylabel: str) -> None:
    """Labels, legend and the file of one plot."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(out: Path) -> None:
    rows = list(csv.DictReader(open(out / "flash-sale-samples.csv")))
    bucket_ms = 100.0
    buckets: dict[int, dict[str, list[float]]] = {}
    issued = []
    for r in rows:
        b = int(float(r["at_ms"]) // bucket_ms)
        kind = "accepted" if r["status"] == "201" else "rejected"
        buckets.setdefault(b, {"accepted": [], "rejected": []})[kind].append(float(r["latency_ms"]))
        if r["status"] == "201":
            issued.append(float(r["at_ms"]) / 1000)

    xs = sorted(buckets)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for kind, color in (("rejected", "tab:blue"), ("accepted", "tab:green")):
        for p, style in ((50, "-"), (99, "--")):
            pts = [(x * bucket_ms / 1000, percentile(buckets[x][kind], p)) for x in xs]
            pts = [(t, v) for t, v in pts if v is not None]
            if pts:
                ax.plot([t for t, _ in pts], [v for _, v in pts], style, color=color, label=f"{kind} p{p}")
    ax.axhline(100, color="red", linewidth=0.8, label="p99 target 100 ms")
    ax.set_yscale("log")
    finish(fig, ax, out / "flash-sale-latency.png", "Flash sale through the edge: latency per 100 ms",
           "time into the sale (s)", "latency (ms, from scheduled send)")

    fig, ax = plt.subplots(figsize=(9, 4))
    issued.sort()
    ax.step(issued, range(1, len(issued) + 1), where="post", color="tab:green")
    ax.axhline(1000, color="red", linewidth=0.8, label="limit 1,000")
    finish(fig, ax, out / "flash-sale-issued.png", "Flash sale: uses issued over time",
           "time into the sale (s)", "uses issued (201s)")


def soak(out: Path) -> None:
    rows = list(csv.DictReader(open(out / "soak-rss.csv")))
    fig, ax = plt.subplots(figsize=(9, 4))
    for column, label in (("edge_mib", "edge"), ("core1_mib", "core 1"), ("core2_mib", "core 2")):
        pts = [(float(r["at_s"]) / 60, float(r[column])) for r in rows if r[column]]
        ax.plot([t for t, _ in pts], [v for _, v in pts], label=label)
    ax.axhline(64, color="red", linewidth=0.8, label="64 MiB")
    # Growth is judged from a fifth of the run (minute 2 of 10) to its end, as in SOAK.md.
    end = max((float(r["at_s"]) for r in rows), default=0) / 60
    ax.axvline(end / 5, color="grey", linewidth=0.8, linestyle="--", label="a fifth in (minute 2 of 10)")
    ax.set_ylim(bottom=0)
    finish(fig, ax, out / "soak-rss.png", "Soak: flash sales back to back",
           "minutes into the soak", "resident memory (VmRSS, MiB)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--soak"]:
        soak(Path(sys.argv[2] if len(sys.argv) > 2 else "reports/soak"))
    else:
        main(Path(sys.argv[1] if len(sys.argv) > 1 else "reports/bench"))
