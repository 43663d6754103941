"""The "Replays" app with Airflow's authentication dependency overridden, for tests of the page's contents alone.

``uvicorn tests.airflow._ui_without_auth:app --factory``. The authentication itself is tested against the real
api-server in ``test_stack.py``.
"""

from __future__ import annotations

from fastapi import FastAPI


def app() -> FastAPI:
    from replay_airflow.ui import app, requires_read

    app.dependency_overrides[requires_read] = lambda: None
    return app
