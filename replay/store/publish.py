"""``replay publish``: make a validated version the current publication (write, audit, publish).

Publishing version ``V`` writes a new **publication** version ``P`` and then flips the
``current`` pointer to it atomically (temporary file, fsync, rename). ``P`` holds:

- ``windows`` and ``late``: ``V``'s; for an event-time range backfill ``[start, end)``, the
  previous publication's rows with exactly that range's windows (those entirely inside it)
  and late tuples (event time inside it) replaced by ``V``'s;
- ``progress`` and ``integrity``: ``V``'s;
- ``corrections``: the window rows that differ from the previous publication: ``added``,
  ``changed`` (``before_*`` and ``after_*``) and ``retracted`` (tombstones: ``after_*`` null).

Nothing is rewritten: a crash before the flip leaves the previous publication current
(publishing again reuses the unflipped ``P``), and every earlier version stays readable
until ``publication.retain_versions`` lets it go.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from replay.core.config import JobConfig
from replay.core.errors import Location, PublicationError, storage_errors
from replay.store.durable import fsync_dir, write_parquet_atomic
from replay.store.lock import one_publisher
from replay.store.outputs import (
    Manifest,
    Publication,
    current_version,
    encode_schema,
    latest_run_version,
    list_versions,
    read_manifest,
    read_table,
    read_validation,
    resolve_version,
    write_current,
    write_manifest,
)

__all__ = ["PublishOutcome", "corrections", "publish"]

_ID = ("window", "wm_key", "key", "window_start", "window_end")


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishOutcome:
    """What ``publish`` did. ``publication`` is the version ``current`` now points at."""

    output: str
    source: int
    publication: int
    previous: int | None
    changed: bool  # False when the source was already the current publication
    corrections: dict[str, int]  # added / changed / retracted
    removed_versions: tuple[int, ...]
    #: The publication's rows were computed by several rules versions (its manifest's ``merged_rules``),
    #: the merged range's by ``rules`` (its source's).
    merged_rules: tuple[int | None, ...] | None = None
    rules: int | None = None

    def describe(self) -> str:
        """One sentence of what was published, as ``replay publish`` and the Airflow task say it."""
        if not self.changed:
            return f"version {self.source} is already published (current: version {self.publication})"
        counts = ", ".join(f"{n} {k}" for k, n in self.corrections.items())
        removed = ", ".join(map(str, self.removed_versions))
        previous = "none" if self.previous is None else f"version {self.previous}"
        return (
            f"published version {self.source} of {self.output} as version {self.publication} "
            f"(previous: {previous}); corrections: {counts}" + (f"; removed versions {removed}" if removed else "")
        )


def _fault(point: str) -> None:
    if os.environ.get("REPLAY_FAULT") == f"publish:{point}":
        raise SystemExit(f"injected fault at publish:{point}")


def _refuse(what: str, output: Path, version: int, todo: str, code: str) -> PublicationError:
    return PublicationError(what, where=Location(file=str(output), extra={"version": version}), todo=todo, code=code)


def _in_range(table: pa.Table, start: int | None, end: int | None) -> pa.ChunkedArray | pa.Array:
    """Rows of a windows table whose window lies entirely inside ``[start, end)``."""
    import pyarrow.compute as pc

    inside = pa.array([True] * table.num_rows)
    if start is not None:
        inside = pc.and_(inside, pc.greater_equal(table["window_start"].cast(pa.int64()), start))
    if end is not None:
        inside = pc.and_(inside, pc.less_equal(table["window_end"].cast(pa.int64()), end))
    return inside


def _late_in_range(table: pa.Table, config: JobConfig, start: int | None, end: int | None) -> pa.Array:
    """Rows of a late table whose event time (of the row's key) lies inside ``[start, end)``."""
    import pyarrow.compute as pc

    inside = pa.array([False] * table.num_rows)
    for key, settings in config.watermark_keys.items():
        column = table[config.columns.resolve(settings.event_time)]  # the late table keeps the archive's names
        if pa.types.is_timestamp(column.type):
            # Late tables hold microsecond timestamps (nanoseconds were truncated when written); a safe
            # cast, so a finer unit from elsewhere fails loudly instead of rounding.
            micros = column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
        else:  # int64 epoch milliseconds (time_unit: ms)
            micros = pc.multiply(column.cast(pa.int64()), 1000)
        mine = pc.equal(table["wm_key"], key)
        if start is not None:
            mine = pc.and_(mine, pc.greater_equal(micros, start))
        if end is not None:
            mine = pc.and_(mine, pc.less(micros, end))
        inside = pc.or_(inside, pc.fill_null(mine, False))
    return inside


def _row_ids(table: pa.Table) -> pa.Array:
    import pyarrow.compute as pc

    parts = []
    for name in ("window", "key", "window_start"):
        column = table[name]
        text = pc.cast(column.cast(pa.int64()) if pa.types.is_timestamp(column.type) else column, pa.string())
        parts.append(pc.fill_null(text, "\x00null"))
    return pc.binary_join_element_wise(*parts, "\x1f")


def corrections(before: pa.Table | None, after: pa.Table) -> pa.Table:
    """The window rows that differ between two ``windows`` tables (docs/validation.md#publish).

    One row per window ``(window, key, window_start)`` that was ``added``, ``changed`` or
    ``retracted``: the identity columns, then ``before_<c>`` and ``after_<c>`` for every
    aggregation column (``before_*`` null when added, ``after_*`` null when retracted).
    Values are compared exactly: window outputs are deterministic.
    """
    values = [n for n in after.schema.names if n not in _ID]
    if before is None or (before.num_rows == 0 and not before.schema.names):
        before = after.schema.empty_table()
    before = before.select([n for n in after.schema.names if n in before.schema.names])
    for name in values:
        if name not in before.schema.names:
            before = before.append_column(name, pa.nulls(before.num_rows, after.schema.field(name).type))
    old = {i: r for i, r in zip(_row_ids(before).to_pylist(), before.to_pylist(), strict=True)}
    new = {i: r for i, r in zip(_row_ids(after).to_pylist(), after.to_pylist(), strict=True)}
    rows: list[dict[str, Any]] = []
    for ident in sorted(old.keys() | new.keys()):
        b, a = old.get(ident), new.get(ident)
        if b is not None and a is not None and all(b[n] == a[n] for n in values):
            continue
        change = "added" if b is None else "retracted" if a is None else "changed"
        row = dict(a if a is not None else b)  # type: ignore[arg-type]
        out = {"change": change, **{n: row[n] for n in _ID}}
        out |= {f"before_{n}": (b[n] if b is not None else None) for n in values}
        out |= {f"after_{n}": (a[n] if a is not None else None) for n in values}
        rows.append(out)
    schema = pa.schema(
        [
            ("change", pa.string()),
            *[after.schema.field(n) for n in _ID],
            *[pa.field(f"before_{n}", after.schema.field(n).type) for n in values],
            *[pa.field(f"after_{n}", after.schema.field(n).type) for n in values],
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def _flip(output: Path, publication: int, source: int, previous: int | None) -> None:
    published = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_current(output, Publication(version=publication, source=source, previous=previous, published=published))


def _retain(output: Path, keep: int, current: int) -> tuple[int, ...]:
    """Delete versions beyond the newest ``keep``, and the data files only they used.

    Never deleted: the current publication and what it was built from, and each checkpoint's
    newest run version (it lists every file that checkpoint's later runs build on, and its
    commits point at: several checkpoints, a scheduled replay's and a backfill's, may write one
    output). A version's manifest goes before its files, so that a crash in between leaves
    unlisted files, never a manifest naming files that are gone."""
    versions = list_versions(output)
    manifests = {v: read_manifest(output, v) for v in versions}
    protected = {current}
    protected |= {v for v in (manifests[current].source, manifests[current].previous) if v is not None}
    newest_run: dict[str, int] = {}
    for v, manifest in manifests.items():
        if manifest.kind == "run" and manifest.checkpoint_id is not None:
            newest_run[manifest.checkpoint_id] = max(v, newest_run.get(manifest.checkpoint_id, v))
    protected |= set(newest_run.values())
    doomed = [v for v in versions[: max(0, len(versions) - keep)] if v not in protected]
    if not doomed:
        return ()
    used: set[str] = set()
    for v in versions:
        if v not in doomed:
            used |= manifests[v].all_entries()
    unused = sorted(set().union(*(manifests[v].all_entries() for v in doomed)) - used)
    for v in doomed:
        (output / "versions" / f"{v:06d}.json").unlink(missing_ok=True)
        (output / "versions" / f"{v:06d}.validation.json").unlink(missing_ok=True)
    fsync_dir(output / "versions")
    for entry in unused:
        path = output / entry
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return tuple(doomed)


@storage_errors("the current publication is switched in one atomic step: it is the previous version or this one")
def publish(output: str | Path, version: int | None = None, *, retain_versions: int | None = None) -> PublishOutcome:
    """Publish ``version`` of ``output`` (default: the newest run's version).

    ``retain_versions`` overrides the job's ``publication.retain_versions``.

    Raises:
        ConfigError: no such version.
        PublicationError: the version was not validated (``publish.unvalidated``), failed
            validation (``publish.failed_validation``), or is itself a publication
            (``publish.not_a_run``).
    """
    root = Path(output)
    resolve_version(root, version)  # an output that is not one is said before waiting for a lock
    with one_publisher(root):
        return _publish(root, version, retain_versions)


def _publish(root: Path, version: int | None, retain_versions: int | None) -> PublishOutcome:
    v = resolve_version(root, version if version is not None else latest_run_version(root))
    manifest = read_manifest(root, v)
    if manifest.kind != "run":
        raise _refuse(
            f"version {v} is a publication (of version {manifest.source}), not a run's output",
            root,
            v,
            f"publish the run's version instead: replay publish {root} --version {manifest.source}",
            "publish.not_a_run",
        )
    record = read_validation(root, v)
    if record is None:
        raise _refuse(
            f"version {v} has not been validated",
            root,
            v,
            f"run 'replay validate {root} --version {v}' first; publish refuses unvalidated versions",
            "publish.unvalidated",
        )
    if not record.get("success"):
        failed = [
            f"{s['name']}: {e['type']}({e['column']})"
            for s in record["suites"]
            for e in s["expectations"]
            if not e["success"]
        ]
        raise _refuse(
            f"version {v} failed validation ({len(failed)} expectations: {'; '.join(failed[:5]) or 'suites missing'})",
            root,
            v,
            "see the Data Docs or 'replay report', fix the cause and run the job again; the current publication "
            "stays as it is",
            "publish.failed_validation",
        )
    config = JobConfig.model_validate(manifest.config)
    keep = retain_versions if retain_versions is not None else config.publication.retain_versions
    previous = current_version(root)
    served = None  # the current publication's manifest
    if previous is not None:
        served = read_manifest(root, previous)
        if served.source == v:
            return PublishOutcome(
                output=str(root),
                source=v,
                publication=previous,
                previous=served.previous,
                changed=False,
                corrections={},
                removed_versions=(),
                merged_rules=served.merged_rules,
                rules=served.rules,
            )
    written = None
    for candidate in reversed(list_versions(root)):  # a publication written before a crash, never flipped
        m = read_manifest(root, candidate)
        if m.kind == "publication" and m.source == v and m.previous == previous:
            written = m
            break
    if written is None:
        written = _write_publication(root, v, manifest, config, previous, served)
    publication = written.version
    counts = {"added": 0, "changed": 0, "retracted": 0}
    for change in read_table(root, "corrections", publication)["change"].to_pylist():
        counts[change] += 1
    _fault("before_flip")
    _flip(root, publication, v, previous)
    removed = _retain(root, keep, publication) if keep is not None else ()
    return PublishOutcome(
        output=str(root),
        source=v,
        publication=publication,
        previous=previous,
        changed=True,
        corrections=counts,
        removed_versions=removed,
        merged_rules=written.merged_rules,
        rules=written.rules,
    )


def _merged_rules(previous: Manifest, rules: int | None) -> tuple[int | None, ...] | None:
    """The rules versions of a publication that keeps rows of ``previous`` (a publication) beside
    rows computed by ``rules``, ascending with ``None`` first, if there are several; else ``None``."""
    versions = set(previous.merged_rules or (previous.rules,)) | {rules}
    if len(versions) == 1:
        return None
    return tuple(sorted(versions, key=lambda r: -1 if r is None else r))


def _write_publication(
    root: Path, v: int, manifest: Manifest, config: JobConfig, previous: int | None, served: Manifest | None
) -> Manifest:
    """Write the publication of run version ``v`` (``manifest``) after ``previous`` (whose manifest
    is ``served``); return its manifest as written."""
    import pyarrow.compute as pc

    token = secrets.token_hex(4)
    tables = dict(manifest.tables)
    start, end = manifest.range or (None, None)
    after = read_table(root, "windows", v)
    before = read_table(root, "windows", previous) if previous is not None else None
    merged = (start is not None or end is not None) and previous is not None
    merged_rules = None
    if merged:
        assert before is not None and served is not None
        kept = before.filter(pc.invert(_in_range(before, start, end))) if before.num_rows else before
        after = (
            pa.concat_tables([kept.select(after.schema.names).cast(after.schema), after]) if kept.num_rows else after
        )
        windows_rel = f"data/windows/publication-v{v:06d}-{token}.parquet"
        write_parquet_atomic(after, root / windows_rel)
        tables["windows"] = (windows_rel,)
        late_before = read_table(root, "late", previous)
        late_after = read_table(root, "late", v)
        late_kept = late_before
        if late_before.num_rows:
            late_kept = late_before.filter(pc.invert(_late_in_range(late_before, config, start, end)))
            late_after = pa.concat_tables(
                [late_kept.select(late_after.schema.names).cast(late_after.schema), late_after]
            )
        late_rel = f"data/late/publication-v{v:06d}-{token}.parquet"
        write_parquet_atomic(late_after, root / late_rel)
        tables["late"] = (late_rel,)
        if kept.num_rows or late_kept.num_rows:  # rows the previous publication's rules computed
            merged_rules = _merged_rules(served, manifest.rules)
    fixes = corrections(before, after)
    corrections_rel = f"data/corrections/publication-v{v:06d}-{token}.parquet"
    write_parquet_atomic(fixes, root / corrections_rel)
    tables["corrections"] = (corrections_rel,)
    # The source's fields, as a publication (write_manifest gives it its number and time).
    publication = replace(
        manifest,
        kind="publication",
        source=v,
        previous=previous,
        merged_range=(start, end) if merged else None,
        merged_rules=merged_rules,
        tables=tables,
        schemas=dict(manifest.schemas) | {"corrections": encode_schema(fixes.schema)},
    )
    return write_manifest(root, publication)
