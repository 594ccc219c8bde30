"""Re-plot `pyserve bench --output-json` files.

    python scripts/plot_bench.py bench.json bench.png
        throughput and p50/p99 TTFT and ITL against concurrency, for one run
    python scripts/plot_bench.py --compare pyserve=a.json llama-server=b.json --png side.png
        several servers' ITL p99 and TTFT p99 against concurrency in one chart (closed-loop levels)
"""
import argparse
import json
import sys

from pyserve.bench import plot_levels


def compare(runs: list[tuple[str, dict]], png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (itl, ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, run in runs:
        levels = sorted((lv for lv in run["levels"] if lv.get("concurrency")), key=lambda lv: lv["concurrency"])
        x = [lv["concurrency"] for lv in levels]
        itl.plot(x, [lv["itl"]["p99"] * 1e3 for lv in levels], marker="o", label=label)
        ttft.plot(x, [lv["ttft"]["p99"] * 1e3 for lv in levels], marker="o", label=label)
    for ax, name in ((itl, "ITL p99 (ms)"), (ttft, "TTFT p99 (ms)")):
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend()
    itl.axhline(50, color="red", lw=0.8, ls="--")
    ttft.axhline(1000, color="red", lw=0.8, ls="--")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compare", nargs="+", metavar="LABEL=JSON", help="several runs in one chart (with --png)")
    p.add_argument("--png", help="the chart of --compare")
    p.add_argument("files", nargs="*", help="one run: its JSON, then the PNG")
    args = p.parse_args()
    if args.compare:
        if not args.png:
            p.error("--compare needs --png FILE")
        runs = []
        for item in args.compare:
            label, _, path = item.partition("=")
            with open(path) as f:
                runs.append((label, json.load(f)))
        compare(runs, args.png)
        return 0
    if len(args.files) != 2:
        p.error("one run: JSON_FILE PNG_FILE")
    with open(args.files[0]) as f:
        plot_levels(json.load(f), args.files[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
