"""The job configuration: one pydantic model for every setting of docs/configuration.md.

YAML in (``load_config``), JSON schema out (``json_schema``), and a stable
fingerprint of the fields that change results (``JobConfig.fingerprint``).
Validation errors become ``ConfigError`` naming the field, the value and what
is allowed. Durations are written like ``60s``, ``5m``, ``250ms`` and held as
integer microseconds.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from replay.core.errors import ConfigError, Location
from replay.core.timeutil import format_duration, parse_duration
from replay.core.vocabulary import ConflictPolicy, GapPolicy, Lateness, RegressionPolicy, TimeUnit, WindowKind

__all__ = [
    "AGGREGATION_FUNCTIONS",
    "LENIENT_CHANGES",
    "RESULT_FIELDS",
    "Aggregation",
    "ColumnMapping",
    "Duration",
    "JobConfig",
    "MicroBatch",
    "PublicationSettings",
    "SparkSettings",
    "ValidationSettings",
    "WatermarkKey",
    "WindowSpec",
    "json_schema",
    "lenient_change",
    "load_config",
    "parse_config",
]

_DURATION_SCHEMA = {
    "type": "string",
    "pattern": r"^-?\d+(us|ms|s|m|h|d)$",
    "description": "a duration such as 60s, 5m, 250ms, 1h, 2d",
}

#: Integer microseconds, written as ``60s`` / ``5m`` / ``250ms`` in YAML and JSON.
Duration = Annotated[
    int,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema(_DURATION_SCHEMA),
]

AGGREGATION_FUNCTIONS = ("count", "sum", "min", "max", "mean", "approx_count_distinct")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ColumnMapping(_Model):
    """Archive column names, by role. Change one when your archive names it differently."""

    origin_id: str = "origin_id"
    sequence_number: str = "sequence_number"
    chunk_number: str = "chunk_number"
    last_chunk: str = "last_chunk"
    watermark_ts: str = "watermark_ts"
    ingest_ts: str = "ingest_ts"
    idle: str = "idle"
    event_time: str = "event_time"
    key: str = "key"

    def resolve(self, name: str) -> str:
        """The physical column for a role name (``event_time``) or a plain column name."""
        return getattr(self, name) if name in type(self).model_fields else name


class WatermarkKey(_Model):
    """One watermark key (Jet's keyed watermarks): an event-time column and its watermark column.

    ``watermark`` names the column carrying the buffers' watermarks; leave it out for
    event-time watermarks (a sequence's watermark is then the max event time of its tuples).
    """

    event_time: str = "event_time"
    watermark: str | None = None
    allowed_lateness: Duration = 0

    @field_validator("allowed_lateness")
    @classmethod
    def _non_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError("allowed_lateness must be 0 or more")
        return value


class Aggregation(_Model):
    """``fn`` over ``column``; ``count`` without a column counts rows."""

    fn: Literal["count", "sum", "min", "max", "mean", "approx_count_distinct"]
    column: str | None = None

    @model_validator(mode="after")
    def _column_needed(self) -> Aggregation:
        if self.fn != "count" and not self.column:
            raise ValueError(f"aggregation {self.fn} needs a column (only count may go without one)")
        return self

    @property
    def output_name(self) -> str:
        """The column name in the ``windows`` table: ``<fn>_<column>``, or ``count``."""
        return self.fn if self.column is None else f"{self.fn}_{self.column}"


class WindowSpec(_Model):
    """A named window aggregation, driven by one watermark key.

    Windows are half-open ``[start, end)``; starts are ``offset + j * slide``.
    """

    name: str = Field(min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    wm_key: str = "default"
    kind: WindowKind = WindowKind.TUMBLING
    size: Duration
    slide: Duration | None = None
    offset: Duration = 0
    aggregations: list[Aggregation] = Field(min_length=1)

    @model_validator(mode="after")
    def _shape(self) -> WindowSpec:
        if self.size <= 0:
            raise ValueError(f"window size must be positive, got {format_duration(self.size)}")
        if self.kind == "tumbling" and self.slide is not None and self.slide != self.size:
            raise ValueError("a tumbling window has no slide of its own (slide = size); use kind: sliding")
        if self.kind == "sliding":
            if self.slide is None:
                raise ValueError("a sliding window needs a slide")
            if self.slide <= 0:
                raise ValueError(f"slide must be positive, got {format_duration(self.slide)}")
            if self.slide > self.size:
                raise ValueError(
                    f"slide {format_duration(self.slide)} is larger than size {format_duration(self.size)}; "
                    "slide must be at most size"
                )
        names = [a.output_name for a in self.aggregations]
        if len(set(names)) != len(names):
            raise ValueError(f"aggregations repeat: {names}")
        return self

    @property
    def effective_slide(self) -> int:
        return self.size if self.slide is None else self.slide


class MicroBatch(_Model):
    """Bounds of one micro-batch; ``None`` means unbounded.

    ``max_batches_per_pass`` and ``max_tuples_per_pass`` bound a pass: the consecutive
    micro-batches whose tuple work one Spark action does (each batch is still committed on its
    own, docs/outputs.md#passes). A crash redoes at most the uncommitted batches of one pass.
    Not part of the fingerprint: they change how fast a run goes, never its results.
    """

    max_buffers: int | None = Field(default=None, gt=0)
    max_tuples: int | None = Field(default=None, gt=0)
    max_batches_per_pass: int = Field(default=32, gt=0)
    max_tuples_per_pass: int | None = Field(default=20_000_000, gt=0)


#: Spark master URLs Spark accepts: local ones, a standalone cluster, YARN, Kubernetes.
_MASTER = re.compile(
    r"^(local(\[(\*|[1-9]\d*)(,[1-9]\d*)?\])?|local-cluster\[[1-9]\d*,[1-9]\d*,[1-9]\d*\]"
    r"|spark://[^\s]+|yarn|k8s://[^\s]+)$"
)


class SparkSettings(_Model):
    master: str = "local[*]"
    conf: dict[str, str] = Field(default_factory=dict)

    @field_validator("master")
    @classmethod
    def _known_master(cls, value: str) -> str:
        if not _MASTER.match(value):
            raise ValueError(
                f"{value!r} is not a Spark master URL: local, local[N], local[*], local[N,F], "
                "spark://host:port (a standalone cluster), yarn or k8s://host:port"
            )
        return value


class ValidationSettings(_Model):
    """Thresholds of the ``integrity`` suite and the Data Docs history (docs/validation.md#validation-settings).

    ``None`` leaves a count unchecked (it is still reported). Not part of the fingerprint:
    they judge results, they do not change them.
    """

    max_gaps: int | None = Field(default=None, ge=0, description="missing sequences (gap_policy: wait)")
    max_incomplete: int | None = Field(default=None, ge=0, description="sequences missing chunks")
    max_skipped: int | None = Field(default=None, ge=0, description="sequences closed by gap_policy: skip")
    max_conflicts: int | None = Field(default=0, ge=0, description="conflicting duplicates (on_conflict: keep_first)")
    max_regressions: int | None = Field(default=None, ge=0, description="watermark regressions clamped")
    max_late_fraction: float | None = Field(
        default=0.05, ge=0, le=1, description="late tuples over tuples read, per watermark key"
    )
    float_tolerance: float = Field(
        default=1e-9,
        gt=0,
        description="relative tolerance of the reconciliation for floating-point sums and means",
    )
    docs_history: int = Field(default=20, ge=1, description="validation runs kept per suite in the Data Docs")


class PublicationSettings(_Model):
    """What ``replay publish`` keeps."""

    retain_versions: int | None = Field(
        default=None,
        ge=1,
        description=(
            "keep the newest N versions (plus the current publication and what it was built from) and delete "
            "the files only older versions used; None keeps every version"
        ),
    )


#: Fields whose values change the contents of the result tables (docs/outputs.md#fingerprint).
RESULT_FIELDS = (
    "columns",
    "time_unit",
    "chunk_base",
    "watermarks",
    "expected_origins",
    "lateness",
    "idle_timeout",
    "gap_policy",
    "watermark_regression",
    "on_conflict",
    "windows",
)


#: Changes of a result field that a checkpoint takes: from the strict policy to the lenient one.
#: Under ``fail`` every committed batch held no conflicting copy (no watermark regression), so the
#: batches are what ``keep_first`` (``clamp``) would have committed, and the checkpoint goes on as
#: if the job had said so from the start. The other way, or any other change, could have
#: committed something else: it takes a new checkpoint.
LENIENT_CHANGES = frozenset(
    {
        ("on_conflict", ConflictPolicy.FAIL.value, ConflictPolicy.KEEP_FIRST.value),
        ("watermark_regression", RegressionPolicy.FAIL.value, RegressionPolicy.CLAMP.value),
    }
)


def lenient_change(name: str, before: Any, after: Any) -> bool:
    """Whether a checkpoint written with ``name: before`` continues under ``name: after``."""
    return any((name, before, after) == change for change in LENIENT_CHANGES)  # values may be lists


class JobConfig(_Model):
    """Every setting of a replay job (docs/configuration.md#settings)."""

    archive: str = Field(min_length=1, description="directory or URI of the Parquet archive")
    output: str | None = None
    checkpoint: str | None = None
    columns: ColumnMapping = Field(default_factory=ColumnMapping)
    time_unit: TimeUnit = Field(
        default=TimeUnit.NATIVE,
        description="native: Parquet timestamps; ms: int64 epoch milliseconds",
    )
    chunk_base: Literal[0, 1] = 1
    watermarks: dict[str, WatermarkKey] | None = Field(
        default=None,
        description=(
            "watermark keys; when left out, one key 'default' on event_time whose watermark "
            "column is watermark_ts if the archive has it, else event-time watermarks"
        ),
    )
    expected_origins: list[Annotated[int, Field(ge=1)]] = Field(default_factory=list)
    lateness: Lateness = Lateness.AUTO
    idle_timeout: Duration | None = None
    gap_policy: GapPolicy = GapPolicy.WAIT
    watermark_regression: RegressionPolicy = RegressionPolicy.FAIL
    on_conflict: ConflictPolicy = ConflictPolicy.FAIL
    windows: list[WindowSpec] = Field(default_factory=list)
    micro_batch: MicroBatch = Field(default_factory=MicroBatch)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    retain: int = Field(default=10, ge=1)
    validation: ValidationSettings = Field(default_factory=ValidationSettings)
    publication: PublicationSettings = Field(default_factory=PublicationSettings)

    @field_validator("expected_origins")
    @classmethod
    def _sorted_origins(cls, value: list[int]) -> list[int]:
        return sorted(set(value))

    @field_validator("idle_timeout")
    @classmethod
    def _positive_timeout(cls, value: int | None) -> int | None:
        if value is not None and value <= 0:
            raise ValueError("idle_timeout must be positive")
        return value

    @model_validator(mode="after")
    def _references(self) -> JobConfig:
        keys = self.watermark_keys
        for key in keys:
            if not key or not key.replace("_", "a").isalnum():
                raise ValueError(f"watermark key name {key!r} must be letters, digits and underscores")
        names = [w.name for w in self.windows]
        if len(set(names)) != len(names):
            raise ValueError(f"window names must be unique, got {names}")
        for window in self.windows:
            if window.wm_key not in keys:
                raise ValueError(
                    f"window {window.name!r} names wm_key {window.wm_key!r}, which is not declared; "
                    f"declared keys: {sorted(keys)}"
                )
        return self

    @property
    def watermark_keys(self) -> dict[str, WatermarkKey]:
        """The declared keys; the implicit ``default`` key when none are declared.

        The implicit key's ``watermark`` is ``None`` here: whether ``watermark_ts`` is
        used is decided against the archive (see ``replay.engine.archive.resolve_keys``).
        """
        if self.watermarks is None:
            return {"default": WatermarkKey()}
        return dict(self.watermarks)

    def fingerprint_fields(self) -> dict[str, Any]:
        """The result-changing settings, as canonical JSON-able values."""
        dumped = self.model_dump(mode="json")
        return {name: dumped[name] for name in RESULT_FIELDS}

    def fingerprint(self) -> str:
        """sha256 over ``fingerprint_fields``: equal for configs that give equal results."""
        text = json.dumps(self.fingerprint_fields(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def with_overrides(self, **overrides: Any) -> JobConfig:
        """A validated copy with some top-level settings replaced (``None`` values are ignored)."""
        data = self.model_dump(mode="json", exclude_unset=False)
        data.update({k: v for k, v in overrides.items() if v is not None})
        return parse_config(data, source="command-line options")


def _setting_path(loc: tuple[Any, ...], data: Any) -> str:
    """A setting's path as the job file says it: a list item with a name by its name
    (``windows[per_minute].size``), another by its index (``expected_origins.0``)."""
    path = ""
    for part in loc:
        item = data[part] if isinstance(data, list) and isinstance(part, int) and part < len(data) else None
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            path += f"[{item['name']}]"
        else:
            path += f".{part}" if path else str(part)
        data = item if item is not None else (data.get(part) if isinstance(data, dict) else None)
    return path


def _describe_errors(exc: ValidationError, source: str, data: Any = None) -> ConfigError:
    lines = []
    first_field = None
    for err in exc.errors(include_url=False):
        path = _setting_path(tuple(err["loc"]), data) or "(top level)"
        first_field = first_field or path
        value = err.get("input")
        shown = json.dumps(value, default=str) if not isinstance(value, dict) else "{...}"
        message = err["msg"].removeprefix("Value error, ")
        lines.append(f"{path} = {shown}: {message}")
    return ConfigError(
        f"the job configuration from {source} is invalid: " + "; ".join(lines),
        where=Location(field=first_field, file=source if source.endswith((".yaml", ".yml")) else None),
        todo="fix these settings (docs/configuration.md lists every setting and what it allows)",
        code="config.invalid",
    )


def parse_config(data: dict[str, Any], *, source: str = "a dictionary") -> JobConfig:
    """Validate a mapping into a ``JobConfig``.

    Raises:
        ConfigError: a setting is unknown, mistyped or out of range; the message names each.
    """
    if not isinstance(data, dict):
        raise ConfigError(
            f"the job configuration from {source} is not a mapping of settings",
            todo="write it as YAML 'key: value' lines, as in the README's example",
            code="config.not_a_mapping",
        )
    try:
        return JobConfig.model_validate(data)
    except ValidationError as exc:
        raise _describe_errors(exc, source, data) from exc


def load_config(path: str | Path) -> JobConfig:
    """Read and validate a job YAML file.

    Raises:
        ConfigError: the file is missing, is not YAML, or holds invalid settings.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the job file: {exc.strerror or exc}",
            where=Location(file=str(path)),
            todo="pass the path of an existing YAML job file with --config",
            code="config.unreadable",
        ) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"the job file is not valid YAML: {exc}",
            where=Location(file=str(path)),
            todo="fix the YAML syntax",
            code="config.yaml",
        ) from exc
    return parse_config(data or {}, source=str(path))


def json_schema() -> dict[str, Any]:
    """The JSON schema of a job configuration (used by the Airflow trigger form)."""
    return JobConfig.model_json_schema(mode="validation")
