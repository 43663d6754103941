"""Exact time at every unit: the same instants give the same windows and late rows.

A boundary table (tuples on a watermark, a millisecond either side, on a window's
first and last millisecond) is archived four ways: Parquet timestamps in ms, us and
ns, and int64 epoch milliseconds under ``time_unit: ms``; the outputs must be
identical and equal the hand-computed answer. A nanosecond table then puts values
a nanosecond either side of microsecond boundaries, near 2026 and below the epoch,
and must give what the same archive truncated to microseconds (toward minus
infinity, in Python's exact ``//``) gives. A nanosecond payload column is a time
too: in the ``late`` table and under ``min``/``max`` it is a microsecond
timestamp, as the reference model has it. See docs/archive.md#timestamps.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from replay.cli import app
from replay.core.config import JobConfig, parse_config
from replay.core.errors import ReplayError
from replay.core.timeutil import parse_timestamp
from replay.engine import archive_rows, rows
from replay.quality.validate import validate
from replay.runner.loop import run
from replay.store.digest import canonical_lines, digest
from replay.store.outputs import read_table
from tests._archives import Nanos, buffer_rows, write_archive

pytestmark = pytest.mark.spark

MS: Final = 1_000  # microseconds
T0: Final = parse_timestamp("2026-01-01T00:00:13Z")
WINDOWS: Final = [
    {"name": "tumbling", "size": "1s", "aggregations": [{"fn": "count"}, {"fn": "sum", "column": "value"}]},
    {
        "name": "sliding",
        "kind": "sliding",
        "size": "2s",
        "slide": "500ms",
        "offset": "250ms",
        "aggregations": [{"fn": "count"}, {"fn": "min", "column": "value"}],
    },
]
UNITS: Final = {
    "ms": pa.timestamp("ms", tz="UTC"),
    "us": pa.timestamp("us", tz="UTC"),
    "ns": pa.timestamp("ns", tz="UTC"),
    "epoch_ms": pa.int64(),
}


def _boundary_rows(value: Any) -> list[dict[str, Any]]:
    """Origin 1 promises T0, then T0 + 1 s; origin 2 keeps up so the global watermark moves.

    ``value(micros)`` writes an instant in the archive's unit. Late by construction (origin
    mode: behind the origin's previous watermark) are the tuples at T0 - 1 ms (sequence 2)
    and T0 + 999 ms (sequence 3, behind T0 + 1 s); on time are those at T0, T0 + 1 ms,
    T0 + 1 s (on the watermark) and T0 + 1 s + 999 ms.
    """
    rows: list[dict[str, Any]] = []
    for origin in (1, 2):
        ingest = origin * 10 * MS

        def buffer(
            seq: int, wm: int, events: list[tuple[int, int, float]], origin: int = origin, ingest: int = ingest
        ) -> list[dict[str, Any]]:
            return buffer_rows(
                origin,
                seq,
                watermark=value(wm),
                ingest=value(T0 + ingest + seq * 100 * MS),
                events=[(value(t), key, v) for t, key, v in events],
            )

        rows += buffer(1, T0, [(T0 - 5_000 * MS, 1, 1.0)])
        rows += buffer(2, T0 + 1_000 * MS, [(T0 - MS, 1, 2.0), (T0, 1, 3.0), (T0 + MS, 1, 4.0)])
        rows += buffer(
            3, T0 + 3_000 * MS, [(T0 + 999 * MS, 1, 5.0), (T0 + 1_000 * MS, 1, 6.0), (T0 + 1_999 * MS, 1, 7.0)]
        )
        rows += buffer(4, T0 + 9_000 * MS, [])
    return rows


def _job(archive: Path, out: Path, **extra: Any) -> JobConfig:
    return parse_config(
        {
            "archive": str(archive),
            "output": str(out / "out"),
            "checkpoint": str(out / "ckpt"),
            "windows": WINDOWS,
            **extra,
        }
    )


def _late_view(config: JobConfig) -> list[tuple[Any, ...]]:
    """The late table with event times as microseconds whatever the column's type."""
    assert config.output is not None
    late = read_table(config.output, "late")
    rows = []
    for r in late.to_pylist():
        t = r["event_time"]
        micros = t * MS if isinstance(t, int) else parse_timestamp(t)
        rows.append((r["wm_key"], r["origin_id"], r["sequence_number"], micros, r["value"], r["reason"]))
    return sorted(rows)


