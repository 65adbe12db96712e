#!/usr/bin/env python3
"""Plot the key dashboard panels from Prometheus' query API into PNGs (docs/img/).

python hack/prometheus/plot_panels.py --url http://127.0.0.1:9090 --start T0 [--end T1] [--out DIR]

The queries are the dashboard's own (charts/llm-batch-operator/files/dashboard.json), with every
pool and tier selected; tests/integration/test_observability.py calls this after its real run
when LLMBATCH_OBSERVABILITY_PLOTS names a directory.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from promql import PrometheusAPI, panel_queries

#: (file stem, figure title, [dashboard panel titles])
FIGURES = (
    (
        "observability-backlog",
        "Backlog and drain",
        ["Backlog (requests)", "Drain time at maxSlots vs target"],
    ),
    (
        "observability-slots",
        "Slots and batches",
        ["Slots: running / desired / max", "Batches by status"],
    ),
    ("observability-throughput", "Throughput", ["Requests processed", "Store latency p95"]),
    ("observability-gateway", "Gateway", ["Requests by route and code", "Latency p95 by route"]),
)

#: Panels whose lines span orders of magnitude (drain targets: minutes to days).
LOG_SCALE = frozenset({"Drain time at maxSlots vs target"})


def _legend(template: str, labels: dict[str, str]) -> str:
    out = template
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return out.replace("{{", "").replace("}}", "") or "value"


def plot(
    api: PrometheusAPI, start: float, end: float, out: pathlib.Path, step: float = 1.0
) -> list[pathlib.Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    queries = panel_queries(rate_interval="10s")
    written = []
    out.mkdir(parents=True, exist_ok=True)
    for stem, title, panels in FIGURES:
        fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 3.6), squeeze=False)
        for ax, panel in zip(axes[0], panels, strict=True):
            for panel_title, legend, expr in queries:
                if panel_title != panel:
                    continue
                for series in api.query_range(expr, start, end, step):
                    points = [(float(t) - start, float(v)) for t, v in series["values"]]
                    points = [(t, v) for t, v in points if v == v and abs(v) != float("inf")]
                    if points:
                        xs, ys = zip(*points, strict=True)
                        ax.plot(xs, ys, label=_legend(legend, series["metric"])[:40])
            if panel in LOG_SCALE:
                ax.set_yscale("symlog", linthresh=1)
            ax.set_title(panel, fontsize=10)
            ax.set_xlabel("seconds into the run")
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=7, loc="best")
        fig.suptitle(title)
        fig.tight_layout()
        path = out / f"{stem}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="Prometheus base URL")
    parser.add_argument("--start", type=float, required=True, help="unix time")
    parser.add_argument("--end", type=float, default=time.time(), help="unix time")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("docs/img"))
    args = parser.parse_args()
    for path in plot(PrometheusAPI(args.url), args.start, args.end, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
