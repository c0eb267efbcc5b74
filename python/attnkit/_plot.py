"""``attnkit bench --plot FILE.png``: the bench's JSON drawn with matplotlib (fused vs unfused time per case)."""

from __future__ import annotations

import json
from typing import List, Optional, Tuple


def split_plot_option(args: List[str]) -> Tuple[List[str], Optional[str]]:
    """(the arguments without ``--plot FILE``, FILE or None)."""
    out, path, i = [], None, 0
    while i < len(args):
        a = args[i]
        if a == "--plot":
            if i + 1 >= len(args):
                raise SystemExit("attnkit: error: --plot needs a file name (e.g. --plot bench.png)")
            path, i = args[i + 1], i + 2
            continue
        if a.startswith("--plot="):
            path = a.split("=", 1)[1]
        else:
            out.append(a)
        i += 1
    return out, path


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("attnkit: error: --plot draws with matplotlib, which is not installed (pip install "
                         "matplotlib)") from None


def plot(json_path: str, png_path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(json_path) as f:
        doc = json.load(f)
    rows = [r for r in doc["results"] if r["fused"]["ms"] is not None]
    labels = [f'{r["case"]} {r["dtype"]}' for r in rows]
    fused = [r["fused"]["ms"] for r in rows]
    unfused = [r["unfused"]["ms"] if r["unfused"]["ms"] is not None else float("nan") for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(rows) + 2), 4.5))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], fused, 0.4, label="attnkit (fused)")
    ax.bar([i + 0.2 for i in x], unfused, 0.4, label="GEMM + softmax + GEMM")
    ax.set_yscale("log")
    ax.set_ylabel("median ms per call (log)")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
    head = doc["header"]
    ax.set_title(f'attnkit {head["attnkit_version"]} bench, {head["threads"]} threads, {head["cpu"]}', fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
