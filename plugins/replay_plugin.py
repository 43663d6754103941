"""Registers Replay's Airflow plugin: the "Replays" page in the Airflow UI (an Airflow 3 FastAPI app).

Operators, the sensor and the hook need no registration in Airflow 3; DAGs import them from the
``replay_airflow`` package next to this file (Airflow puts the plugins folder on ``sys.path``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.plugins_manager import AirflowPlugin

from replay_airflow.ui import app


class ReplayPlugin(AirflowPlugin):
    name = "replay"
    fastapi_apps: ClassVar[list[dict[str, Any]]] = [{"app": app, "url_prefix": "/replay", "name": "Replays"}]
    external_views: ClassVar[list[dict[str, Any]]] = [
        {
            "name": "Replays",
            "href": "replay/",
            "destination": "nav",
            "url_route": "replays",
        }
    ]
