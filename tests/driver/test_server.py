"""The kept driver in this test session's process, on its SparkSession: a run sent to it gives what
the same run gives in process (digests, summary, events), errors cross whole, runs queue, a client
that goes away cancels its run and the next run resumes from the checkpoint, and a wrong key is
refused. ``test_commands.py`` starts one as users do, in a process of its own."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterator
from importlib.metadata import version
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Listener
from pathlib import Path
from typing import Any

import pytest

from replay.core.config import JobConfig, SparkSettings, parse_config
from replay.core.errors import ConfigError, DriverError, ReplayError
from replay.driver.client import _absolute, driver_status, run_on_driver, validate_on_driver
from replay.driver.home import DriverHome
from replay.driver.server import DriverServer
from replay.driver.wire import code_digest, code_identity, request
from replay.engine.spark import job_session
from replay.generate import generate_archive
from replay.generate_options import GenerateOptions
from replay.runner.loop import run
from replay.store.digest import digest

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("driver") / "archive"
    options = GenerateOptions(origins=3, tuples=600, buffer_tuples=50, keys=4, seed=11, duplicates=2, files=3)
    generate_archive(path, options)
    return path


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Iterator[DriverServer]:
    server = DriverServer(DriverHome(tmp_path_factory.mktemp("home") / "driver"), spark)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.stop()
    thread.join(30)
    assert not thread.is_alive()
    assert not server.home.record.exists() and not server.home.key_file.exists()  # withdrawn at the end


def job(archive: Path | str, output: Path | str, **more: Any) -> JobConfig:
    aggregations = [{"fn": "count"}, {"fn": "max", "column": "value"}]
    settings = {
        "archive": str(archive),
        "output": str(output),
        "windows": [{"name": "w", "size": "200ms", "aggregations": aggregations}],
        "micro_batch": {"max_buffers": 4},
    }
    return parse_config(settings | more, source="test")


def test_a_run_on_the_driver_equals_the_run_in_process(
    archive: Path, tmp_path: Path, spark: Any, driver: DriverServer
) -> None:
    here = run(job(archive, tmp_path / "here"), spark=spark)
    events: list[tuple[str, int, int]] = []
    there = run_on_driver(driver.home, job(archive, tmp_path / "there"), on_event=lambda *e: events.append(e))
    assert digest(tmp_path / "there") == digest(tmp_path / "here")
    assert (there.batches, there.buffers, there.tuples_read, there.version) == (
        here.batches,
        here.buffers,
        here.tuples_read,
        here.version,
    )
    assert there.batches >= 3 and ("batch", there.batches, there.batches) in events
    again = run_on_driver(driver.home, job(archive, tmp_path / "there"))  # resumes: nothing new
    assert (again.batches, again.new_version, again.version) == (0, False, there.version)


def test_errors_cross_whole(archive: Path, tmp_path: Path, spark: Any, driver: DriverServer) -> None:
    with pytest.raises(ReplayError) as here:
        run(job(tmp_path / "missing", tmp_path / "a"), spark=spark)
    with pytest.raises(ReplayError) as there:
        run_on_driver(driver.home, job(tmp_path / "missing", tmp_path / "b"))
    assert type(there.value) is type(here.value)
    assert there.value.to_dict() == here.value.to_dict() | {"where": there.value.to_dict()["where"]}
    assert there.value.file == here.value.file

    with pytest.raises(ConfigError) as master:
        run_on_driver(driver.home, job(archive, tmp_path / "c", spark={"master": "local[1]"}))
    assert master.value.code == "driver.master" and "local[1]" in master.value.message
    fixed = {"conf": {"spark.driver.memory": "123g"}, "master": str(spark.sparkContext.master)}
    with pytest.raises(ConfigError) as static:
        run_on_driver(driver.home, job(archive, tmp_path / "d", spark=fixed))
    assert static.value.code == "driver.static_conf" and "spark.driver.memory" in static.value.message
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


def test_a_failed_run_names_the_driver_s_spark_log_once_spark_wrote_to_it(
    archive: Path, tmp_path: Path, driver: DriverServer, caplog: pytest.LogCaptureFixture
) -> None:
    from replay.engine.spark_log import spark_log

    log_file = spark_log()  # the driver's: this process's, its JVM started with it
    with caplog.at_level(logging.WARNING, logger="replay.driver"), pytest.raises(ReplayError):
        run_on_driver(driver.home, job(tmp_path / "missing", tmp_path / "a"))
    assert ("stack traces: " in caplog.text) == (log_file.exists() and log_file.stat().st_size > 0)
    with log_file.open("a") as written:  # as Spark appends its warnings and errors
        written.write("26/11/29 05:23:29 WARN TaskSetManager: Lost task 0.0 in stage 2.0\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="replay.driver"), pytest.raises(ReplayError):
        run_on_driver(driver.home, job(tmp_path / "missing", tmp_path / "b"))
    assert f"the kept driver's Spark warnings and errors, with their stack traces: {log_file}" in caplog.text
    run_on_driver(driver.home, job(archive, tmp_path / "c"))  # a run that succeeds names nothing
    assert caplog.text.count("stack traces") == 1


def test_a_job_session_has_the_job_s_settings_and_leaves_the_driver_s(spark: Any) -> None:
    master = str(spark.sparkContext.master)
    before = spark.conf.get("spark.sql.shuffle.partitions")
    session = job_session(spark, SparkSettings(master=master, conf={"spark.sql.shuffle.partitions": "7"}))
    assert session.conf.get("spark.sql.shuffle.partitions") == "7"
    assert session.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.shuffle.partitions") == before
    chosen = job_session(spark, SparkSettings(master=master))  # Replay's per-core choice, as get_session's
    assert chosen.conf.get("spark.sql.files.minPartitionNum") == str(2 * spark.sparkContext.defaultParallelism)


def test_runs_wait_their_turn(archive: Path, tmp_path: Path, driver: DriverServer) -> None:
    before = driver_status(driver.home)["runs"]
    results: dict[int, Any] = {}

    def send(k: int) -> None:
        try:
            results[k] = run_on_driver(driver.home, job(archive, tmp_path / f"out{k}"))
        except BaseException as error:  # asserted below
            results[k] = error

    threads = [threading.Thread(target=send, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    assert digest(tmp_path / "out0") == digest(tmp_path / "out1")
    assert driver_status(driver.home)["runs"] == before + 2


def test_a_client_that_goes_away_cancels_its_run_and_the_next_resumes(
    archive: Path, tmp_path: Path, spark: Any, driver: DriverServer
) -> None:
    run(job(archive, tmp_path / "whole"), spark=spark)
    before = driver_status(driver.home)
    details = driver.home.details()
    conn = Client((details["host"], details["port"]), authkey=details["key"])
    conn.send(request("run", job=job(archive, tmp_path / "cut"), start=None, end=None))
    while "event" not in conn.recv():  # log records may come first
        pass
    conn.close()  # the run has started, and its client goes away
    driver.wait_idle(60)
    after = driver_status(driver.home)
    assert after["failed"] == before["failed"] + 1 and after["running"] is None
    resumed = run_on_driver(driver.home, job(archive, tmp_path / "cut"))
    assert resumed.version == 1
    assert digest(tmp_path / "cut") == digest(tmp_path / "whole")


def test_a_driver_stopped_with_cancel_stops_its_run_and_the_next_resumes(
    archive: Path, tmp_path: Path, spark: Any, driver: DriverServer
) -> None:
    run(job(archive, tmp_path / "whole"), spark=spark)
    other = DriverServer(DriverHome(tmp_path / "home"), spark)
    serving = threading.Thread(target=other.serve_forever, daemon=True)
    serving.start()
    asked = threading.Event()

    def first_event(step: str, done: int, total: int) -> None:  # the run has started: stop the driver
        if not asked.is_set():
            asked.set()
            other.stop(cancel=True)

    with pytest.raises(DriverError) as stopped:
        run_on_driver(other.home, job(archive, tmp_path / "cut"), on_event=first_event)
    assert stopped.value.code == "driver.stopping"
    serving.join(30)
    assert not serving.is_alive() and not other.home.record.exists()
    assert other.status()["failed"] == 1
    resumed = run_on_driver(driver.home, job(archive, tmp_path / "cut"))
    assert resumed.version == 1
    assert digest(tmp_path / "cut") == digest(tmp_path / "whole")


def test_a_wrong_key_is_refused_and_the_driver_goes_on(archive: Path, tmp_path: Path, driver: DriverServer) -> None:
    details = driver.home.details()
    with pytest.raises(AuthenticationError):
        Client((details["host"], details["port"]), authkey=b"not the key")
    with pytest.raises(DriverError) as refused:  # a home whose key is not the driver's
        driver.home.key_file.write_bytes(b"stale")
        try:
            driver_status(driver.home)
        finally:
            driver.home.key_file.write_bytes(details["key"])
    assert refused.value.code == "driver.unreachable"
    assert driver_status(driver.home)["pid"] == os.getpid()


def test_a_client_of_other_code_is_refused_before_its_request_is_read(
    archive: Path, tmp_path: Path, driver: DriverServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an upgrade the driver still runs the code it loaded: a run or a validation is not sent."""
    served = driver_status(driver.home)["runs"]
    monkeypatch.setattr(driver, "code", "0.0.9+0123456789ab")
    with pytest.raises(DriverError) as run_refused:
        run_on_driver(driver.home, job(archive, tmp_path / "out"))
    with pytest.raises(DriverError) as validation_refused:
        validate_on_driver(driver.home, tmp_path / "out")
    for refused in (run_refused.value, validation_refused.value):
        assert refused.code == "driver.version" and refused.exit_code == 1  # a deployment's restart: retried
        assert "0.0.9+0123456789ab" in refused.message and code_identity() in refused.message
        assert "restart the driver" in (refused.todo or "")
    assert not (tmp_path / "out").exists()
    status = driver_status(driver.home)  # status answers whatever the client's code
    assert (status["code"], status["runs"]) == ("0.0.9+0123456789ab", served)
    monkeypatch.undo()
    assert run_on_driver(driver.home, job(archive, tmp_path / "out")).version == 1


