"""Crash and resume, and the single-writer lock, with real processes and real SIGKILLs.

``replay run`` runs as a subprocess (its own JVM) and is killed with SIGKILL at
chosen points (``REPLAY_FAULT=<point>:<batch>`` makes the process kill itself
there: before the intent, after the intent, after staging, during the commit)
and at a random moment; the resumed run must give the digest of an uninterrupted
run, and its checkpoint must hold every buffer exactly once. And Spark's own
retries: task attempts of the pass's writer that fail after writing their files.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from replay.core.config import load_config
from replay.core.errors import ConcurrentWriterError
from replay.generate import generate_archive
from replay.generate_options import GenerateOptions
from replay.runner.loop import run
from replay.store import state as _state
from replay.store.checkpoint import CheckpointStore
from replay.store.digest import digest
from replay.store.durable import temporary
from tests._faults import flaky_command, flaky_env, flaky_run

pytestmark = pytest.mark.spark

REPLAY = str(Path(sys.executable).with_name("replay"))
DETERMINISTIC = ("windows", "late", "integrity")


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """900 tuples in 14 buffers of up to 75 (two with a duplicate copy, some chunked, some late tuples):
    3 batches of at most 5 buffers, so a crash in batch 2 leaves a committed batch behind it and one
    more after it. Every batch costs a few seconds whatever its size, and each test replays the rest
    after the crash: few large buffers keep that short with as many windows and late tuples as before."""
    path = tmp_path_factory.mktemp("crash") / "archive"
    summary = generate_archive(
        path,
        GenerateOptions(
            origins=3,
            tuples=900,
            buffer_tuples=75,
            keys=5,
            seed=3,
            duplicates=2,
            late_fraction=0.05,
            multi_chunk_fraction=0.3,
            files=3,
        ),
    )
    assert summary.buffers >= 13 and summary.duplicates and summary.late_tuples
    return path


def write_job(directory: Path, archive: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    job = {
        "archive": str(archive),
        "output": str(directory / "out"),
        "checkpoint": str(directory / "ckpt"),
        "windows": [
            {"name": "w", "size": "300ms", "aggregations": [{"fn": "count"}, {"fn": "sum", "column": "value"}]}
        ],
        "micro_batch": {"max_buffers": 5},
    }
    path = directory / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def replay_run(job: Path, fault: str | None = None) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.pop("REPLAY_FAULT", None)
    if fault:
        env["REPLAY_FAULT"] = fault
    return subprocess.Popen(
        [REPLAY, "run", "--config", str(job)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.fixture(scope="module")
def uninterrupted(archive: Path, tmp_path_factory: pytest.TempPathFactory, spark: Any) -> dict[str, str]:
    job = write_job(tmp_path_factory.mktemp("clean"), archive)
    config = load_config(job)
    assert run(config, spark=spark).batches >= 3  # a crash in batch 2 has batches on both sides
    assert config.output is not None
    found = digest(config.output)
    return {t: found[t] for t in DETERMINISTIC}


def assert_ledger_whole(checkpoint: Path, archive_buffers: int) -> None:
    """Every buffer of the archive is in the checkpoint exactly once (no duplicate, none missing)."""
    store = CheckpointStore(checkpoint)
    commit = store.latest()
    assert commit is not None
    identities = []
    for entry in store.read_log(commit.log):
        identities += [b.identity for b in _state.read_buffers(checkpoint / entry.buffers, 1)]
    assert len(identities) == len(set(identities)) == archive_buffers
    ledger = commit.ledger
    assert ledger["read_xor"] == ledger["processed_xor"] ^ ledger["discarded_xor"]
    assert commit.pending_buffers == 0


@pytest.mark.parametrize(
    ("point", "batch"),
    [("before_intent", 1), ("after_intent", 1), ("before_batch", 2), ("after_staging", 2), ("during_commit", 2)],
)
def test_sigkill_at_each_point_then_resume_equals_an_uninterrupted_run(
    archive: Path, tmp_path: Path, spark: Any, uninterrupted: dict[str, str], point: str, batch: int
) -> None:
    """Before and after the run's intent (which records its files and cut, before batch 1), and
    before, in and after the staging of batch 2 (batch 1 committed)."""
    job = write_job(tmp_path, archive)
    crashed = replay_run(job, fault=f"{point}:{batch}")
    _, err = crashed.communicate(timeout=300)
    assert crashed.returncode == -signal.SIGKILL, err
    config = load_config(job)
    store = CheckpointStore(tmp_path / "ckpt")
    assert store.commits() == list(range(1, batch))  # the batches before it committed, it not
    if batch > 1:
        # The run is one pass (docs/outputs.md#passes): batch 1's commit is inside it, so the resume
        # below rebuilds the open windows from the copies that commit carries.
        assert store.commit_record(batch - 1).carry
    assert (tmp_path / "ckpt" / "runs" / "00000001.json").exists() == (point != "before_intent")
    # What a writer stopped between writing a file and its rename leaves: its temporary file.
    ckpt = tmp_path / "ckpt"
    left = [temporary(ckpt / "commits" / f"{batch:08d}.json"), temporary(ckpt / "runs" / "00000002.json")]
    left += [temporary(ckpt / "state" / f"b{batch:08d}-x-buffers.parquet"), ckpt / "scan-cache" / "0a1b.tmp"]
    for path in left:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"PAR1 partial")
    summary = run(config, spark=spark)
    assert not any(path.exists() for path in left)
    assert "removed 4 temporary file(s) a stopped writer left" in summary.notes
    assert summary.resumed == (point != "before_intent")  # before the intent nothing was written
    assert config.output is not None
    found = digest(config.output)
    assert {t: found[t] for t in DETERMINISTIC} == uninterrupted
    assert config.checkpoint is not None
    total = len({b.identity for b in _kept_buffers(spark, config)})
    assert_ledger_whole(Path(config.checkpoint), total)
    # No staged file of the crashed attempt is left behind.
    referenced = _referenced_outputs(config.output)
    on_disk = {
        str(p.relative_to(config.output))
        for t in ("windows", "late")
        for p in (Path(config.output) / "data" / t).glob("*")
    }
    assert on_disk <= referenced


def test_a_stop_between_a_runs_last_commit_and_its_version_is_caught_up_by_the_next_run(
    archive: Path, tmp_path: Path, spark: Any
) -> None:
    """Killed after its last commit and before its output version: the next run, which finds a new
    file and so starts a run of its own, first writes the version the stopped run left unwritten
    (so a later failure of the new run cannot keep it from being validated and published)."""
    import shutil

    files = sorted(archive.glob("*.parquet"))
    assert len(files) >= 3
    first = tmp_path / "archive"
    first.mkdir()
    for f in files[:-1]:
        shutil.copy(f, first / f.name)
    clean = load_config(write_job(tmp_path / "clean", first))
    batches = run(clean, spark=spark).batches
    assert clean.output is not None
    job = write_job(tmp_path / "stopped", first)
    crashed = replay_run(job, fault=f"before_version:{batches}")
    _, err = crashed.communicate(timeout=300)
    assert crashed.returncode == -signal.SIGKILL, err
    config = load_config(job)
    assert config.output is not None
    assert CheckpointStore(Path(str(config.checkpoint))).commits()[-1] == batches
    assert not (Path(config.output) / "versions").exists()  # the run's version was never written

    shutil.copy(files[-1], first / files[-1].name)  # a new file: the next run is a new run
    summary = run(config, spark=spark)
    assert any(n.startswith("wrote version 1: run 1's output") for n in summary.notes), summary.notes
    assert summary.version == 2
    assert digest(config.output, 1) == digest(clean.output, 1)


def test_a_file_a_late_task_attempt_adds_to_a_committed_batch_is_never_read(
    archive: Path, tmp_path: Path, spark: Any
) -> None:
    """A task attempt Spark had given up on (speculative, on an executor taken for lost, of a
    cancelled job) may still write its file after its batch committed. Readers read the files the
    batch listed: a stray complete copy of a file in every output and open-window directory
    changes neither the version's tables nor what the next run builds on the open windows."""
    import shutil

    files = sorted(archive.glob("*.parquet"))

    def two_runs(directory: Path, stray: bool) -> tuple[dict[str, str], dict[str, str]]:
        first = directory / "archive"
        first.mkdir(parents=True)
        for f in files[:-1]:
            shutil.copy(f, first / f.name)
        config = load_config(write_job(directory, first))
        assert config.output is not None and config.checkpoint is not None
        run(config, spark=spark)
        if stray:
            folders = [p for t in ("windows", "late") for p in (Path(config.output) / "data" / t).glob("*")]
            folders += list((Path(config.checkpoint) / "state").glob("*-open-*"))
            assert any("-open-" in d.name for d in folders) and len(folders) > 2
            for folder in folders:
                written = sorted(folder.glob("*.parquet"))
                shutil.copy(written[0], folder / ("late-attempt-" + written[0].name))
        before = digest(config.output)
        shutil.copy(files[-1], first / files[-1].name)  # the next run reads the open windows
        run(config, spark=spark)
        return before, digest(config.output)

    clean = two_runs(tmp_path / "clean", stray=False)
    assert two_runs(tmp_path / "stray", stray=True) == clean


