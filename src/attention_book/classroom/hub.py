"""The configuration of a JupyterHub course: the hub, and nbgrader's exchange on it.

Two files, written by :func:`jupyterhub_config` and :func:`exchange_config`, are all a
small course needs on one server (``tests/test_jupyterhub.py`` runs exactly these, and the
instructor guide shows them):

- ``jupyterhub_config.py`` for JupyterHub: local Unix accounts (PAM log-in), one
  single-user server per account started by JupyterHub's default ``LocalProcessSpawner``,
  ``configurable-http-proxy`` (npm) in front, everything on the addresses you choose;
- ``nbgrader_config.py`` for everyone (students and instructor), in a folder on the
  Jupyter config path (``/etc/jupyter`` on a server; the test points
  ``JUPYTER_CONFIG_PATH`` at a folder of its own): the course id and the exchange folder
  through which ``release_assignment``, ``fetch``, ``submit``, ``collect`` and the
  feedback travel.

The instructor's course folder (``generate`` writes it) adds the student list with
:func:`course_roster_lines`.

Not taught in a chapter: the instructor guide (``instructor_guide.md``) shows the commands.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from .course import COURSE_ID


def _names(users: Iterable[str], what: str) -> list[str]:
    names = list(users)
    for name in names:
        if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"{what}: a user name is letters, digits, '-' or '_', got {name!r}")
    return names


def _set(names: Iterable[str]) -> str:
    return "{" + ", ".join(repr(name) for name in sorted(set(names))) + "}"


def jupyterhub_config(*, students: Sequence[str], instructors: Sequence[str],
                      bind_url: str = "http://127.0.0.1:8000", hub_port: int = 8081,
                      proxy_api_port: int = 8001, state_dir: str | os.PathLike = "/srv/jupyterhub",
                      proxy_command: Sequence[str] = ("configurable-http-proxy",),
                      server_command: Sequence[str] = ("jupyterhub-singleuser",),
                      environment: Mapping[str, str] | None = None,
                      service_token: str | None = None) -> str:
    """The text of a ``jupyterhub_config.py`` for a course on one server.

    Args:
        students: the students' Unix account names.
        instructors: the instructors' account names (JupyterHub admins).
        bind_url: where the hub is reached (the proxy's public address).
        hub_port: the hub's internal port (on 127.0.0.1).
        proxy_api_port: the proxy's API port (on 127.0.0.1).
        state_dir: where the hub keeps its database, cookie secret and pid files.
        proxy_command: how to start ``configurable-http-proxy``.
        server_command: how to start a single-user server.
        environment: extra environment variables for every single-user server
            (e.g. ``JUPYTER_CONFIG_PATH`` when the exchange config is not in /etc/jupyter).
        service_token: if given, a service ``course-admin`` with this API token may manage
            users, servers and tokens (the test drives the hub with it; a real course
            needs none).

    Returns:
        Python source for JupyterHub.
    """
    students = _names(students, "students")
    instructors = _names(instructors, "instructors")
    if not students:
        raise ValueError("students: name at least one student account")
    if not instructors:
        raise ValueError("instructors: name at least one instructor account")
    for port, what in ((hub_port, "hub_port"), (proxy_api_port, "proxy_api_port")):
        if not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"{what} must be a TCP port number, got {port!r}")
    state = Path(state_dir)
    lines = [
        "# JupyterHub for a course with the book's chapters (nbgrader assignments).",
        "# Start it as root (it starts each user's server as that Unix user):",
        "#     jupyterhub -f jupyterhub_config.py",
        "c = get_config()  # noqa: F821 - provided by JupyterHub",
        f"c.JupyterHub.bind_url = {bind_url!r}",
        'c.JupyterHub.hub_ip = "127.0.0.1"',
        f"c.JupyterHub.hub_port = {hub_port}",
        f"c.JupyterHub.db_url = {'sqlite:///' + str(state / 'jupyterhub.sqlite')!r}",
        f"c.JupyterHub.cookie_secret_file = {str(state / 'jupyterhub_cookie_secret')!r}",
        f"c.JupyterHub.pid_file = {str(state / 'jupyterhub.pid')!r}",
        "# The proxy in front of the hub and the servers: configurable-http-proxy from npm.",
        f"c.ConfigurableHTTPProxy.command = {list(proxy_command)!r}",
        f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{proxy_api_port}'",
        f"c.ConfigurableHTTPProxy.pid_file = {str(state / 'proxy.pid')!r}",
        "# Unix accounts log in with their password (PAM, JupyterHub's default).",
        f"c.Authenticator.allowed_users = {_set(students + instructors)}",
        f"c.Authenticator.admin_users = {_set(instructors)}",
        "# One server per user, started as that Unix user in their home folder.",
        'c.JupyterHub.spawner_class = "localprocess"',
        f"c.Spawner.cmd = {list(server_command)!r}",
        'c.Spawner.ip = "127.0.0.1"',
        "c.Spawner.start_timeout = 120",
        "c.Spawner.http_timeout = 120",
    ]
    if environment:
        lines.append(f"c.Spawner.environment = {dict(environment)!r}")
    if service_token:
        lines += [
            "# A service that may manage users, servers and tokens (for scripts and tests).",
            f'c.JupyterHub.services = [{{"name": "course-admin", "api_token": {service_token!r}}}]',
            'c.JupyterHub.load_roles = [{"name": "course-admin", "services": ["course-admin"],',
            '                            "scopes": ["admin:users", "admin:servers", "tokens",',
            '                                       "access:servers", "list:users"]}]',
        ]
    return "\n".join(lines) + "\n"


def exchange_config(exchange_root: str | os.PathLike, course_id: str = COURSE_ID) -> str:
    """The text of the ``nbgrader_config.py`` that every user of the hub loads.

    Args:
        exchange_root: the exchange folder (mode 1777: everyone writes, nobody deletes
            another's files).
        course_id: the course id (the same as in the instructor's course folder).

    Returns:
        Python source for nbgrader.
    """
    if not isinstance(course_id, str) or not course_id:
        raise ValueError(f"course_id must be a non-empty str, got {course_id!r}")
    return (
        "# nbgrader on the hub, for every user: the course and the exchange folder.\n"
        "c = get_config()  # noqa: F821 - provided by nbgrader\n"
        f"c.CourseDirectory.course_id = {course_id!r}\n"
        f"c.Exchange.root = {str(exchange_root)!r}\n"
    )


def course_roster_lines(students: Sequence[str]) -> str:
    """Lines for the instructor's ``nbgrader_config.py`` that list the students.

    Args:
        students: the students' account names (nbgrader's student ids).

    Returns:
        Python source to append to the course's ``nbgrader_config.py``.
    """
    students = _names(students, "students")
    roster = [{"id": name} for name in students]
    return f"# The class list (nbgrader adds it to the gradebook).\nc.NbGrader.db_students = {roster!r}\n"