def test_the_code_digest_follows_every_file_but_compiled_caches(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "sub" / "t.html.j2").write_text("<p>")
    first = code_digest([package])
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"compiled")
    assert code_digest([package]) == first
    (package / "a.py").write_text("x = 2\n")
    assert code_digest([package]) != first
    (package / "a.py").write_text("x = 1\n")
    assert code_digest([package]) == first
    (package / "sub" / "t.html.j2").rename(package / "sub" / "u.html.j2")  # the same bytes, renamed
    assert code_digest([package]) != first
    assert code_identity().startswith(version("replay") + "+")


def test_a_silent_connection_holds_up_no_other_client_and_is_hung_up_on(tmp_path: Path, spark: Any) -> None:
    """A process that connects and never answers the key challenge: the driver serves others
    meanwhile, and hangs up on it when the challenge's bound passes."""
    server = DriverServer(DriverHome(tmp_path / "home"), spark, handshake_timeout=2)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        with socket.create_connection(server.address, timeout=60) as silent:
            assert driver_status(server.home, timeout=30)["pid"] == os.getpid()
            heard = b""
            while chunk := silent.recv(4096):  # the challenge, then the end when the bound passes
                heard += chunk
        assert heard  # it was challenged, and then hung up on (no timeout above)
        assert driver_status(server.home, timeout=30)["runs"] == 0
    finally:
        server.stop()
        serving.join(30)
    assert not serving.is_alive()


