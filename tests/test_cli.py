"""The ``replay`` command line: generate and inspect, exit codes, clean JSON on stdout."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from replay.cli import app

runner = CliRunner()
GENERATE = [
    "--origins",
    "3",
    "--tuples",
    "3000",
    "--buffer-tuples",
    "50",
    "--files",
    "3",
    "--gaps",
    "2",
    "--duplicates",
    "2",
    "--multi-chunk-fraction",
    "0.3",
    "--late-fraction",
    "0.02",
    "--seed",
    "7",
]


_SHORT_LINE = re.compile(
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (INFO|WARNING) |\d\d/\d\d/\d\d \d\d:\d\d:\d\d (WARN|ERROR) \w+: |replay: "
    r"|WARNING: Using incubator modules)"
)


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = [(path, group)]
    for name, command in getattr(group, "commands", {}).items():
        found += _commands(command, (*path, name))
    return found


def test_help_shows_no_value_after_a_flag() -> None:
    """A flag takes no value, so its help line shows none: ``--json`` alone, not ``--json <bool>``."""
    import typer.main

    flags = 0
    for path, command in _commands(typer.main.get_command(app)):
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"}, terminal_width=200)
        assert result.exit_code == 0, (path, result.output)
        lines = result.output.splitlines()
        params = [
            *command.params,
            command.get_help_option(command.make_context("replay", ["--help"], resilient_parsing=True)),
        ]
        for param in params:
            if not getattr(param, "is_flag", False):
                continue
            for name in param.opts:
                line = next(line for line in lines if re.search(rf"(^|[\s,│]){re.escape(name)}(\s|,|$)", line))
                shown = line.split(name, 1)[1].split()
                assert not shown or not shown[0].startswith("<"), (path, line)
                flags += 1
    assert flags > 20  # every command's --help, and the commands' own flags


def replay(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The installed entry point, as a user runs it (its own JVM)."""
    return subprocess.run(
        [sys.executable, "-m", "replay.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
        timeout=300,
    )


@pytest.mark.spark
def test_generate_then_inspect_reports_what_was_injected(tmp_path: Path, spark: Any) -> None:
    archive = tmp_path / "archive"
    result = runner.invoke(app, ["generate", str(archive), *GENERATE])
    assert result.exit_code == 0, result.output
    assert "gaps 2, duplicates 2" in result.output
    result = runner.invoke(app, ["inspect", str(archive), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["lateness"] == "arrival" and data["files"] == 3
    assert len(data["integrity"]["gaps"]) == 2
    assert len(data["integrity"]["duplicates"]) == 2 and data["integrity"]["conflicts"] == []
    assert {row["origin_id"] for row in data["origins"]} == {1, 2, 3}
    gapped = {g["origin_id"] for g in data["integrity"]["gaps"]}
    for row in data["origins"]:
        assert (row["pending_buffers"] > 0) == (row["origin_id"] in gapped)
    table = runner.invoke(app, ["inspect", str(archive)])
    assert table.exit_code == 0 and "Progress per origin and key" in table.stdout


@pytest.mark.spark
def test_inspect_exits_1_on_findings_that_would_stop_a_run(tmp_path: Path, spark: Any) -> None:
    archive = tmp_path / "archive"
    assert runner.invoke(app, ["generate", str(archive), "--conflicts", "1", "--tuples", "500"]).exit_code == 0
    result = runner.invoke(app, ["inspect", str(archive), "--json"])
    assert result.exit_code == 1
    assert len(json.loads(result.stdout)["integrity"]["conflicts"]) == 1
    assert "on_conflict: keep_first" in result.stderr
    job = tmp_path / "job.yaml"
    job.write_text(f"archive: {archive}\non_conflict: keep_first\n")
    assert runner.invoke(app, ["inspect", "--config", str(job), "--json"]).exit_code == 0


def test_inspect_names_the_first_conflict_and_regression(tmp_path: Path) -> None:
    from tests._archives import buffer_rows, write_archive

    t0 = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z
    archive = tmp_path / "archive"
    regressing = [
        *buffer_rows(2, 1, watermark=t0 + 20_000_000, ingest=t0, events=[(t0, 1, 1.0)]),
        *buffer_rows(2, 2, watermark=t0 + 10_000_000, ingest=t0 + 1, events=[(t0, 1, 1.0)]),
    ]
    first = write_archive(archive, buffer_rows(1, 1, watermark=t0, ingest=t0, events=[(t0, 1, 1.0)]) + regressing)
    other = write_archive(
        archive, buffer_rows(1, 1, watermark=t0, ingest=t0 + 2, events=[(t0, 1, 2.0)]), name="part-00001.parquet"
    )
    result = runner.invoke(app, ["inspect", str(archive)])
    assert result.exit_code == 1
    assert "[archive.conflicting_duplicate]" in result.stderr
    assert "1 conflicting duplicate, the first origin 1 sequence 1 chunk 1 in" in result.stderr
    assert str(first) in result.stderr and str(other) in result.stderr
    assert (
        "1 watermark regression, the first origin 2 sequence 2 key 'default' going back from "
        "2026-01-01T00:00:20.000Z to 2026-01-01T00:00:10.000Z" in result.stderr
    )
    assert "watermark_regression: clamp" in result.stderr


def test_usage_and_configuration_errors_exit_2(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("archive: x\nwindows: [{name: w, size: 0s, aggregations: [{fn: count}]}]\n")
    result = runner.invoke(app, ["inspect", "--config", str(job)])
    assert result.exit_code == 2
    assert "window size must be positive" in result.stderr and str(job) in result.stderr
    assert runner.invoke(app, ["inspect"]).exit_code == 2
    assert runner.invoke(app, ["generate", str(tmp_path / "g"), "--origins", "0"]).exit_code == 2
    assert runner.invoke(app, ["generate"]).exit_code == 2
    for value in ("yesterday", "2026-01-01T00:00:00"):  # not ISO 8601; no UTC offset
        bad = runner.invoke(app, ["run", "--config", str(job), "--start", value])
        text = " ".join(bad.stderr.replace("│", " ").split())  # out of rich's box, unwrapped
        assert bad.exit_code == 2 and text.count("e.g. 2026-01-01T00:00:00Z") == 1, text


def test_data_errors_exit_1_with_the_message_on_stderr(tmp_path: Path) -> None:
    (tmp_path / "archive").mkdir()
    (tmp_path / "archive" / "part-0.parquet").write_bytes(b"PAR1 not really")
    result = runner.invoke(app, ["inspect", str(tmp_path / "archive")])
    assert result.exit_code == 1
    assert "part-0.parquet" in result.stderr and "What to do" in result.stderr


@pytest.mark.slow
def test_entry_point_json_is_pure(tmp_path: Path) -> None:
    """In its own process, with its own JVM: stdout holds the JSON document and nothing else."""
    archive = tmp_path / "archive"
    assert replay("generate", str(archive), "--tuples", "400", "--no-ingest-ts").returncode == 0
    result = replay("inspect", str(archive), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["lateness"] == "origin" and data["tuples_read"] == 400
    assert "INFO" in result.stderr  # progress goes to stderr as log lines when not on a terminal


def test_version() -> None:
    from replay.driver.wire import code_identity

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.startswith("replay 0.")
    assert result.stdout.strip() == f"replay {code_identity()}"  # what a kept driver compares


@pytest.mark.spark
def test_run_status_digest_show_and_their_errors(tmp_path: Path, spark: Any) -> None:
    archive = tmp_path / "archive"
    assert runner.invoke(app, ["generate", str(archive), *GENERATE]).exit_code == 0
    job = tmp_path / "job.yaml"
    job.write_text(
        f"archive: {archive}\noutput: {tmp_path / 'out'}\ncheckpoint: {tmp_path / 'ckpt'}\n"
        "windows: [{name: w, size: 500ms, aggregations: [{fn: count}, {fn: max, column: value}]}]\n"
    )
    result = runner.invoke(app, ["run", "--config", str(job), "--max-buffers", "20", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["version"] == 1 and summary["batches"] > 1 and summary["duplicate_copies"] == 2
    status = runner.invoke(app, ["status", "--checkpoint", str(tmp_path / "ckpt"), "--json"])
    assert status.exit_code == 0, status.output
    data = json.loads(status.stdout)
    assert data["finished"] and data["versions"] == [1] and set(data["stream_cut"]) == {"1", "2", "3"}
    assert data["keys"][0]["key"] == "default" and data["open_windows"]["w"] >= 0
    assert [len(g) for g in data["gaps"]] == [2, 2]  # the two generated gaps, as [origin, sequence]
    digest = runner.invoke(app, ["digest", str(tmp_path / "out"), "--version", "1"])
    assert digest.exit_code == 0 and len(digest.stdout.splitlines()) == 5
    show = runner.invoke(app, ["show", str(tmp_path / "out"), "--table", "integrity", "--format", "csv"])
    assert show.exit_code == 0 and show.stdout.splitlines()[0].startswith("kind,origin_id")
    assert sum(line.startswith("duplicate,") for line in show.stdout.splitlines()) == 2
    # Usage and configuration errors exit 2, with the error's code on stderr.
    bad = runner.invoke(app, ["show", str(tmp_path / "out"), "--table", "windows", "--format", "xml"])
    assert bad.exit_code == 2 and "output.bad_format" in bad.stderr
    assert runner.invoke(app, ["digest", str(tmp_path / "out"), "--version", "9"]).exit_code == 2
    missing = runner.invoke(app, ["status", "--checkpoint", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "checkpoint.missing" in missing.stderr
    assert runner.invoke(app, ["run", "--config", str(job), "--start", "yesterday"]).exit_code == 2


@pytest.mark.spark
def test_run_writes_its_summary_or_its_error_to_the_summary_file(tmp_path: Path, spark: Any) -> None:
    """What spark-submit callers read (the DAGs' spark_submit engine): the summary, or the error whole."""
    archive = tmp_path / "archive"
    generated = ["generate", str(archive), "--tuples", "600", "--buffer-tuples", "50", "--files", "2"]
    assert runner.invoke(app, [*generated, "--conflicts", "1", "--seed", "3"]).exit_code == 0
    job = tmp_path / "job.yaml"
    settings = f"archive: {archive}\noutput: {tmp_path / 'out'}\ncheckpoint: {tmp_path / 'ckpt'}\n"
    windows = "windows: [{name: w, size: 500ms, aggregations: [{fn: count}]}]\n"
    job.write_text(settings + windows)
    summary_file = tmp_path / "summary.json"
    failed = runner.invoke(app, ["run", "--config", str(job), "--summary-file", str(summary_file)])
    assert failed.exit_code == 1
    error = json.loads(summary_file.read_text())["error"]
    assert error["code"] == "archive.conflicting_duplicate" and error["kind"] == "ConflictingDuplicateError"
    assert error["message"] in failed.stderr and error["todo"] and error["where"]["origin"] is not None

    # A setting that changes results needs a checkpoint of its own.
    settings = f"archive: {archive}\noutput: {tmp_path / 'out2'}\ncheckpoint: {tmp_path / 'ckpt2'}\n"
    job.write_text(settings + windows + "on_conflict: keep_first\n")
    done = runner.invoke(app, ["run", "--config", str(job), "--summary-file", str(summary_file), "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(summary_file.read_text()) == {"summary": json.loads(done.stdout)}
    assert not list(tmp_path.glob("*.tmp"))


def test_a_run_on_spark_with_speculative_task_attempts_is_refused_before_it_writes(tmp_path: Path) -> None:
    """A speculative copy of a pass's task could add a file to a batch already committed: a session
    with ``spark.speculation`` on is refused (exit 2, the setting and what to do named), in a
    process of its own as a user runs it, and nothing is written to the output."""
    archive = tmp_path / "archive"
    assert runner.invoke(app, ["generate", str(archive), "--tuples", "200", "--buffer-tuples", "50"]).exit_code == 0
    job = tmp_path / "job.yaml"
    job.write_text(
        f"archive: {archive}\noutput: {tmp_path / 'out'}\ncheckpoint: {tmp_path / 'ckpt'}\n"
        "windows: [{name: w, size: 500ms, aggregations: [{fn: count}]}]\n"
        "spark: {conf: {spark.speculation: 'true'}}\n"
    )
    refused = replay("run", "--config", str(job))
    assert refused.returncode == 2, refused.stderr
    assert "spark.speculation" in refused.stderr and "set spark.speculation=false" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "out" / "versions").exists()


def test_python_dash_m_replay_is_the_replay_command() -> None:
    for module in ("replay", "replay.__main__"):
        result = subprocess.run(
            [sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0 and result.stdout.startswith("replay 0."), result.stderr
    # As a file (how spark-submit runs it): its folder does not shadow top-level modules.
    main = Path(__file__).resolve().parents[1] / "replay" / "__main__.py"
    result = subprocess.run([sys.executable, str(main), "--version"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("replay 0."), result.stderr


@pytest.mark.spark
def test_an_output_location_that_cannot_be_written_is_a_clear_error(tmp_path: Path, spark: Any) -> None:
    archive = tmp_path / "archive"
    assert runner.invoke(app, ["generate", str(archive), *GENERATE]).exit_code == 0
    (tmp_path / "a-file").write_text("")
    job = tmp_path / "job.yaml"
    job.write_text(f"archive: {archive}\noutput: {tmp_path / 'a-file' / 'out'}\n")
    result = runner.invoke(app, ["run", "--config", str(job)])  # refused before any work
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)  # not a traceback
    text = " ".join(result.stderr.split())
    assert "[config.not_a_directory]" in text and f"under {tmp_path / 'a-file'}, which is a file" in text
    assert "Traceback" not in result.stderr
    generated = runner.invoke(app, ["generate", str(tmp_path / "a-file" / "archive"), *GENERATE])
    assert generated.exit_code == 1 and "[storage.io]" in generated.stderr and "generate it again" in generated.stderr


@pytest.mark.spark
def test_a_run_s_spark_ends_with_the_command(tmp_path: Path, spark: Any) -> None:
    """When ``replay run`` returns, its JVM and Spark's Python workers have ended: the application
    (a cluster's executors, the event log) is not left to end after the command, on the cores of
    whatever runs next. Every process the command starts is in its session."""
    import psutil

    archive = tmp_path / "archive"
    assert runner.invoke(app, ["generate", str(archive), *GENERATE]).exit_code == 0
    job = tmp_path / "job.yaml"
    job.write_text(f"archive: {archive}\noutput: {tmp_path / 'out'}\ncheckpoint: {tmp_path / 'ckpt'}\n")
    command = subprocess.Popen(
        [sys.executable, "-m", "replay.cli", "run", "--config", str(job), "--max-buffers", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    started: dict[int, str] = {}  # what the command started while it ran, by pid
    while command.poll() is None:
        with contextlib.suppress(psutil.Error):
            started |= {child.pid: child.name() for child in psutil.Process(command.pid).children(recursive=True)}
        time.sleep(0.05)
    _, err = command.communicate()
    assert command.returncode == 0, err
    assert "java" in started.values()  # it did start its own JVM
    # The JVM and Python processes (Spark's workers) the command started; a zombie (ended, its exit
    # status not yet collected by the system's init) does not count, nor do the launcher's shells.
    left = []
    for process in psutil.process_iter(["name", "status", "cmdline"]):
        with contextlib.suppress(psutil.Error, OSError):
            ours = os.getsid(process.pid) == command.pid and process.info["status"] != psutil.STATUS_ZOMBIE
            if ours and process.info["name"].startswith(("java", "python")):
                left.append((process.pid, process.info["name"], " ".join(process.info["cmdline"] or [])[:200]))
    assert left == []


@pytest.mark.spark
def test_a_failure_in_spark_s_tasks_shows_as_replay_s_error_its_traces_in_the_named_log(
    tmp_path: Path, spark: Any
) -> None:
    """A damaged file fails in the pass's Spark tasks. The terminal gets Spark's warnings and errors
    a line each, then Replay's error; their stack traces go to the command's Spark log, which the
    command names (before: some 130 lines of Java traces ahead of the error)."""
    from tests._archives import damage_pages

    archive = tmp_path / "archive"
    assert runner.invoke(app, ["generate", str(archive), *GENERATE]).exit_code == 0
    damaged = sorted(archive.glob("*.parquet"))[-1]
    damage_pages(damaged)
    job = tmp_path / "job.yaml"
    job.write_text(f"archive: {archive}\noutput: {tmp_path / 'out'}\ncheckpoint: {tmp_path / 'ckpt'}\n")
    logs = tmp_path / "logs"
    result = subprocess.run(
        [sys.executable, "-m", "replay.cli", "run", "--config", str(job)],
        capture_output=True,
        text=True,
        env=os.environ | {"REPLAY_LOG_DIR": str(logs)},
        timeout=300,
    )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    assert any("[archive.unreadable]" in line and str(damaged) in line for line in lines)
    assert any(" ERROR Executor: Exception in task" in line for line in lines)
    # Every line is one of Replay's (its log, its error), one of Spark's log lines, or the JVM's one
    # start-up warning: no trace, Java's or a Python worker's, nor a message's further lines.
    assert [line for line in lines if not _SHORT_LINE.match(line)] == []
    assert not [line for line in lines if "Traceback" in line]  # not even a traceback's first line
    written = list(logs.glob("spark-*.log"))
    assert len(written) == 1 and lines[-1].endswith(f"with their stack traces: {written[0]}")
    traces = written[0].read_text()
    assert "Exception in task" in traces and "\tat org.apache.spark" in traces  # the JVM's trace
    assert "Traceback (most recent call last)" in traces and "deserialize" in traces  # the Python worker's


@pytest.mark.spark
def test_a_backfill_keeps_a_checkpoint_of_its_own_beside_the_job_s(tmp_path: Path, spark: Any) -> None:
    """The job file's checkpoint is its replay of the whole archive's: ``--start/--end`` without
    ``--checkpoint`` keeps the range's beside it, so the backfill runs after the full replay, and
    again with nothing new; ``--checkpoint`` names one outright."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from replay.core.paths import range_checkpoint
    from replay.core.timeutil import format_ts

    archive = tmp_path / "archive"
    assert runner.invoke(app, ["generate", str(archive), *GENERATE]).exit_code == 0
    job = tmp_path / "job.yaml"
    job.write_text(
        f"archive: {archive}\noutput: {tmp_path / 'out'}\ncheckpoint: {tmp_path / 'ckpt'}\n"
        "windows: [{name: w, size: 500ms, aggregations: [{fn: count}]}]\n"
    )
    assert runner.invoke(app, ["run", "--config", str(job)]).exit_code == 0
    times = ds.dataset(archive).to_table(columns=["event_time"])["event_time"].cast("int64")
    low, high = pc.min(times).as_py(), pc.max(times).as_py()
    start, end = low + (high - low) // 4, low + (high - low) // 2
    backfill = ["run", "--config", str(job), "--start", str(format_ts(start)), "--end", str(format_ts(end)), "--json"]
    first = runner.invoke(app, backfill)
    assert first.exit_code == 0, first.output
    summary = json.loads(first.stdout)
    assert summary["checkpoint"] == range_checkpoint(str(tmp_path / "ckpt"), start, end)
    assert summary["version"] == 2 and summary["new_version"]
    again = json.loads(runner.invoke(app, backfill).stdout)
    assert again["version"] == 2 and not again["new_version"] and again["batches"] == 0
    named = runner.invoke(app, [*backfill, "--checkpoint", str(tmp_path / "mine")])
    assert named.exit_code == 0 and json.loads(named.stdout)["checkpoint"] == str(tmp_path / "mine")
