"""The job configuration: YAML in, errors that name the field, JSON schema out, fingerprints."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.core.config import JobConfig, json_schema, load_config, parse_config
from replay.core.errors import ConfigError

README_EXAMPLE = """
archive: data/archive
output: data/out
checkpoint: data/ckpt
lateness: auto                # origin | arrival | auto
gap_policy: wait
watermarks:
  default: {event_time: event_time, watermark: watermark_ts, allowed_lateness: 0s}
windows:
  - name: per_minute
    wm_key: default
    kind: tumbling            # tumbling | sliding
    size: 60s
    aggregations:
      - {fn: count}
      - {fn: sum, column: value}
      - {fn: max, column: value}
micro_batch: {max_buffers: 2000}
spark: {master: "local[*]"}
"""


def window(**kw: object) -> dict[str, object]:
    return {"name": "w", "size": "60s", "aggregations": [{"fn": "count"}]} | kw


def test_spec_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(README_EXAMPLE)
    job = load_config(path)
    assert job.windows[0].size == 60_000_000
    assert [a.output_name for a in job.windows[0].aggregations] == ["count", "sum_value", "max_value"]
    assert job.micro_batch.max_buffers == 2000
    assert job.watermark_keys["default"].watermark == "watermark_ts"


def test_examples_in_repo_load() -> None:
    for path in Path(__file__).parents[2].glob("examples/*.yaml"):
        assert isinstance(load_config(path), JobConfig)


@pytest.mark.parametrize(
    ("settings", "field", "words"),
    [
        ({"windows": [window(size="0s")]}, "windows[w]", "size must be positive"),
        ({"windows": [window(size="-5s")]}, "windows[w]", "size must be positive"),
        ({"windows": [window(kind="sliding", slide="2m")]}, "windows[w]", "slide 2m is larger than size 1m"),
        ({"windows": [window(kind="sliding")]}, "windows[w]", "needs a slide"),
        ({"windows": [window(size="60")]}, "windows[w].size", "a whole number followed by a unit (us, ms, s, m, h, d)"),
        ({"windows": [window(size=60)]}, "windows[w].size", "has no unit"),
        ({"windows": [window(aggregations=[{"fn": "sum"}])]}, "windows[w].aggregations.0", "needs a column"),
        (
            {"windows": [window(aggregations=[{"fn": "median", "column": "v"}])]},
            "windows[w].aggregations.0.fn",
            "'count'",
        ),
        ({"windows": [window(wm_key="other")]}, "(top level)", "wm_key 'other', which is not declared"),
        ({"windows": [window(), window()]}, "(top level)", "window names must be unique"),
        ({"lateness": "sometimes"}, "lateness", "'origin'"),
        ({"chunk_base": 2}, "chunk_base", "0 or 1"),
        ({"expected_origins": [0]}, "expected_origins.0", "greater than or equal to 1"),
        ({"micro_batch": {"max_buffers": 0}}, "micro_batch.max_buffers", "greater than 0"),
        ({"idle_timeout": "0s"}, "idle_timeout", "must be positive"),
        ({"colums": {}}, "colums", "Extra inputs are not permitted"),
        ({"watermarks": {"default": {"allowed_lateness": "-1s"}}}, "watermarks.default.allowed_lateness", "0 or more"),
    ],
)
def test_errors_name_field_value_and_rule(settings: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"archive": "a"} | settings)
    message = str(err.value)
    assert err.value.where.field == field
    assert field in message and words in message
    assert "What to do" in message
    assert err.value.exit_code == 2


def test_yaml_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("archive: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML") as err:
        load_config(bad)
    assert err.value.file == str(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_fingerprint_covers_result_fields_only() -> None:
    base = parse_config({"archive": "a", "windows": [window()]})
    same = parse_config(
        {
            "archive": "elsewhere",
            "output": "o",
            "micro_batch": {"max_buffers": 3},
            "spark": {"master": "spark://127.0.0.1:7077"},
            "windows": [window(size="1m")],
        }
    )
    assert base.fingerprint() == same.fingerprint()
    for change in (
        {"windows": [window(size="2m")]},
        {"lateness": "origin"},
        {"chunk_base": 0},
        {"columns": {"key": "k"}},
        {"gap_policy": "skip"},
        {"on_conflict": "keep_first"},
    ):
        other = parse_config({"archive": "a", "windows": [window()]} | change)
        assert other.fingerprint() != base.fingerprint(), change


def test_overrides_are_validated() -> None:
    job = parse_config({"archive": "a"})
    assert job.with_overrides(archive="b", output=None).archive == "b"
    with pytest.raises(ConfigError):
        job.with_overrides(micro_batch={"max_buffers": -1})


def test_json_schema_describes_the_form() -> None:
    schema = json_schema()
    assert schema["required"] == ["archive"]
    assert {"archive", "windows", "lateness", "micro_batch", "spark"} <= set(schema["properties"])
    size = schema["$defs"]["WindowSpec"]["properties"]["size"]
    assert size["type"] == "string" and "pattern" in size


def test_lenient_changes_are_from_fail_to_the_lenient_policy_only() -> None:
    from replay.core.config import lenient_change

    assert lenient_change("on_conflict", "fail", "keep_first")
    assert lenient_change("watermark_regression", "fail", "clamp")
    assert not lenient_change("watermark_regression", "clamp", "fail")
    assert not lenient_change("gap_policy", "wait", "skip")
    assert not lenient_change("windows", [{"name": "w", "size": "1s"}], [{"name": "w", "size": "2s"}])
    assert not lenient_change("columns", {"key": "k"}, {"key": "id"})


@pytest.mark.parametrize("master", ["local", "local[*]", "local[2]", "local[2,3]", "spark://127.0.0.1:7077", "yarn"])
def test_spark_masters_spark_takes_are_taken(master: str) -> None:
    assert parse_config({"archive": "a", "spark": {"master": master}}).spark.master == master


@pytest.mark.parametrize("master", ["local[abc]", "local[0]", "spark:/h", "", "127.0.0.1:7077"])
def test_other_spark_masters_are_configuration_errors(master: str) -> None:
    with pytest.raises(ConfigError, match="not a Spark master URL"):
        parse_config({"archive": "a", "spark": {"master": master}})
