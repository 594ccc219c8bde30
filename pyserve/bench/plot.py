"""A PNG of a run: output tokens/s, TTFT p50/p99 and ITL p50/p99 against concurrency (or request rate), with a
capacity search's SLOs, its capacity and the first level over."""
from __future__ import annotations

from typing import Optional


def check_matplotlib() -> Optional[str]:
    """None when matplotlib imports (checked before any load is run), else what to tell the user."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
    except ImportError as e:
        return f"--plot needs matplotlib, which does not import: {e}"
    return None


def _latency(ax, levels: list[dict], xs: list, key: str, title: str, slo: dict) -> None:
    for q, style in (("p50", "o-"), ("p99", "s--")):
        ax.plot(xs, [None if lv[key][q] is None else lv[key][q] * 1000 for lv in levels], style,
                label=f"{key.upper()} {q}")
    if slo.get(f"{key}_p99") is not None:
        bound = slo[f"{key}_p99"] * 1000
        ax.axhline(bound, color="red", lw=1, ls=":", label=f"p99 SLO {bound:g} ms")
    ax.set_ylabel("ms")
    ax.set_title(title)


def _search_lines(ax, result: dict, rate_mode: bool) -> None:
    """The capacity found and the first level tried that broke an SLO (what it broke), as vertical lines."""
    unit = " req/s" if rate_mode else ""
    if result.get("capacity"):
        ax.axvline(result["capacity"], color="green", lw=1, ls="-.", label=f"capacity {result['capacity']:g}{unit}")
    over = (result.get("capacity_search") or {}).get("first_over")
    if over:
        x = over["request_rate" if rate_mode else "concurrency"]
        ax.axvline(x, color="red", lw=1, ls="-.", label=f"over at {x:g}{unit}: {', '.join(over['failed'])}")


def _tick_labels(xs: list) -> list[str]:
    """A label for each level unless it sits within 15 % of the last one labelled (a bisection's last levels
    crowd together on the log axis)."""
    labels, last = [], None
    for x in xs:  # ascending, as plot_levels sorts them
        labels.append(f"{x:g}" if last is None or x >= 1.15 * last else "")
        last = x if labels[-1] else last
    return labels


def _x_axis(ax, xs: list, rate_mode: bool, result: dict) -> None:
    import matplotlib.ticker

    ax.set_xlabel("request rate (req/s)" if rate_mode else "concurrency")
    if len(set(xs)) > 1 and min(xs) > 0:
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, _tick_labels(xs))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    _search_lines(ax, result, rate_mode)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def plot_levels(result: dict, path: str) -> None:
    """`result` is the JSON of a run (`--output-json`); writes the PNG to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rate_mode = any(lv.get("mode") == "poisson" for lv in result["levels"])
    xkey = "request_rate" if rate_mode else "concurrency"
    levels = sorted((lv for lv in result["levels"] if lv.get(xkey) is not None), key=lambda lv: lv[xkey])
    xs = [lv[xkey] for lv in levels]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    axes[0].plot(xs, [lv["output_tokens_per_s"] for lv in levels], "o-", label="output tok/s")
    axes[0].set_ylabel("output tokens/s")
    axes[0].set_title("Throughput")
    _latency(axes[1], levels, xs, "ttft", "TTFT", result.get("slo") or {})
    _latency(axes[2], levels, xs, "itl", "Inter-token latency", result.get("slo") or {})
    for ax in axes:
        _x_axis(ax, xs, rate_mode, result)
    title = (result.get("config") or {}).get("model")
    if title:
        fig.suptitle(str(title).rsplit("/", 1)[-1], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
