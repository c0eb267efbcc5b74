"""The per-case chart of a bench_cuda.py CSV: each PyTorch SDPA backend's time over attnkit's (> 1: attnkit
faster), one bar per peer. Needs only matplotlib, so a CSV from the GPU machine can be drawn anywhere.

  python3 bench/plot_ratios.py results.csv results.png
"""
import csv
import math
import sys


def plot_csv(csv_path, png_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(csv_path) as f:
        header = f.readline().lstrip("# ").strip()
        rows = list(csv.DictReader(f))

    def value(r, key):
        try:
            return float(r[key])
        except (KeyError, ValueError):
            return math.nan

    labels = [f"{r['case']} {r['dtype']}" for r in rows]
    fig, ax = plt.subplots(figsize=(10, max(4, 0.22 * len(rows))))
    y = range(len(rows))
    for i, (peer, color) in enumerate((("flash", "tab:blue"), ("cudnn", "tab:orange"), ("efficient", "tab:green"))):
        ratios = [value(r, peer + "_us") / value(r, "attnkit_us") for r in rows]
        ax.barh([yy + 0.27 * (i - 1) for yy in y], ratios, height=0.27, color=color, label=f"torch {peer} / attnkit")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(list(y))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("peer time / attnkit time (> 1: attnkit faster)")
    ax.legend(fontsize=8)
    ax.set_title(header.split("|")[1].strip() + ": attnkit vs PyTorch SDPA backends", fontsize=9)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    plot_csv(sys.argv[1], sys.argv[2])
