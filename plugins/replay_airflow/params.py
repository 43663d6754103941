"""The DAGs' trigger form, generated from the job configuration's JSON schema, and its way back to a job.

``job_params`` turns ``replay.core.config.json_schema()`` (the pydantic model's schema) into Airflow
``Param`` objects, one per top-level setting, so the form, Airflow's own validation of a trigger
and the YAML job file all follow one model (docs/configuration.md). References (``$ref``) are inlined,
because Airflow validates each param against its own schema. ``spark`` becomes ``spark_master``
(and ``spark_conf``), and the form gains ``start``/``end``, the event-time range ``[start, end)``.

``resolve_job`` is the other direction, run by the ``plan`` task: it applies the path roots
(``replay_airflow.roots``) and validates the whole configuration with pydantic, before any Spark
session starts. Importing this module loads pydantic, never pyarrow, Spark or pandas.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from replay.core.config import JobConfig
    from replay_airflow.roots import Roots

__all__ = ["ENGINES", "FORM_FIELDS", "ResolvedJob", "job_params", "param_schemas", "resolve_job"]

#: The form's first fields, in order; every other setting follows in the "Advanced" section.
FORM_FIELDS = (
    "archive",
    "output",
    "checkpoint",
    "start",
    "end",
    "expected_origins",
    "windows",
    "watermarks",
    "lateness",
    "micro_batch",
    "spark_master",
    "engine",
)

#: Where a run's Spark driver runs: inside the Airflow task (``spark_master`` is its master), or
#: started by spark-submit against the cluster of the Airflow connection ``spark_master``.
ENGINES = ("in_task", "spark_submit", "kept_driver")

_RANGE_DESCRIPTION = (
    "event-time range of a backfill, {which} (ISO 8601 with an offset, e.g. 2026-01-01T00:00:00Z); "
    "empty for an open range. Under `airflow backfill create` the run's data interval is used instead."
)
_ISO_8601 = r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?([Zz]|[+-]\d{2}:?\d{2})$"
_PATH_DESCRIPTIONS = {
    "archive": "the archive directory, relative to the archive root ([replay] archive_root)",
    "output": "the output directory, relative to the output root ([replay] output_root)",
    "checkpoint": (
        "the checkpoint directory, relative to the checkpoint root ([replay] checkpoint_root); "
        "empty: _checkpoints/<output>/<full or range> under that root"
    ),
}


def _inline(node: Any, defs: Mapping[str, Any]) -> Any:
    """``node`` with every ``$ref`` replaced by its definition, and ``anyOf [X, null]`` as ``type [X, null]``."""
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _inline(merged, defs)
    out = {k: _inline(v, defs) for k, v in node.items() if k not in ("$defs", "title")}
    options = out.get("anyOf")
    if isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
        other = next(o for o in options if o != {"type": "null"})
        if isinstance(other.get("type"), str):
            del out["anyOf"]
            out = {**other, **out, "type": [other["type"], "null"]}
    return out


def param_schemas() -> dict[str, dict[str, Any]]:
    """The JSON schema of every form field (``$ref``-free), in form order."""
    from replay.core.config import json_schema

    schema = json_schema()
    defs = schema.get("$defs", {})
    props = {name: _inline(prop, defs) for name, prop in schema["properties"].items()}
    spark = props.pop("spark")
    master = spark["properties"]["master"]
    props["spark_master"] = {
        "type": "string",
        "minLength": 1,
        "description": "Spark master: local[*] (inside the Airflow task) or spark://host:7077 for a cluster",
        "default": master.get("default", "local[*]"),
    }
    props["spark_conf"] = {**spark["properties"]["conf"], "description": "extra Spark settings (key: value)"}
    props["engine"] = {
        "type": "string",
        "enum": list(ENGINES),
        "default": ENGINES[0],
        "description": (
            "in_task: the Spark driver runs inside the Airflow task, on spark_master; spark_submit: "
            "the replay is submitted with spark-submit to the cluster of the Airflow connection "
            "spark_master (spark_master above is then not used); kept_driver: the replay is sent to "
            "the kept driver (replay driver serve) whose home the worker's REPLAY_DRIVER names"
        ),
    }
    for which, name in (("inclusive", "start"), ("exclusive", "end")):
        props[name] = {
            "type": ["string", "null"],
            "format": "date-time",
            # "format" is only checked when jsonschema's optional rfc3339 dependency is installed.
            "pattern": _ISO_8601,
            "description": _RANGE_DESCRIPTION.format(which=which),
        }
    for name, description in _PATH_DESCRIPTIONS.items():
        props[name] = {**props[name], "description": description}
    ordered = {name: props.pop(name) for name in FORM_FIELDS}
    return ordered | props


def _default_for(schema: Mapping[str, Any]) -> Any:
    if "default" in schema:
        return copy.deepcopy(schema["default"])
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if "null" in kinds:
        return None
    if "array" in kinds:
        return []
    if "object" in kinds:
        return {}
    return None


def job_params(**defaults: Any) -> dict[str, Any]:
    """One Airflow ``Param`` per form field, with ``defaults`` overriding the model's defaults.

    Every default must be a valid value for its field (Airflow validates defaults of scheduled
    DAGs at parse time).

    Raises:
        KeyError: a default names no form field.
    """
    from airflow.sdk import Param

    schemas = param_schemas()
    unknown = sorted(set(defaults) - set(schemas))
    if unknown:
        raise KeyError(f"job_params got defaults for unknown fields {unknown}; the fields are {sorted(schemas)}")
    params: dict[str, Any] = {}
    for name, schema in schemas.items():
        schema = dict(schema)
        description = schema.pop("description", None)
        default = defaults[name] if name in defaults else _default_for(schema)
        schema.pop("default", None)
        schema["title"] = name
        if name not in FORM_FIELDS:
            schema["section"] = "Advanced"  # the trigger form folds these away
        params[name] = Param(json.loads(json.dumps(default)), description=description, schema=schema)
    return params


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolvedJob:
    """A DAG run's job: the validated configuration (paths under the roots) and its range.

    ``start``/``end`` are microseconds since the epoch, ``[start, end)``; ``None`` is open.
    """

    config: JobConfig
    start: int | None
    end: int | None
    range_source: str  # "params", "data interval" or "none"
    engine: str = ENGINES[0]  # one of ENGINES

    def to_xcom(self) -> dict[str, Any]:
        from replay.core.timeutil import format_ts

        return {
            "config": self.config.model_dump(mode="json"),
            "start": format_ts(self.start),
            "end": format_ts(self.end),
            "range_source": self.range_source,
            "engine": self.engine,
        }

    @classmethod
    def from_xcom(cls, data: Mapping[str, Any]) -> ResolvedJob:
        from replay.core.config import parse_config
        from replay.core.timeutil import parse_timestamp

        return cls(
            config=parse_config(dict(data["config"]), source="the plan task's result"),
            start=None if data.get("start") is None else parse_timestamp(data["start"]),
            end=None if data.get("end") is None else parse_timestamp(data["end"]),
            range_source=str(data.get("range_source", "params")),
            engine=str(data.get("engine") or ENGINES[0]),
        )


def _bound(params: Mapping[str, Any], name: str) -> int | None:
    from replay.core.errors import ConfigError, Location
    from replay.core.timeutil import parse_timestamp

    value = params.get(name)
    if value in (None, ""):
        return None
    try:
        return parse_timestamp(value)
    except ValueError as exc:
        raise ConfigError(
            f"param {name!r} = {value!r}: {exc}",
            where=Location(field=name),
            todo="write it as ISO 8601 with an offset, e.g. 2026-01-01T00:00:00Z, or leave it empty",
            code="airflow.bad_range",
        ) from exc


def _together(errors: list[Any]) -> Any:
    """One error naming each of ``errors`` (path params), of the first one's kind and code."""
    from replay.core.errors import Location

    first = errors[0]
    todos = list(dict.fromkeys(error.todo for error in errors))
    return type(first)(
        f"{len(errors)} path params are wrong: " + "; ".join(error.what for error in errors),
        where=Location(field=", ".join(str(error.where.field) for error in errors)),
        todo="; ".join(todos),
        code=first.code,
    )


