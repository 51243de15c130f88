"""The GitHub Pages workflow builds the website with the README's command and deploys it.

``.github/workflows/pages.yml`` is parsed; its build job's ``run:`` steps are the README's
build command, and this test runs them here, as GitHub's runner would after checking out the
repository and setting up Python and Node.js (the ``uses:`` steps). The deploy job hands
``_build/html`` to GitHub Pages with the official actions. The steps build the website into
``_build/``, so this file is one of the tests of the built book (``conftest.py``), which one
worker runs one after the other.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "pages.yml"


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _steps(job: str) -> list[dict]:
    return _workflow()["jobs"][job]["steps"]


def test_the_workflow_publishes_the_configured_branch_to_pages():
    workflow = _workflow()
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    triggers = workflow[True]  # PyYAML reads the key `on` as True
    assert triggers["push"]["branches"] == [config["repository"]["branch"]]
    assert workflow["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}
    uses = [step.get("uses", "") for step in _steps("build")]
    assert [u.split("@")[0] for u in uses if u] == [
        "actions/checkout", "actions/setup-python", "actions/setup-node",
        "actions/upload-pages-artifact"]
    setup_python = next(step for step in _steps("build") if "setup-python" in step.get("uses", ""))
    assert setup_python["with"]["python-version"] == "3.11"  # the README's Python
    upload = next(step for step in _steps("build") if "upload-pages-artifact" in step.get("uses", ""))
    assert upload["with"]["path"] == "_build/html"
    deploy = workflow["jobs"]["deploy"]
    assert deploy["needs"] == "build" and deploy["environment"]["name"] == "github-pages"
    assert [step["uses"].split("@")[0] for step in deploy["steps"]] == ["actions/deploy-pages"]


def test_the_build_steps_are_the_readmes_command_and_build_the_site_here():
    commands = [step["run"].strip() for step in _steps("build") if "run" in step]
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)  # the README's commands
    assert commands == ["make book"] and any(re.search(r"^make book\b", block, re.M)
                                             for block in blocks), commands
    venv = Path(sys.prefix)  # the environment running these tests, as make's VENV
    for command in commands:
        result = subprocess.run(["bash", "-e", "-c", f"{command} VENV={venv}"], cwd=ROOT,
                                capture_output=True, text=True, timeout=1200)
        assert result.returncode == 0, f"`{command}` failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        assert "Finished generating HTML for book" in result.stdout, result.stdout[-3000:]
    assert (ROOT / "_build" / "html" / "index.html").is_file()
    assert (ROOT / "_build" / "html" / "_static" / "npm").is_dir()