def test_a_peer_that_never_answers_the_challenge_is_unreachable_in_time(tmp_path: Path) -> None:
    """Something that is not the driver listens at the published address and says nothing."""
    home = DriverHome(tmp_path / "home")
    with socket.create_server(("127.0.0.1", 0)) as mute:
        home.new_key()
        home.publish({"pid": os.getpid(), "host": "127.0.0.1", "port": mute.getsockname()[1]})
        with pytest.raises(DriverError) as silent:
            driver_status(home, timeout=1)
    assert silent.value.code == "driver.unreachable" and "HandshakeTimeout" in silent.value.message


def test_a_driver_that_ends_before_it_answers_is_unreachable(tmp_path: Path) -> None:
    """The handshake passes, then the process goes (killed, or stopping) before its answer."""
    home = DriverHome(tmp_path / "home")
    with Listener(("127.0.0.1", 0), authkey=home.new_key()) as listener:
        home.publish({"pid": os.getpid(), "host": "127.0.0.1", "port": listener.address[1]})

        def answer_nothing() -> None:
            listener.accept().close()

        thread = threading.Thread(target=answer_nothing, daemon=True)
        thread.start()
        with pytest.raises(DriverError) as gone:
            driver_status(home)
        thread.join(30)
    assert gone.value.code == "driver.unreachable" and "EOFError" in gone.value.message


