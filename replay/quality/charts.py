"""The report's charts: matplotlib figures rendered to PNG data URIs (``replay report``).

matplotlib is imported inside the functions, and each figure gets its own Agg canvas:
no pyplot, no process-wide backend switch.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from typing import TYPE_CHECKING, Any

from replay.core.timeutil import NEG_INF

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.typing import RcKeyType

__all__ = ["REASON_COLOURS", "Image", "histogram_chart", "timeline_chart"]

#: Colours of the late reasons in the histograms (the page's legend uses the same).
REASON_COLOURS = {"behind_origin_watermark": "#f59e0b", "behind_global_watermark": "#6366f1"}
_LEGEND_ORIGINS = 12  # above this many origins the timeline draws them without one legend entry each
_DPI = 110
_STYLE: dict[RcKeyType, Any] = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "axes.labelsize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e5e7eb",
    "grid.linewidth": 0.8,
    "legend.fontsize": 8,
    "figure.facecolor": "white",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Image:
    """A PNG chart as a data URI, with its alt text and pixel size."""

    src: str
    alt: str
    width: int
    height: int


# --------------------------------------------------------------------------- charts


def _png(figure: Figure, alt: str) -> Image:
    # The Agg canvas is attached to this figure only: no pyplot, no global backend switch, so a
    # caller's own matplotlib setup (a notebook, an Airflow worker) is left as it was.
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=_DPI, bbox_inches="tight")
    data = buffer.getvalue()
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")  # the IHDR chunk
    return Image(
        src="data:image/png;base64," + base64.b64encode(data).decode("ascii"), alt=alt, width=width, height=height
    )


def _time_axis(axis: Any) -> None:
    import matplotlib.dates

    dates: Any = matplotlib.dates  # the module has no type annotations
    locator = dates.AutoDateLocator(tz=UTC)
    axis.set_major_locator(locator)
    # Ticks as wall-clock times (never a bare "10" for 10 seconds), the date once as the offset.
    formatter = dates.ConciseDateFormatter(
        locator,
        tz=UTC,
        formats=["%Y", "%Y-%m", "%Y-%m-%d", "%H:%M", "%H:%M:%S", "%H:%M:%S.%f"],
        zero_formats=["", "%Y", "%Y-%m", "%Y-%m-%d", "%H:%M", "%H:%M:%S"],
        offset_formats=["", "%Y", "%Y-%m", "%Y-%m-%d", "%Y-%m-%d", "%Y-%m-%d"],
    )
    axis.set_major_formatter(formatter)


def _dates(micros: np.ndarray) -> np.ndarray:
    import matplotlib.dates
    import numpy as np

    dates: Any = matplotlib.dates  # the module has no type annotations
    # Matplotlib plots days as floats: a double here only places a point on a chart, never decides a value.
    return np.asarray(dates.date2num(micros.view("datetime64[us]")), dtype=float)  # NEG_INF is NaT: a gap


def timeline_chart(
    key: str, batches: np.ndarray, per_origin: Mapping[int, np.ndarray], lines: Mapping[str, np.ndarray]
) -> Image:
    import matplotlib as mpl
    import numpy as np
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    marker = "o" if len(batches) <= 40 else None
    with mpl.rc_context(_STYLE):
        figure = Figure(figsize=(10.5, 4.6))
        ax: Axes = figure.add_subplot()
        # The reader time window as a band, one step per batch, so a single batch still shows.
        xs = np.repeat(batches.astype(float), 2) + np.tile([-0.45, 0.45], len(batches))
        ax.fill_between(
            xs,
            np.repeat(_dates(lines["time_window_lower"]), 2),
            np.repeat(_dates(lines["time_window_upper"]), 2),
            color="#93c5fd",
            alpha=0.35,
            linewidth=0,
            label="time window [min, max] of counted local watermarks",
        )
        # G_k under the origins: the origin holding it back is drawn on top of it, not hidden.
        ax.plot(
            batches,
            _dates(lines["global_watermark"]),
            color="#111827",
            alpha=0.75,
            linewidth=5.0,
            marker="s" if marker else None,
            markersize=7,
            label="global watermark $G_k$",
            zorder=2,
        )
        many = len(per_origin) > _LEGEND_ORIGINS
        colours = mpl.colormaps["tab10" if len(per_origin) <= 10 else "tab20"]
        for i, (origin, values) in enumerate(sorted(per_origin.items())):
            if many:  # one grey line each, one legend entry for all
                label, colour = (f"local watermarks of {len(per_origin)} origins" if i == 0 else None), "#9ca3af"
            else:
                label, colour = f"origin {origin}", mpl.colors.to_hex(colours(i % colours.N))
            ax.plot(
                batches,
                _dates(values),
                color=colour,
                linewidth=1.0 if many else 1.5,
                marker=marker,
                markersize=4,
                label=label,
                zorder=3,
            )
        ax.set_title(f"Watermarks of key '{key}' per micro-batch")
        ax.set_xlabel("micro-batch")
        ax.set_ylabel("event time (UTC)")
        if len(batches) <= 20:
            ax.set_xticks(batches.tolist())
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(batches[0] - 0.7, batches[-1] + 0.7)
        ax.margins(y=0.08)
        _time_axis(ax.yaxis)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    missing = sum(1 for v in per_origin.values() if (v == NEG_INF).all())
    alt = (
        f"Watermark timeline of key {key}: local watermark of {len(per_origin)} origin(s), the global watermark "
        f"and the time window over {len(batches)} micro-batch(es)"
        + (f"; {missing} origin(s) without a watermark yet" if missing else "")
    )
    return _png(figure, alt)


def histogram_chart(key: str, origin: int, seconds: np.ndarray, reasons: np.ndarray, edges: np.ndarray) -> Image:
    import matplotlib as mpl
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    colours = REASON_COLOURS
    kinds = sorted(set(reasons.tolist()))
    with mpl.rc_context(_STYLE):
        figure = Figure(figsize=(4.6, 2.9))
        ax: Axes = figure.add_subplot()
        ax.hist(
            [seconds[reasons == r] for r in kinds],
            bins=edges.tolist(),
            stacked=True,
            color=[colours.get(r, "#6b7280") for r in kinds],
            edgecolor="white",
            linewidth=0.4,
        )
        ax.set_title(f"origin {origin} · key '{key}' · {len(seconds):,} late")
        ax.set_xlabel("lateness (s): violated watermark − event time")
        ax.set_ylabel("late tuples")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    alt = (
        f"Lateness histogram of origin {origin}, key {key}: {len(seconds)} late tuple(s), "
        f"lateness from {seconds.min():.3f} s to {seconds.max():.3f} s"
    )
    return _png(figure, alt)


# --------------------------------------------------------------------------- rendering