@pytest.mark.parametrize("mode", ["origin", "arrival"])
def test_the_same_instants_give_the_same_outputs_in_every_unit(spark: Any, tmp_path: Path, mode: str) -> None:
    outputs: dict[str, JobConfig] = {}
    for unit, kind in UNITS.items():
        if unit == "epoch_ms":
            rows = _boundary_rows(lambda micros: micros // MS)
            extra: dict[str, Any] = {"time_unit": "ms"}
        else:
            rows = _boundary_rows(lambda micros: Nanos(micros * 1_000))
            extra = {}
        types = {"event_time": kind, "watermark_ts": kind, "ingest_ts": kind}
        write_archive(tmp_path / unit / "archive", rows, types=types)
        config = _job(tmp_path / unit / "archive", tmp_path / unit, lateness=mode, **extra)
        run(config, spark=spark)
        outputs[unit] = config

    # The answer by hand: the tuples a promise had already passed, nothing else.
    expected_late = sorted(
        ("default", origin, seq, t, v, "behind_origin_watermark" if mode == "origin" else "behind_global_watermark")
        for origin in (1, 2)
        for seq, t, v in ((2, T0 - MS, 2.0), (3, T0 + 999 * MS, 5.0))
    )
    windows = {unit: read_table(c.output, "windows") for unit, c in outputs.items()}  # type: ignore[arg-type]
    for unit, config in outputs.items():
        assert _late_view(config) == expected_late, unit
        counts = {
            (r["window"], r["window_start"].isoformat()): r["count"]
            for r in windows[unit].to_pylist()
            if r["window"] == "tumbling"
        }
        # [T0, T0 + 1 s) holds T0 and T0 + 1 ms of both origins; [T0 + 1 s, T0 + 2 s) holds
        # T0 + 1 s (on the watermark) and T0 + 1 s + 999 ms (its last millisecond).
        assert counts[("tumbling", "2026-01-01T00:00:13+00:00")] == 4, unit
        assert counts[("tumbling", "2026-01-01T00:00:14+00:00")] == 4, unit
    # Timestamp archives of any unit: byte-identical tables (same schema, same rows).
    reference = digest(outputs["us"].output)  # type: ignore[arg-type]
    for unit in ("ms", "ns"):
        assert digest(outputs[unit].output) == reference, unit  # type: ignore[arg-type]
    # Epoch milliseconds: the same windows; the late table keeps int64 event times.
    assert canonical_lines(windows["epoch_ms"], precise=True) == canonical_lines(windows["us"], precise=True)
    assert read_table(outputs["epoch_ms"].output, "late").schema.field("event_time").type == pa.int64()  # type: ignore[arg-type]
    assert read_table(outputs["ns"].output, "late").schema.field("event_time").type == pa.timestamp("us", tz="UTC")  # type: ignore[arg-type]


#: Nanosecond offsets around microsecond boundaries (the watermark itself carries 899 ns).
_SUB: Final = (-1_001, -1_000, -999, -1, 0, 1, 517, 899, 999, 1_000, 1_001)


def _nanos_rows(base_ns: int) -> list[dict[str, Any]]:
    """Origin 1 promises ``base + 899 ns``, then sends tuples at the offsets ``_SUB`` around it
    and around the end of the 1 s window that holds it."""
    window_end = (base_ns // 1_000_000_000 + 1) * 1_000_000_000
    events = [(Nanos(base_ns + d), 1, float(i)) for i, d in enumerate(_SUB)]
    events += [(Nanos(window_end + d), 2, float(100 + i)) for i, d in enumerate(_SUB)]
    return [
        *buffer_rows(1, 1, watermark=Nanos(base_ns + 899), events=[(Nanos(base_ns - 10**9), 1, -1.0)]),
        *buffer_rows(1, 2, watermark=Nanos(base_ns + 5 * 10**9 + 7), events=events),
        *buffer_rows(1, 3, watermark=Nanos(base_ns + 9 * 10**9), events=[]),
    ]


def _truncated(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same rows with every time truncated to microseconds toward minus infinity."""
    return [{k: (v // 1_000 if isinstance(v, Nanos) else v) for k, v in row.items()} for row in rows]


@pytest.mark.parametrize(
    "base_ns",
    [1_767_225_613_430_000_000, 0],
    ids=["2026", "epoch"],
)
def test_nanoseconds_give_what_their_truncation_to_microseconds_gives(spark: Any, tmp_path: Path, base_ns: int) -> None:
    ns_type = pa.timestamp("ns", tz="UTC")
    rows = _nanos_rows(base_ns)
    write_archive(tmp_path / "ns" / "archive", rows, types={"event_time": ns_type, "watermark_ts": ns_type})
    write_archive(tmp_path / "us" / "archive", _truncated(rows))
    ns = _job(tmp_path / "ns" / "archive", tmp_path / "ns")
    us = _job(tmp_path / "us" / "archive", tmp_path / "us")
    run(ns, spark=spark)
    run(us, spark=spark)
    assert digest(ns.output) == digest(us.output)  # type: ignore[arg-type]
    # By hand: the threshold is the watermark truncated, base (its 899 ns are dropped); a tuple
    # is late exactly when its own truncation is below it, i.e. at offsets below 0.
    late_values = sorted(r[4] for r in _late_view(ns))
    assert late_values == [float(i) for i, d in enumerate(_SUB) if d < 0]
    windows = read_table(ns.output, "windows").to_pylist()  # type: ignore[arg-type]
    key2 = {r["window_start"]: r["count"] for r in windows if r["window"] == "tumbling" and r["key"] == 2}
    # Around the window end: offsets below 0 (down to -1001 ns) stay in the window before it.
    assert sorted(key2.values()) == sorted([sum(d < 0 for d in _SUB), sum(d >= 0 for d in _SUB)])

    result = CliRunner().invoke(app, ["show", str(ns.output), "--table", "late"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert len(lines) == len(late_values)
    # ISO 8601 text, with microseconds only where they are not zero; no raw integers.
    for row in lines:
        for column in ("event_time", "violated_watermark"):
            assert isinstance(row[column], str) and _ISO.fullmatch(row[column]), row
    shown = {row["value"]: row["event_time"] for row in lines}
    if base_ns == 0:
        assert shown[0.0] == "1969-12-31T23:59:59.999998Z"  # -1001 ns
        assert shown[3.0] == "1969-12-31T23:59:59.999999Z"  # -1 ns
        assert {row["violated_watermark"] for row in lines} == {"1970-01-01T00:00:00.000Z"}
    else:
        assert shown[0.0] == "2026-01-01T00:00:13.429998Z"
        assert {row["violated_watermark"] for row in lines} == {"2026-01-01T00:00:13.430Z"}


_ISO: Final = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.(\d{3}|\d{6})Z")


#: A payload instant of 2026 in nanoseconds (2026-01-01T00:00:13.430Z).
_PAYLOAD_2026: Final = 1_767_225_613_430_000_000


def _payload_rows(instant: Any) -> list[dict[str, Any]]:
    """Origin 1 promises T0, then T0 + 1 s, then T0 + 9 s. Every tuple carries a payload timestamp
    ``created`` in nanoseconds (``instant(micros)`` writes the event times and watermarks): a
    nanosecond either side of microsecond boundaries, below the epoch and in 2026. Late are the
    tuples at T0 - 1 ms and T0 - 2 ms (behind T0); key 1's window at T0 holds ``created`` at
    -1000, -999, 0 and 999 ns, key 2's at 2026 and 2026 + 999 ns and a null."""

    def tuple_(t: int, key: int, created: int | None) -> dict[str, Any]:
        return {
            "event_time": instant(t),
            "key": key,
            "value": float(t % 997),
            "created": None if created is None else Nanos(created),
        }

    return [
        *buffer_rows(1, 1, watermark=instant(T0), events=[tuple_(T0 - 5_000 * MS, 1, -1_001)]),
        *buffer_rows(
            1,
            2,
            watermark=instant(T0 + 1_000 * MS),
            events=[
                tuple_(T0 - MS, 1, -1),
                tuple_(T0 - 2 * MS, 2, _PAYLOAD_2026 + 999),
                tuple_(T0, 1, -1_000),
                tuple_(T0 + MS, 1, -999),
                tuple_(T0 + 2 * MS, 1, 0),
                tuple_(T0 + 3 * MS, 1, 999),
                tuple_(T0 + 4 * MS, 2, _PAYLOAD_2026),
                tuple_(T0 + 5 * MS, 2, _PAYLOAD_2026 + 999),
                tuple_(T0 + 6 * MS, 2, None),
            ],
        ),
        *buffer_rows(1, 3, watermark=instant(T0 + 9_000 * MS), events=[]),
    ]


_PAYLOAD_WINDOWS: Final = [
    {
        "name": "w",
        "size": "1s",
        "aggregations": [
            {"fn": "count"},
            {"fn": "count", "column": "created"},
            {"fn": "min", "column": "created"},
            {"fn": "max", "column": "created"},
            {"fn": "approx_count_distinct", "column": "created"},
            {"fn": "max", "column": "event_time"},
        ],
    }
]


@pytest.mark.parametrize("only_payload", [False, True], ids=["every-time-in-ns", "only-payload-in-ns"])
def test_nanosecond_payload_timestamps_are_microsecond_timestamps_in_every_table(
    spark: Any, tmp_path: Path, only_payload: bool
) -> None:
    """A payload column of Parquet nanosecond timestamps is a time like the key columns (SPEC
    section 1): the ``late`` table and a ``min``/``max`` over it carry it as a timestamp at
    microseconds, truncated toward minus infinity, never as raw integers; ``replay run`` gives
    what the reference model gives, and what the same archive truncated to microseconds gives."""
    from tests.runner.test_job_vs_reference import output_view, reference_view, same_windows

    ns_type, us_type = pa.timestamp("ns", tz="UTC"), pa.timestamp("us", tz="UTC")
    if only_payload:  # event times and watermarks in microseconds: only ``created`` needs nanoseconds
        rows = _payload_rows(lambda micros: micros)
        types = {"created": ns_type}
    else:
        rows = _payload_rows(lambda micros: Nanos(micros * 1_000))
        types = {"event_time": ns_type, "watermark_ts": ns_type, "created": ns_type}
    write_archive(tmp_path / "ns" / "archive", rows, types=types)
    write_archive(tmp_path / "us" / "archive", _truncated(rows), types={"created": us_type})
    configs = {}
    for name in ("ns", "us"):
        settings = {
            "archive": str(tmp_path / name / "archive"),
            "output": str(tmp_path / name / "out"),
            "checkpoint": str(tmp_path / name / "ckpt"),
            "windows": _PAYLOAD_WINDOWS,
        }
        job = tmp_path / name / "job.yaml"
        job.write_text(json.dumps(settings))  # JSON is YAML
        result = CliRunner().invoke(app, ["run", "--config", str(job)])
        assert result.exit_code == 0, result.output
        configs[name] = parse_config(settings)
    ns = configs["ns"]
    assert ns.output is not None

    late, windows = read_table(ns.output, "late"), read_table(ns.output, "windows")
    micros = pa.timestamp("us", tz="UTC")
    assert late.schema.field("created").type == micros
    assert late.schema.field("event_time").type == micros
    for column in ("min_created", "max_created", "max_event_time"):
        assert windows.schema.field(column).type == micros, column
    # The same tables as the archive truncated to microseconds, byte for byte.
    assert digest(ns.output) == digest(configs["us"].output)  # type: ignore[arg-type]

    # The reference model, whole late rows and every aggregation.
    actual, expected = output_view(ns), reference_view(ns)
    assert actual["late_columns"] == expected["late_columns"] == ("event_time", "key", "value", "created")
    assert actual["late"] == expected["late"]
    same_windows(actual["windows"], expected["windows"])

    # By hand: floor(ns / 1000), so -1 ns and -1000 ns are -1 us, 999 ns is 0 us, -1001 ns is -2 us.
    def shown(table: str) -> list[dict[str, Any]]:
        result = CliRunner().invoke(app, ["show", str(ns.output), "--table", table])
        assert result.exit_code == 0, result.output
        return [json.loads(line) for line in result.output.splitlines()]

    late_created = {row["key"]: row["created"] for row in shown("late")}
    assert late_created == {1: "1969-12-31T23:59:59.999999Z", 2: "2026-01-01T00:00:13.430Z"}
    by_window = {(row["key"], row["window_start"]): row for row in shown("windows")}
    first = by_window[(1, "2026-01-01T00:00:08.000Z")]
    assert (first["min_created"], first["max_created"]) == ("1969-12-31T23:59:59.999998Z",) * 2
    key1 = by_window[(1, "2026-01-01T00:00:13.000Z")]
    assert (key1["min_created"], key1["max_created"]) == ("1969-12-31T23:59:59.999999Z", "1970-01-01T00:00:00.000Z")
    assert (key1["count_created"], key1["approx_count_distinct_created"]) == (4, 2)  # 4 values, 2 microseconds
    key2 = by_window[(2, "2026-01-01T00:00:13.000Z")]
    assert (key2["min_created"], key2["max_created"]) == ("2026-01-01T00:00:13.430Z",) * 2
    assert (key2["count"], key2["count_created"], key2["approx_count_distinct_created"]) == (3, 2, 1)
    for row in [*shown("late"), *shown("windows")]:
        for column, value in row.items():
            if "created" in column and "count" not in column:
                assert isinstance(value, str) and _ISO.fullmatch(value), (column, row)

    # The reconciliation suite recomputes the min, max and distinct count at microseconds by its own path.
    outcome = validate(ns.output, suites=["reconciliation"], spark=spark)
    assert _reconciliation(outcome)["success"], outcome.failures


def test_open_windows_holding_a_nanosecond_payload_as_integers_are_refused(spark: Any, tmp_path: Path) -> None:
    """A checkpoint written when a nanosecond payload column was raw int64 carries its ``min``,
    ``max`` and distinct set as integers in its open windows: continuing would mix them with
    timestamps, so the run stops with ``checkpoint.state`` naming each such partial."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    archive = tmp_path / "archive"
    event = {"event_time": T0 + MS, "key": 1, "value": 1.0, "created": Nanos(5_000)}
    write_archive(archive, buffer_rows(1, 1, watermark=T0, events=[event]), types={"created": pa.timestamp("ns")})
    aggregations = [{"fn": fn, "column": "created"} for fn in ("min", "max", "approx_count_distinct")]
    config = parse_config(
        {
            "archive": str(archive),
            "output": str(tmp_path / "out"),
            "checkpoint": str(tmp_path / "ckpt"),
            "windows": [{"name": "w", "size": "1s", "aggregations": [{"fn": "count"}, *aggregations]}],
        }
    )
    run(config, spark=spark)
    files = list((tmp_path / "ckpt" / "state").glob("*-open-*/*.parquet"))
    assert files  # the window at T0 is open
    for path in files:  # as the earlier Replay wrote them: nanoseconds since the epoch, as int64
        table = pq.read_table(path)
        for name in ("p1_min", "p2_max"):
            nanos = pc.multiply(pc.cast(pc.cast(table.column(name), pa.timestamp("us")), pa.int64()), 1_000)
            table = table.set_column(table.schema.get_field_index(name), name, nanos)
        table = table.set_column(
            table.schema.get_field_index("p3_set"), "p3_set", pa.array([[5_000]], pa.list_(pa.int64()))
        )
        pq.write_table(table, path)
    write_archive(archive, buffer_rows(1, 2, watermark=T0 + 2_000 * MS), name="part-00001.parquet")
    with pytest.raises(ReplayError) as raised:
        run(config, spark=spark)
    assert raised.value.code == "checkpoint.state"
    for name in ("p1_min holds bigint", "p2_max holds bigint", "p3_set holds bigint"):
        assert name in str(raised.value)


def _double_micros(df: Any, column: str, kind: str) -> Any:
    """The conversion Replay once had: nanoseconds through a double, 256 ns coarse in the 2020s."""
    from pyspark.sql import functions as F

    if kind == "ns":
        return F.floor(F.col(f"`{column}`").cast("long") / 1000).cast("long")
    return _exact_micros(df, column, kind)


_exact_micros = archive_rows.time_micros


def test_reconciliation_fails_when_the_engine_converts_time_wrongly(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reconciliation suite recomputes event times by its own path, so a conversion bug in
    the engine is a failed validation, not a shared wrong answer."""
    ns_type = pa.timestamp("ns", tz="UTC")
    write_archive(
        tmp_path / "archive",
        _nanos_rows(1_767_225_613_430_000_000),  # the watermark's 899 ns round up through a double
        types={"event_time": ns_type, "watermark_ts": ns_type},
    )
    right = _job(tmp_path / "archive", tmp_path / "right")
    run(right, spark=spark)
    outcome = validate(right.output, suites=["reconciliation"], spark=spark)  # type: ignore[arg-type]
    assert _reconciliation(outcome)["success"], outcome.failures

    monkeypatch.setattr(archive_rows, "time_micros", _double_micros)  # as time_value uses it
    monkeypatch.setattr(rows, "time_micros", _double_micros)
    wrong = _job(tmp_path / "archive", tmp_path / "wrong")
    run(wrong, spark=spark)
    assert digest(wrong.output) != digest(right.output)  # type: ignore[arg-type]
    outcome = validate(wrong.output, suites=["reconciliation"], spark=spark)  # type: ignore[arg-type]
    suite = _reconciliation(outcome)
    assert not suite["success"] and suite["failed"] >= 1
    # Windows the wrong conversion moved a tuple into, or out of (as late), differ from the recomputation.
    assert any(e["column"] == "count_mismatch" and e["unexpected_count"] >= 1 for _, e in outcome.failures)


def _reconciliation(outcome: Any) -> dict[str, Any]:
    """The reconciliation suite's record (a run of one suite is never a whole verdict)."""
    suites = [s for s in outcome.record["suites"] if s["name"] == "reconciliation"]
    assert len(suites) == 1
    return suites[0]  # type: ignore[no-any-return]
