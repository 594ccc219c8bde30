"""Re-plot a `pyserve bench --output-json` file: throughput and p50/p99 TTFT and ITL against concurrency.

    python scripts/plot_bench.py bench.json bench.png
"""
import argparse
import json
import sys

from pyserve.bench import plot_levels


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json_file")
    p.add_argument("png_file")
    args = p.parse_args()
    with open(args.json_file) as f:
        plot_levels(json.load(f), args.png_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
