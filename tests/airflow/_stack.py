"""``./dev.sh airflow`` driven from tests: Airflow as teams run it, started once and used over HTTP and the CLI.

The script starts a throwaway Postgres metadata database, then the api-server, scheduler (LocalExecutor),
dag-processor and triggerer on 127.0.0.1; this module runs it as a subprocess on free ports with its
own ``AIRFLOW_STACK_DIR`` and ``[replay] root``, waits until it says it is up, reads the admin's
password and the environment it writes (``env.sh``), and stops it with SIGTERM the way Ctrl-C would.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests._airflow import AIRFLOW, REPO

UP = "dev.sh: Airflow is up"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: str

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Stack:
    directory: Path
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    started_in: float = 0.0
    password: str = ""
    _env: dict[str, str] = field(default_factory=dict)

    def wait_until_up(self, timeout: float = 300) -> None:
        begin = time.monotonic()
        while UP not in self.log.read_text():
            assert self.process.poll() is None, f"./dev.sh airflow exited {self.process.returncode}:\n{self.output()}"
            assert time.monotonic() - begin < timeout, f"./dev.sh airflow not up in {timeout:.0f} s:\n{self.output()}"
            time.sleep(0.5)
        self.started_in = time.monotonic() - begin
        self.password = json.loads((self.directory / "passwords.json").read_text())["admin"]
        for line in (self.directory / "env.sh").read_text().splitlines():
            key, _, value = line.removeprefix("export ").partition("=")
            self._env[key] = shlex.split(value)[0] if value else ""

    def output(self) -> str:
        return self.log.read_text()[-6000:]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update(self._env)
        return env

    def airflow(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """The ``airflow`` CLI against the stack's metadata database (what ``source env.sh`` gives a shell)."""
        result = subprocess.run(
            [str(AIRFLOW), *args], env=self.env(), capture_output=True, text=True, timeout=timeout, cwd=REPO
        )
        assert result.returncode == 0, f"airflow {' '.join(args)}: {result.returncode}\n{result.stderr[-4000:]}"
        return result

    def request(
        self,
        path: str,
        *,
        token: str | None = None,
        cookie: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> Response:
        """One HTTP request to the api-server, redirects not followed."""
        headers = {"Accept": "application/json, text/html"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if cookie:
            headers["Cookie"] = f"_token={cookie}"
        body = None
        if data is not None:
            body = json.dumps(data).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.url + path, data=body, headers=headers)
        try:
            with _OPENER.open(request, timeout=60) as answer:
                return Response(answer.status, dict(answer.headers), answer.read().decode())
        except urllib.error.HTTPError as error:
            return Response(error.code, dict(error.headers), error.read().decode())

    def token(self, password: str | None = None) -> Response:
        """``POST /auth/token``: the SimpleAuthManager's JWT for the admin user."""
        return self.request("/auth/token", data={"username": "admin", "password": password or self.password})


@contextlib.contextmanager
def airflow_stack(work: Path, root: Path) -> Iterator[Stack]:
    """``./dev.sh airflow`` in ``work`` with ``root`` as the ``[replay] root``, started but not waited for
    (call ``wait_until_up``: the caller may prepare files meanwhile); stopped with SIGTERM on exit."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "REPLAY_"))}
    env.update(AIRFLOW_STACK_DIR=str(work / "stack"), AIRFLOW__API__PORT=str(port), AIRFLOW__REPLAY__ROOT=str(root))
    log = work / "dev-airflow.log"
    with open(log, "wb") as sink:
        process = subprocess.Popen(
            [str(REPO / "dev.sh"), "airflow"], env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    stack = Stack(directory=work / "stack", url=f"http://127.0.0.1:{port}", process=process, log=log)
    try:
        yield stack
    finally:
        # What Ctrl-C does: dev.sh stops the services, then Postgres. Whatever is left is killed.
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=90)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)


CHROMIUM = Path("/usr/bin/chromium")


def chromium_page(url: str, *, cookie: tuple[str, str], screenshot: Path, timeout: float = 120) -> str:
    """Open ``url`` in headless Chromium with ``cookie`` (name, value) set for its host, as a browser after
    logging in would; save a 1400x900 screenshot and return the DOM after the page loaded.

    Chromium's command line sets no cookie, so this drives it over the DevTools protocol (a websocket).
    """
    import base64

    from websockets.sync.client import connect

    profile = screenshot.parent / "chromium-profile"
    process = subprocess.Popen(
        [
            str(CHROMIUM),
            *("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"),
            *("--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,900"),
            *("--remote-debugging-port=0", "--remote-allow-origins=*", f"--user-data-dir={profile}", "about:blank"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + timeout
        port_file = profile / "DevToolsActivePort"
        while not port_file.exists() or not port_file.read_text().strip():
            assert process.poll() is None and time.monotonic() < deadline, "Chromium did not open its DevTools port"
            time.sleep(0.2)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as answer:
            page = next(t for t in json.load(answer) if t["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
            ids = iter(range(1, 1_000_000))
            events: list[str] = []

            def call(method: str, **params: Any) -> dict[str, Any]:
                number = next(ids)
                ws.send(json.dumps({"id": number, "method": method, "params": params}))
                while True:
                    message = json.loads(ws.recv(timeout=max(1.0, deadline - time.monotonic())))
                    if message.get("id") == number:
                        assert "error" not in message, (method, message["error"])
                        return dict(message.get("result") or {})
                    events.append(str(message.get("method")))

            host = urllib.parse.urlsplit(url).hostname or "127.0.0.1"
            call("Network.enable")
            call("Network.setCookie", name=cookie[0], value=cookie[1], domain=host, path="/", httpOnly=True)
            call("Page.enable")
            # The window's size includes no browser chrome in headless mode only once set here.
            call("Emulation.setDeviceMetricsOverride", width=1400, height=900, deviceScaleFactor=1, mobile=False)
            call("Page.navigate", url=url)
            while "Page.loadEventFired" not in events:
                message = json.loads(ws.recv(timeout=max(1.0, deadline - time.monotonic())))
                events.append(str(message.get("method")))
            dom = call("Runtime.evaluate", expression="document.documentElement.outerHTML", returnByValue=True)
            shot = call("Page.captureScreenshot", format="png")
            screenshot.write_bytes(base64.b64decode(shot["data"]))
            return str(dom["result"]["value"])
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