def test_relative_paths_are_resolved_by_the_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    given = job("archive", "file:out", checkpoint="s3a://bucket/ckpt")
    sent = _absolute(given)
    assert (sent.archive, sent.output) == (str(tmp_path / "archive"), str(tmp_path / "out"))
    assert sent.checkpoint == "s3a://bucket/ckpt"  # not a local path: as given
    assert _absolute(job(tmp_path / "a", "file:///abs/out")).output == "file:///abs/out"


def test_no_driver_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DriverError) as none:
        run_on_driver(DriverHome(tmp_path / "nothing"), job(tmp_path, tmp_path / "o"))
    assert none.value.code == "driver.unreachable" and "replay driver serve" in none.value.message
    assert none.value.exit_code == 1  # operational: a scheduler retries it


def _verdicts(record: dict[str, Any]) -> list[tuple[str, list[tuple[str, str, bool, Any, Any]]]]:
    return [
        (
            s["name"],
            [
                (e["type"], str(e["column"]), e["success"], e["element_count"], e["observed_value"])
                for e in s["expectations"]
            ],
        )
        for s in record["suites"]
    ]


def test_a_validation_on_the_driver_gives_the_verdict_given_in_process(
    archive: Path, tmp_path: Path, spark: Any, driver: DriverServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``replay validate --driver`` (and ``validate_on_driver``): the same verdict, record and Data Docs
    as in process, a relative output is the client's, and errors cross whole."""
    from typer.testing import CliRunner

    from replay.cli import app
    from replay.quality.validate import validate

    run(job(archive, tmp_path / "out"), spark=spark)
    here = validate(tmp_path / "out", spark=spark)
    assert here.success and sum(s["evaluated"] for s in here.record["suites"]) > 10
    monkeypatch.chdir(tmp_path)
    served = driver_status(driver.home)["runs"]
    steps: list[tuple[str, int, int]] = []
    there = validate_on_driver(driver.home, "out", on_step=lambda *e: steps.append(e))
    assert driver_status(driver.home)["runs"] == served + 1  # the driver validated it, not this process
    assert (there.success, there.version, there.data_docs) == (here.success, here.version, here.data_docs)
    assert Path(there.output) == tmp_path / "out"
    assert _verdicts(there.record) == _verdicts(here.record)
    assert [step for step, _, _ in steps] == [*(f"suite {s['name']}" for s in here.record["suites"]), "done"]
    with pytest.raises(ConfigError) as unknown:
        validate_on_driver(driver.home, "out", suites=["nope"])
    assert unknown.value.code == "validate.unknown_suite" and "nope" in unknown.value.message

    sent = CliRunner().invoke(
        app, ["validate", "out", "--suite", "windows"], env={"REPLAY_DRIVER": str(driver.home.path)}
    )
    assert sent.exit_code == 0, sent.output
    assert driver_status(driver.home)["runs"] == served + 3
    nowhere = CliRunner().invoke(app, ["validate", "out", "--driver", str(tmp_path / "no-driver")])
    assert nowhere.exit_code == 1 and "[driver.unreachable]" in nowhere.output


def test_the_airflow_operator_s_kept_driver_engine(
    archive: Path, tmp_path: Path, spark: Any, driver: DriverServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``engine: kept_driver`` sends the planned run (and the validation) to the driver ``REPLAY_DRIVER``
    names: the same summary and output as ``in_task``; with no driver there, the task fails and is retried."""
    pytest.importorskip("airflow")
    from airflow.sdk.exceptions import AirflowFailException

    from replay_airflow.operators import ReplayRunOperator, ReplayValidateOperator
    from replay_airflow.params import ResolvedJob

    def plan(output: Path, engine: str) -> dict[str, Any]:
        resolved = ResolvedJob(config=job(archive, output), start=None, end=None, range_source="none", engine=engine)
        return resolved.to_xcom()

    monkeypatch.setenv("REPLAY_DRIVER", str(driver.home.path))
    served = driver_status(driver.home)["runs"]
    sent = ReplayRunOperator(task_id="replay", plan=plan(tmp_path / "sent", "kept_driver")).execute({})
    here = ReplayRunOperator(task_id="replay", plan=plan(tmp_path / "here", "in_task")).execute({})
    assert digest(tmp_path / "sent") == digest(tmp_path / "here")
    assert {k: v for k, v in sent.items() if k not in ("output", "checkpoint", "seconds")} == {
        k: v for k, v in here.items() if k not in ("output", "checkpoint", "seconds")
    }
    assert driver_status(driver.home)["runs"] == served + 1  # the driver ran it, not this process
    # The validate task of a DAG run of engine kept_driver validates on the driver too.
    checked = ReplayValidateOperator(task_id="validate", source=sent).execute({"params": {"engine": "kept_driver"}})
    assert checked["success"] and checked["revalidated"] and checked["version"] == sent["version"]
    assert driver_status(driver.home)["runs"] == served + 2
    monkeypatch.setenv("REPLAY_DRIVER", str(tmp_path / "no-driver"))
    with pytest.raises(DriverError) as missing:  # not AirflowFailException: Airflow retries it
        ReplayRunOperator(task_id="replay", plan=plan(tmp_path / "none", "kept_driver")).execute({})
    assert not isinstance(missing.value, AirflowFailException) and missing.value.code == "driver.unreachable"


def test_the_command_sends_the_run_to_the_driver_except_under_spark_submit(
    archive: Path, tmp_path: Path, spark: Any, driver: DriverServer
) -> None:
    """``replay run --driver`` (or ``REPLAY_DRIVER``) runs on the driver; under spark-submit (a
    Python process spark-submit started: ``PYSPARK_GATEWAY_PORT``) the run takes that session, so a
    worker's ``REPLAY_DRIVER`` does not turn the Airflow engine spark_submit into kept_driver."""
    import yaml
    from typer.testing import CliRunner

    from replay.cli import app

    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job(archive, tmp_path / "out").model_dump(mode="json")))
    served = driver_status(driver.home)["runs"]
    sent = CliRunner().invoke(
        app, ["run", "-c", str(tmp_path / "job.yaml")], env={"REPLAY_DRIVER": str(driver.home.path)}
    )
    assert sent.exit_code == 0, sent.output
    assert driver_status(driver.home)["runs"] == served + 1
    nowhere = {"REPLAY_DRIVER": str(tmp_path / "no-driver")}
    refused = CliRunner().invoke(app, ["run", "-c", str(tmp_path / "job.yaml")], env=nowhere)
    assert refused.exit_code == 1 and "[driver.unreachable]" in refused.output
    submitted = CliRunner().invoke(
        app,
        ["run", "-c", str(tmp_path / "job.yaml"), "--output", str(tmp_path / "o2")],
        env=nowhere | {"PYSPARK_GATEWAY_PORT": "1"},
    )
    assert submitted.exit_code == 0, submitted.output  # in this process, on its (active) session
    assert driver_status(driver.home)["runs"] == served + 1
    assert digest(tmp_path / "o2") == digest(tmp_path / "out")
