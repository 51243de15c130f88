"""One more run of every chapter: another CPU code path, the practice version, the wheel, the
sandboxed feedback kernel.

The test command runs every kernel in the pinned numeric environment
(``tools/numerics/pinned.env``, applied by the top-level ``conftest.py``), and strict nbval
compares each chapter with its stored outputs. Each chapter then runs once more, and that one
run checks three things at once:

1. **Another CPU code path.** It runs under ``tools/numerics/alternate.env`` (PyTorch's
   portable kernels instead of AVX2, MKL's SSE2 branch, one thread instead of two) and is
   compared with the stored outputs exactly as the main run compares them: strict nbval, same
   sanitiser. A chapter that prints float noise, or whose training amplifies rounding
   differences into a printed number, fails here even if it passes on the machine that stored it.
2. **The practice notebook** (``practice/NN_name.ipynb``, what the website's buttons open).
   Up to its first exercise it is the chapter, cell for cell (checked below), so the chapter's
   run is its run. From the first exercise on, after each of the chapter's cells the kernel
   also runs the practice version of that cell in a namespace of its own, copied from the
   chapter's just before the first exercise: the blank answer cell (signature, docstring,
   ``raise NotImplementedError()``), then the check cell, which must print the checker's
   feedback ("Not yet ...") and fail its assert, never raise a ``NameError`` and never say
   "Correct"; any other cell must run without an error.
3. **The package as a wheel.** The kernel runs in a fresh virtual environment where the book's
   package is installed from a wheel that ``python -m build`` made from the repository's files
   (not the editable install), so a module or data file missing from the wheel fails here.
   That environment reaches torch and the other dependencies through a ``.pth`` file naming
   this environment's site-packages; ``.pth`` files inside a folder added that way are not
   processed, so this environment's editable install of the package is not active there (the
   first injected cell asserts that the package comes from the fresh environment).
4. **nbgrader's sandboxed feedback kernel.** The kernel is the one ``autograde`` gives nbgrader
   (``attention_book.classroom.sandbox``, with the chapter's policy and every layer this
   machine gives), so each chapter's solutions run once as an honest student's notebook runs
   in a feedback run: no cell may fail, and its report must hold nothing but the layers it
   entered (a refusal there would flag every honest student of the chapter).

Each chapter's run is a group of its own for ``make test``'s two workers (top-level
``conftest.py``), and runs on one thread, so two run side by side.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import pytest
from repository_files import copy_repository

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "book_numerics", ROOT / "tools" / "numerics" / "environment.py"
)
_numerics = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_numerics)
numeric_environment = _numerics.numeric_environment

CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
PRACTICE = ROOT / "practice"
INJECTED = "# Injected by tests/test_code_paths.py"


def _environment(name: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("BOOK_NUMERICS", "PYTHONPATH")}
    env["BOOK_NUMERICS"] = name
    env.update(numeric_environment(name))
    return env


@pytest.mark.parametrize(("name", "capability"), [("pinned", "AVX2"), ("alternate", "DEFAULT")])
def test_the_numeric_environment_reaches_torch(name: str, capability: str) -> None:
    """Each environment really selects the code path it names in a fresh process."""
    probe = (
        "import torch; print(torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())"
    )
    result = subprocess.run([sys.executable, "-c", probe], env=_environment(name),
                            capture_output=True, text=True, timeout=120, check=True)
    threads = numeric_environment(name)["OMP_NUM_THREADS"]
    assert result.stdout.split() == [capability, threads]


def test_the_two_environments_differ_where_it_matters() -> None:
    """The alternate path changes every setting the pinned one fixes, or it would prove nothing."""
    pinned, alternate = numeric_environment("pinned"), numeric_environment("alternate")
    assert pinned.keys() == alternate.keys()
    assert all(pinned[key] != alternate[key] for key in pinned)


# --------------------------------------------------------------------------------------
# The wheel and the fresh environment that runs it.


def _run(command: list, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True,
                            **kwargs)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """``python -m build`` on a copy of the repository's files: an sdist, then a wheel from it.

    ``--no-isolation`` builds with this environment's pinned setuptools (requirements.txt)
    instead of downloading one; otherwise it is what the README's ``python -m build`` does.
    """
    work = tmp_path_factory.mktemp("wheel")
    source = copy_repository(work / "source")
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", work / "dist", source])
    wheels = sorted((work / "dist").glob("*.whl"))
    assert len(wheels) == 1 and wheels[0].name.startswith("attention_book-"), wheels
    return wheels[0]


@pytest.fixture(scope="session")
def wheel_python(wheel, tmp_path_factory) -> Path:
    """The Python of a fresh virtual environment with the wheel installed (not editable)."""
    venv = tmp_path_factory.mktemp("wheel-venv")
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
                     ).stdout.strip())
    # torch, pytest, nbval, ipykernel ... come from this environment, read as a plain folder.
    (site / "book_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
          "--ignore-installed", wheel])
    return python


def test_the_wheel_holds_every_file_of_the_package(wheel):
    """Every file under src/attention_book that git tracks is in the wheel (modules, demos' .js/.css)."""
    import zipfile

    from repository_files import repository_files

    wanted = {name.removeprefix("src/") for name in repository_files()
              if name.startswith("src/attention_book/")}
    with zipfile.ZipFile(wheel) as archive:
        held = set(archive.namelist())
    assert wanted and wanted <= held, f"missing from the wheel: {sorted(wanted - held)}"
    assert not [name for name in held if name.startswith(("tests/", "chapters/", "tools/"))]


def test_the_fresh_environment_imports_the_package_from_the_wheel(wheel_python):
    probe = ("import sys, attention_book, attention_book.exercises, attention_book.classroom; "
             "print(sys.prefix); print(attention_book.__file__)")
    prefix, location = _run([wheel_python, "-c", probe], cwd=wheel_python.parents[2]).stdout.split()
    assert location.startswith(prefix + os.sep) and "site-packages" in location, (prefix, location)
    assert not location.startswith(str(ROOT)), location


# --------------------------------------------------------------------------------------
# The notebook that one run executes: the chapter, with the practice version's cells injected.

_WHEEL_CELL = f'''{INJECTED}: the book's package must come from the wheel's environment.
import sys as _book_sys

import attention_book as _book_package

assert _book_package.__file__.startswith(_book_sys.prefix + "/") and (
    "site-packages" in _book_package.__file__), (_book_package.__file__, _book_sys.prefix)
del _book_sys, _book_package'''

_PRACTICE_SETUP = f'''{INJECTED}: from here on, the practice version of each cell runs too,
# in a namespace of its own: a copy of this one, taken before the first exercise (where the
# practice notebook is the chapter, cell for cell).
_book_practice = dict(globals())


def _book_run_practice_cell(source, kind, label):
    import sys as _sys

    from IPython.core.inputtransformer2 import TransformerManager
    from IPython.utils.capture import capture_output

    code = compile(TransformerManager().transform_cell(source), label, "exec")
    error = None
    with capture_output() as captured:
        try:
            exec(code, _book_practice)
        except Exception as exc:  # noqa: BLE001 - what the learner would see
            error = exc
        if "matplotlib.pyplot" in _sys.modules:  # figures of the practice run are not shown
            _sys.modules["matplotlib.pyplot"].close("all")
    text = captured.stdout + captured.stderr + "".join(
        str(output.data.get("text/plain", "")) for output in captured.outputs)
    if kind == "check":
        assert type(error) is AssertionError, (
            f"{{label}}: with the exercise still blank, the check must print feedback and fail "
            f"its assert, not raise {{error!r}}:\\n{{text}}")
        assert "Not yet" in text and "Correct" not in text, (
            f"{{label}}: a blank exercise's check printed no feedback (or said Correct):\\n{{text}}")
    else:
        assert error is None, f"{{label}} fails in the practice notebook: {{error!r}}\\n{{text}}"'''


def _code_cell(source: str):
    return nbformat.v4.new_code_cell(source)


def _kind(cell) -> str:
    meta = cell.metadata.get("nbgrader", {})
    return "check" if meta.get("grade") and not meta.get("solution") else "code"


def combined_notebook(chapter: Path, practice: Path):
    """The chapter with the wheel check and the practice version's cells injected (see above)."""
    notebook = nbformat.read(chapter, as_version=4)
    learner = nbformat.read(practice, as_version=4)
    own = [cell for cell in learner.cells if cell.get("id") != "practice-header"]
    assert [cell.get("id") for cell in own] == [cell.get("id") for cell in notebook.cells], (
        f"{practice.name} does not have the cells of {chapter.name} in the same order: "
        "run `make practice`")
    first = next((i for i, cell in enumerate(notebook.cells)
                  if cell.cell_type == "markdown" and "exercise" in cell.metadata), None)
    assert first is not None, f"{chapter.name} has no exercise"
    cells, checks, copied = [_code_cell(_WHEEL_CELL)], 0, False
    for index, (cell, practice_cell) in enumerate(zip(notebook.cells, own, strict=True)):
        exercise_part = index > first and cell.cell_type == "code"
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and not (meta.get("solution") or meta.get("grade")):
            assert practice_cell.source == cell.source, (
                f"{practice.name}: code cell {cell.get('id')} differs from the chapter's: "
                "run `make practice`")
        if exercise_part and not copied:
            cells.append(_code_cell(_PRACTICE_SETUP))
            copied = True
        cells.append(cell)
        if exercise_part:
            kind = _kind(practice_cell)
            checks += kind == "check"
            cells.append(_code_cell(
                f"{INJECTED}: the practice version of the cell above.\n"
                f"_book_run_practice_cell({json.dumps(practice_cell.source)}, {kind!r}, "
                f"{('practice cell ' + str(practice_cell.get('id')))!r})"))
    assert checks >= 1, f"{chapter.name}: no check cell after the first exercise"
    notebook.cells = cells
    return notebook


@pytest.fixture(scope="session")
def sandbox_layers() -> str:
    """The layers nbgrader's feedback kernel enters on this machine, as autograde asks for them."""
    from attention_book.classroom import sandbox

    layers = sandbox.available_layers()
    assert layers.protected, "this machine gives the feedback kernel no kernel-enforced layer"
    return layers.to_json()


def _sandboxed_kernel(wheel_python: Path, chapter: Path, folder: Path, layers: str) -> Path:
    """nbgrader's feedback kernel of the wheel's package, with the chapter's policy, as
    autograde's kernel spec makes it, writing its report to ``folder/report.log``."""
    from attention_book.classroom import sandbox

    # Where the wheel put the package, found without importing it (torch, nbformat: seconds).
    script = Path(_run([wheel_python, "-c", "import importlib.util; "
                        "print(importlib.util.find_spec('attention_book').origin)"]
                       ).stdout.strip()).parent / "classroom" / "sandbox.py"
    assert script.is_file() and not script.is_relative_to(ROOT), script
    policy = sandbox.policy_for(int(chapter.name[:2]))
    spec = folder / "jupyter" / "kernels" / "book-sandboxed"
    spec.mkdir(parents=True)
    scratch = folder / "scratch"
    scratch.mkdir()
    (folder / "report.log").touch()
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(wheel_python), "-P", str(script), "kernel", "-f", "{connection_file}"],
        "display_name": "sandboxed", "language": "python",
        "env": {"BOOK_SANDBOX_POLICY": json.dumps({"processes": policy.processes,
                                                   "loopback_tcp": policy.loopback_tcp}),
                "BOOK_SANDBOX_REQUIRE": layers,
                "BOOK_SANDBOX_JAIL": "1" if json.loads(layers)["namespaces"] else "0",
                "BOOK_SANDBOX_REPORT": str(folder / "report.log"), "TMPDIR": str(scratch),
                "MPLBACKEND": os.environ["MPLBACKEND"]}}))
    return folder / "jupyter"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda path: path.stem)