def _kept_buffers(spark: Any, config: Any) -> Any:
    from replay.engine.archive import inspect_schema
    from replay.engine.buffers import scan_buffers

    return scan_buffers(spark, inspect_schema(config), config).buffers


def _referenced_outputs(output: str) -> set[str]:
    from replay.store.outputs import latest_version, read_manifest

    version = latest_version(output)
    assert version is not None
    tables = read_manifest(output, version).tables
    return set(tables["windows"]) | set(tables["late"])


def test_sigkill_at_a_random_moment_then_resume(
    archive: Path, tmp_path: Path, spark: Any, uninterrupted: dict[str, str]
) -> None:
    job = write_job(tmp_path, archive)
    rng = random.Random(int(os.environ.get("REPLAY_CRASH_SEED", "20261121")))
    crashed = replay_run(job)
    # Let it get past Spark's start-up into the batches (which commit every few hundred ms).
    deadline = time.monotonic() + 120
    commits = tmp_path / "ckpt" / "commits"
    while time.monotonic() < deadline and crashed.poll() is None and not (commits.exists() and any(commits.iterdir())):
        time.sleep(0.05)
    time.sleep(rng.uniform(0.0, 2.0))
    crashed.send_signal(signal.SIGKILL)
    crashed.communicate(timeout=60)
    config = load_config(job)
    run(config, spark=spark)
    assert config.output is not None
    found = digest(config.output)
    assert {t: found[t] for t in DETERMINISTIC} == uninterrupted