def resolve_job(
    params: Mapping[str, Any],
    roots: Roots,
    *,
    data_interval: tuple[Any, Any] | None = None,
) -> ResolvedJob:
    """The job a DAG run asks for: paths under ``roots``, the configuration validated, the range chosen.

    ``data_interval`` (the run's, for backfill and scheduled runs that replay by interval) becomes
    the range; a different ``start``/``end`` in the params is refused rather than silently dropped.
    A missing checkpoint is placed under the checkpoint root, one per output and range.

    Raises:
        PathOutsideRootError: a path is outside its root.
        ConfigError: a setting is invalid (the message names each), or the range is.
    """
    from replay.core.config import parse_config
    from replay.core.errors import ConfigError, Location
    from replay.core.paths import default_checkpoint
    from replay.core.timeutil import format_ts, from_datetime

    known = set(param_schemas())
    unknown = sorted(set(params) - known)
    if unknown:
        raise ConfigError(
            f"the run's params hold unknown settings {unknown}",
            where=Location(field=unknown[0]),
            todo=f"remove them; the settings are {sorted(known)}",
            code="airflow.unknown_param",
        )
    start, end = _bound(params, "start"), _bound(params, "end")
    source = "params" if start is not None or end is not None else "none"
    if data_interval is not None:
        lo, hi = (from_datetime(v) for v in data_interval)
        for name, given, interval in (("start", start, lo), ("end", end, hi)):
            if given is not None and given != interval:
                raise ConfigError(
                    f"param {name!r} = {format_ts(given)} differs from the run's data interval "
                    f"[{format_ts(lo)}, {format_ts(hi)})",
                    where=Location(field=name),
                    todo="leave start and end empty in a backfill's run configuration: its data interval is the range",
                    code="airflow.range_conflict",
                )
        start, end, source = lo, hi, "data interval"
    if start is not None and end is not None and start >= end:
        raise ConfigError(
            f"the event-time range is empty: start {format_ts(start)} is not before end {format_ts(end)}",
            where=Location(field="start"),
            todo="pass a start earlier than the end (the range is [start, end))",
            code="airflow.bad_range",
        )

    engine = str(params.get("engine") or ENGINES[0])
    if engine not in ENGINES:
        raise ConfigError(
            f"param 'engine' = {engine!r} is not one of {list(ENGINES)}",
            where=Location(field="engine"),
            todo="choose in_task (the default), spark_submit or kept_driver",
            code="airflow.bad_engine",
        )
    data = {k: v for k, v in params.items() if k not in ("start", "end", "spark_master", "spark_conf", "engine")}
    data["spark"] = {"master": params.get("spark_master") or "local[*]", "conf": dict(params.get("spark_conf") or {})}
    resolved: dict[str, str] = {}
    wrong: list[ConfigError] = []  # every path param that is wrong, reported together
    for kind in ("archive", "output", "checkpoint"):
        path = str(params.get(kind) or "")
        if kind == "checkpoint" and not path:
            if "output" not in resolved:  # no default beside an output that is itself wrong
                continue
            # One checkpoint per output and range (replay's own names: full, range_<start>_<end>), kept
            # apart from outputs even when the two roots are one directory.
            relative = resolved["output"][len(roots.output.rstrip("/")) :].strip("/") or "_root"
            path = f"_checkpoints/{relative}/{default_checkpoint(resolved['output'], start, end).rsplit('/', 1)[-1]}"
        try:
            resolved[kind] = roots.resolve(kind, path, param=kind)
        except ConfigError as error:
            wrong.append(error)
    if wrong:
        raise wrong[0] if len(wrong) == 1 else _together(wrong)
    data |= resolved
    config = parse_config(data, source="the DAG run's params")
    return ResolvedJob(config=config, start=start, end=end, range_source=source, engine=engine)
