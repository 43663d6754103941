"""``replay.engine.sink.storage_failure``: the ``OSError`` about a file that failed a writing task,
read back from the task failure the driver gets (``tests/runner/test_job_crash.py`` fills the disk
in a real run)."""

from __future__ import annotations

import errno

from replay.engine.sink import storage_failure

SPARK_SAYS = """[PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback (most recent call last):
  File "<string>", line 40, in flaky
OSError: [Errno 13] Permission denied: '/data/first.parquet'
...
Caused by: org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/site-packages/pyarrow/parquet/core.py", line 1100, in write_table
PermissionError: [Errno 28] No space left on device: '/data/out/part-00001-0-abc-0.parquet'
 SQLSTATE: 38000
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:1097)
"""


def test_the_task_s_os_error_is_read_back_with_its_number_reason_and_file() -> None:
    found = storage_failure(RuntimeError(SPARK_SAYS))
    assert isinstance(found, OSError)
    assert (found.errno, found.strerror, found.filename) == (
        errno.ENOSPC,
        "No space left on device",
        "/data/out/part-00001-0-abc-0.parquet",
    )  # the last one: the cause


def test_other_task_failures_are_not_storage_failures() -> None:
    assert storage_failure(RuntimeError("ValueError: invalid literal for int() with base 10: 'x'")) is None
    assert storage_failure(RuntimeError("OSError: [Errno 28] No space left on device")) is None  # no file named