def test_a_second_writer_is_refused_naming_the_holder(archive: Path, tmp_path: Path, spark: Any) -> None:
    job = write_job(tmp_path, archive)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from replay.store.checkpoint import CheckpointStore\n"
            "with CheckpointStore(sys.argv[1]).lock('replay run (test holder)'):\n"
            "    print('locked', flush=True)\n"
            "    time.sleep(600)\n",
            str(tmp_path / "ckpt"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(ConcurrentWriterError) as raised:
            run(load_config(job), spark=spark)
        assert f"process {holder.pid}" in raised.value.message and "test holder" in raised.value.message
        # The CLI says the same and exits 1.
        second = subprocess.run([REPLAY, "run", "--config", str(job)], capture_output=True, text=True, timeout=300)
        assert second.returncode == 1 and "[checkpoint.locked]" in second.stderr
    finally:
        holder.kill()
        holder.wait()
    # A lock whose holder died is broken, and the run says whose it was.
    summary = run(load_config(job), spark=spark)
    assert summary.stale_lock is not None and summary.stale_lock.pid == holder.pid
    assert summary.version == 1
    # ... in the JSON summary too (``--json``, ``--summary-file``: what the spark-submit engine reads).
    assert summary.to_dict()["stale_lock"] == {
        "pid": holder.pid,
        "host": summary.stale_lock.host,
        "started": summary.stale_lock.started,
        "command": "replay run (test holder)",
    }


def _truncate(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[: len(text) // 2])


def _edit_payload(path: Path) -> None:
    """Change a value and keep the stored sha256, as a hand edit would."""
    document = json.loads(path.read_text())
    document["pending_tuples"] += 1
    path.write_text(json.dumps(document))


def _delete_state(path: Path) -> None:
    """Delete the engine's held buffers that ``path`` commits."""
    document = json.loads(path.read_text())
    (path.parent.parent / document["held"]).unlink()


def _empty_state(path: Path) -> None:
    """Empty the engine's held buffers that ``path`` commits, as a power loss can leave a file whose
    data never reached the disk."""
    document = json.loads(path.read_text())
    (path.parent.parent / document["held"]).write_bytes(b"")


def test_a_corrupt_commit_is_set_aside_and_its_batch_redone(
    archive: Path, tmp_path: Path, spark: Any, uninterrupted: dict[str, str]
) -> None:
    """Truncated, edited (hash kept) and incomplete (a state file gone, or empty) newest commits: each time
    ``replay status`` names the fault, the next run falls back to the newest intact commit, says
    so, redoes the batch and gives the digest of an uninterrupted run."""
    job = write_job(tmp_path, archive)
    config = load_config(job)
    run(config, spark=spark)
    store = CheckpointStore(tmp_path / "ckpt")
    assert config.output is not None
    damages = ((_truncate, "not valid JSON"), (_edit_payload, "sha256"), (_delete_state, "missing"))
    for damage, fault in (*damages, (_empty_state, "unreadable")):
        last = store.commits()[-1]
        damage(tmp_path / "ckpt" / "commits" / f"{last:08d}.json")
        status = subprocess.run(
            [REPLAY, "status", "--checkpoint", str(tmp_path / "ckpt"), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert status.returncode == 0, status.stderr
        shown = json.loads(status.stdout)
        assert shown["batch"] == last - 1 and len(shown["corrupt"]) == 1, shown
        assert shown["commits"][-1] == last - 1  # the kept commits are the intact ones
        assert shown["corrupt"][0].startswith(f"commit {last}:") and fault in shown["corrupt"][0], shown
        summary = run(config, spark=spark)
        assert any(n.startswith(f"checkpoint.corrupt: commit {last}") for n in summary.notes), summary.notes
        assert any(f"resuming from commit {last - 1}" in n for n in summary.notes), summary.notes
        assert summary.batches >= 1 and store.commits()[-1] == last
        assert (tmp_path / "ckpt" / "commits" / f"{last:08d}.json.corrupt").is_file()
        found = digest(config.output)
        assert {t: found[t] for t in DETERMINISTIC} == uninterrupted, damage.__name__
        (tmp_path / "ckpt" / "commits" / f"{last:08d}.json.corrupt").unlink()
    assert_ledger_whole(tmp_path / "ckpt", len({b.identity for b in _kept_buffers(spark, config)}))


def test_a_checkpoint_without_an_intact_commit_stops_with_checkpoint_corrupt(archive: Path, tmp_path: Path) -> None:
    job = write_job(tmp_path, archive)
    first = subprocess.run([REPLAY, "run", "--config", str(job)], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    for path in (tmp_path / "ckpt" / "commits").glob("*.json"):
        _truncate(path)
    for command in (["run", "--config", str(job)], ["status", "--checkpoint", str(tmp_path / "ckpt")]):
        again = subprocess.run([REPLAY, *command], capture_output=True, text=True, timeout=300)
        assert again.returncode == 1, (command, again.stderr)
        assert "[checkpoint.corrupt]" in again.stderr and "Traceback" not in again.stderr, again.stderr
        assert "commits" in again.stderr and "new --checkpoint" in again.stderr


def test_task_attempts_that_fail_after_writing_are_retried_and_leave_no_row_behind(
    archive: Path, tmp_path: Path, uninterrupted: dict[str, str]
) -> None:
    """Spark retries a failed task (``local[2,2]``: two attempts per task). The pass's writer
    writes its files from the tasks, so a first attempt that wrote its files and then failed must
    leave none of them behind: only the files the successful attempts return are kept."""
    job = write_job(tmp_path, archive)
    settings = yaml.safe_load(job.read_text()) | {"spark": {"master": "local[2,2]"}}
    job.write_text(yaml.safe_dump(settings))
    done, failed = flaky_run(job, "raise")
    assert done.returncode == 0, done.stderr[-4000:]
    assert failed, "no task attempt failed: the fault was not injected"
    assert not [f for f in failed if Path(f).exists()]  # the failed attempts' files are gone
    config = load_config(job)
    assert config.output is not None and config.checkpoint is not None
    found = digest(config.output)
    assert {t: found[t] for t in DETERMINISTIC} == uninterrupted
    written = {
        str(p.relative_to(config.output))
        for t in ("windows", "late")
        for p in (Path(config.output) / "data" / t).glob("*")
    }
    assert written <= _referenced_outputs(config.output)


def test_ctrl_c_in_the_pass_says_what_it_left_and_the_next_run_resumes(
    archive: Path, tmp_path: Path, spark: Any, uninterrupted: dict[str, str]
) -> None:
    """SIGINT, as a terminal's Ctrl-C, while the pass's writer is at work: the command cancels its
    Spark jobs, says what it left, exits 130 without a traceback, and the next run resumes."""
    job = write_job(tmp_path, archive)
    command, proof = flaky_command(job, "hang")
    process = subprocess.Popen(command, env=flaky_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not any(proof.iterdir()) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert any(proof.iterdir()), "the pass's writer never started"
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-4000:]
    assert "replay: interrupted. What was committed stays" in err and "next run resumes from the checkpoint" in err
    assert "KeyboardInterrupt" not in err and "Py4J" not in err, err[-4000:]  # no traceback of the driver's
    config = load_config(job)
    assert CheckpointStore(tmp_path / "ckpt").commits() == []  # the pass commits after its action
    summary = run(config, spark=spark)
    assert summary.resumed
    assert config.output is not None
    found = digest(config.output)
    assert {t: found[t] for t in DETERMINISTIC} == uninterrupted


def test_a_full_disk_in_the_pass_s_writer_is_a_storage_error_and_the_next_run_resumes(
    archive: Path, tmp_path: Path, spark: Any, uninterrupted: dict[str, str]
) -> None:
    """The pass's tables are written in Spark's tasks: the disk filling up there reaches the driver
    as a task failure, and the command reports it as the storage error it is, with the file."""
    job = write_job(tmp_path, archive)
    done, failed = flaky_run(job, "enospc")
    assert failed, "no task met the full disk: the fault was not injected"
    assert done.returncode == 1, done.stderr[-4000:]
    message = done.stderr[done.stderr.index("replay: error: ") :]
    assert "[storage.io]" in message and "No space left on device (ENOSPC)" in message, message
    assert any(f in message for f in failed) and "nothing of the batch in progress was committed" in message
    # No traceback of the command's (Spark's own log of the failed task quotes the worker's, in a line of its own).
    assert not re.search(r"(?m)^Traceback", done.stderr), done.stderr[-4000:]
    assert CheckpointStore(tmp_path / "ckpt").commits() == []
    config = load_config(job)
    assert run(config, spark=spark).resumed
    assert config.output is not None
    found = digest(config.output)
    assert {t: found[t] for t in DETERMINISTIC} == uninterrupted