def test_chapter_under_another_code_path_from_the_wheel_with_its_practice_version(
        chapter: Path, wheel_python: Path, sandbox_layers: str, tmp_path: Path) -> None:
    """One run of the chapter checks the alternate code path, the practice notebook, the wheel,
    and nbgrader's sandboxed feedback kernel: an honest run of the chapter's solutions there
    fails no cell and raises no flag (trial v4, D11)."""
    run = tmp_path / chapter.name
    nbformat.write(combined_notebook(chapter, PRACTICE / chapter.name), run)
    kernels = _sandboxed_kernel(wheel_python, chapter, tmp_path / "kernel", sandbox_layers)
    result = subprocess.run(
        [str(wheel_python), "-m", "pytest", "--nbval", "--nbval-kernel-name=book-sandboxed",
         f"--nbval-sanitize-with={ROOT / 'tests' / 'nbval_sanitize.cfg'}",
         "-p", "no:cacheprovider", "-q", "--no-header", "-rf", f"--rootdir={tmp_path}",
         run.name],
        cwd=tmp_path, env={**_environment("alternate"), "JUPYTER_PATH": str(kernels)},
        capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    summary = "\n".join(line for line in output.splitlines()
                        if line.startswith(("FAILED", "ERROR")) or " passed" in line
                        or " failed" in line)
    assert result.returncode == 0, (
        f"{chapter.name}: the run under the alternate CPU code path "
        "(tools/numerics/alternate.env), from the wheel, with the practice version's cells "
        f"(the cells marked '{INJECTED}'), in nbgrader's sandboxed kernel, failed:\n{summary}"
        f"\n\n{output[-6000:]}")
    report = (tmp_path / "kernel" / "report.log").read_text().splitlines()
    assert any(line.startswith("layers: ") for line in report), report
    assert [line for line in report if not line.startswith("layers: ")] == [], (
        f"{chapter.name}: the sandboxed kernel refused or stopped something of an honest run "
        "(an honest student would be flagged): " + "; ".join(report))
