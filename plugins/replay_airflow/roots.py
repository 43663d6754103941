"""Where DAG runs may read and write: archive, output and checkpoint paths resolve under configured roots.

A DAG run's params are user input. Before any Spark session starts, every path they name is
resolved against its root (a relative path is taken relative to the root; ``..`` and symbolic
links are resolved first) and refused when it lands outside. Roots come from Airflow's
configuration, section ``[replay]`` (or ``AIRFLOW__REPLAY__<OPTION>`` in the environment):

=================  ===================================================================
``root``           the default for the three below; defaults to ``$AIRFLOW_HOME/replay``
``archive_root``   archives are read only under it
``output_root``    outputs (and their reports and Data Docs) are written only under it
``checkpoint_root`` checkpoints are kept only under it
=================  ===================================================================

A root may also be a URI (``s3://bucket/replay``); a path under it must then be a URI with the
same prefix (no ``..`` segments).
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from replay.core.errors import ConfigError, Location

__all__ = ["PathOutsideRootError", "Roots", "configured_roots"]

Kind = Literal["archive", "output", "checkpoint"]


class PathOutsideRootError(ConfigError):
    """A path from a DAG run's params is outside its configured root."""

    code = "airflow.path_outside_root"


def _is_uri(value: str) -> bool:
    return "://" in value


@dataclass(frozen=True, slots=True, kw_only=True)
class Roots:
    """The three roots, each an absolute local path (resolved) or a URI."""

    archive: str
    output: str
    checkpoint: str

    def __post_init__(self) -> None:
        for kind in ("archive", "output", "checkpoint"):
            value = getattr(self, kind)
            if not value:
                raise ConfigError(
                    f"the {kind} root is empty",
                    where=Location(field=f"[replay] {kind}_root"),
                    todo=f"set [replay] {kind}_root (or AIRFLOW__REPLAY__{kind.upper()}_ROOT) to a directory",
                    code="airflow.root_missing",
                )
            if not _is_uri(value) and not os.path.isabs(value):
                raise ConfigError(
                    f"the {kind} root {value!r} is not an absolute path",
                    where=Location(field=f"[replay] {kind}_root"),
                    todo="write the root as an absolute path or a URI",
                    code="airflow.root_relative",
                )

    def root(self, kind: Kind) -> str:
        return str(getattr(self, kind))

    def resolve(self, kind: Kind, value: str, *, param: str) -> str:
        """``value`` (from param ``param``) as a path under the ``kind`` root.

        Raises:
            PathOutsideRootError: the path lands outside the root (after ``..`` and symlinks).
        """
        root = self.root(kind)
        text = str(value).strip()
        if not text:
            raise ConfigError(
                f"param {param!r} is empty",
                where=Location(field=param),
                todo=f"name a {kind} path under {root}",
                code="airflow.path_missing",
            )
        if _is_uri(root) or _is_uri(text):
            if not _is_uri(text):
                text = root.rstrip("/") + "/" + text.lstrip("/")
            scheme, _, rest = text.partition("://")
            normal = f"{scheme}://{posixpath.normpath(rest)}"
            inside = _is_uri(root) and ".." not in rest.split("/") and (normal + "/").startswith(root.rstrip("/") + "/")
            resolved = normal
        else:
            base = Path(root).resolve()
            resolved_path = (base / text).resolve()
            inside = resolved_path == base or base in resolved_path.parents
            resolved = str(resolved_path)
        if not inside:
            raise PathOutsideRootError(
                f"param {param!r} = {value!r} resolves to {resolved}, which is outside the {kind} root {root}",
                where=Location(field=param),
                todo=(
                    f"pass a path under {root} (relative paths are taken from it), or ask an administrator to "
                    f"change [replay] {kind}_root"
                ),
            )
        return resolved


def configured_roots() -> Roots:
    """The roots from Airflow's configuration (read at task run time, never while parsing DAGs).

    Raises:
        ConfigError: a root is empty or relative.
    """
    from replay_airflow._compat import get_option

    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    default = get_option("root") or os.path.join(home, "replay")

    def pick(kind: str) -> str:
        value = get_option(f"{kind}_root") or default
        return value if _is_uri(value) else str(Path(value).expanduser().resolve())

    return Roots(archive=pick("archive"), output=pick("output"), checkpoint=pick("checkpoint"))
