# Everyday commands. The first two are the README's set-up commands: each one
# creates the virtual environment and installs what it needs.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
# One virtual environment, two stamps. The website build needs only requirements-book.txt
# (jupyter-book and its extensions: no torch, since the build renders stored outputs);
# everything else (torch, the package, the test and classroom tools) goes on top of it.
BOOK_STAMP := $(VENV)/.installed-book
STAMP := $(VENV)/.installed
# Where PyPI would give the CUDA build of torch (Linux x86-64), install the pinned version
# from PyTorch's CPU index first: make test TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
TORCH_INDEX_URL ?=

.PHONY: book test lab lab-chapters execute lint clean

$(BOOK_STAMP): requirements-book.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-book.txt
	touch $(BOOK_STAMP)

$(STAMP): $(BOOK_STAMP) requirements.txt pyproject.toml
	$(if $(TORCH_INDEX_URL),$(BIN)/python -m pip install --quiet --index-url $(TORCH_INDEX_URL) \
	    "$$(grep -m1 '^torch==' requirements.txt)")
	$(BIN)/python -m pip install --quiet -r requirements.txt
	tools/ensure_seccomp.sh $(BIN)/python
	touch $(STAMP)

# The website's JavaScript libraries (package.json, pinned by package-lock.json); the build
# copies them into _static/npm/ (_ext/static_site.py), so no page loads anything from a CDN.
NODE_STAMP := node_modules/.installed
$(NODE_STAMP): package.json package-lock.json
	@command -v npm >/dev/null || { echo "npm (Node.js) is needed to build the website" >&2; exit 1; }
	npm ci --ignore-scripts --no-audit --no-fund
	touch $(NODE_STAMP)

## book: build the static website into _build/html and say where to open it (--quiet hides
## Sphinx's progress, not its warnings, and -W makes any warning an error). Opened as a file
## the search lists pages without snippets (the browser refuses to fetch the page texts), so
## it also prints the command that serves the site as a web host would
book: $(BOOK_STAMP) $(NODE_STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going --quiet
	@echo "Or serve it, for the search's snippets too: $(BIN)/python -m http.server -d _build/html 8000, then open http://127.0.0.1:8000"

## test: every test: package, notebooks (strict nbval), hygiene, ruff, the book build, on both
## cores (pytest-xdist; conftest.py decides which tests run together on one worker); the 25
## slowest steps are listed at the end, to keep the 15-minute budget in view
test: $(STAMP) $(NODE_STAMP)
	tools/ensure_chromium.sh
	tools/ensure_seccomp.sh $(BIN)/python
	$(BIN)/python -m pytest -n 2 --durations=25

## lab: what a learner needs (requirements-lab.txt: torch, JupyterLab, the book's package; not
## the test and classroom tools), the practice notebooks copied into my-work/ (a folder git
## ignores; a notebook already there is never overwritten, so your answers stay), and
## JupyterLab opened there. lab-chapters: JupyterLab opened in chapters/ (the chapters with
## their solutions, for authors), with everything make test installs
LAB_STAMP := $(VENV)/.installed-lab
MY_WORK := my-work
$(LAB_STAMP): requirements-lab.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(if $(TORCH_INDEX_URL),$(BIN)/python -m pip install --quiet --index-url $(TORCH_INDEX_URL) \
	    "$$(grep -m1 '^torch==' requirements-lab.txt)")
	$(BIN)/python -m pip install --quiet -r requirements-lab.txt
	touch $(LAB_STAMP)

lab: $(LAB_STAMP)
	@mkdir -p $(MY_WORK)
	@for notebook in practice/*.ipynb; do \
	    test -e "$(MY_WORK)/$${notebook##*/}" || { cp "$$notebook" $(MY_WORK)/ && echo "copied $$notebook to $(MY_WORK)/"; }; \
	done
	$(BIN)/jupyter lab --ServerApp.root_dir="$(CURDIR)" --ContentsManager.preferred_dir=$(MY_WORK)

lab-chapters: $(STAMP)
	$(BIN)/jupyter lab --ServerApp.root_dir="$(CURDIR)" --ContentsManager.preferred_dir=chapters

## execute: re-run every chapter (or NB=chapters/03_x.ipynb) with a fresh kernel and store its
## outputs, in the pinned numeric environment of tools/numerics/pinned.env (the test command
## uses the same, through conftest.py); tools/execute_notebook.py stores them normalised
## (tools/normalize_notebooks.py), so re-running an unchanged chapter changes nothing
NB ?= chapters/*.ipynb
execute: $(STAMP)
	for nb in $(NB); do tools/with_numerics pinned $(BIN)/python tools/execute_notebook.py $$nb || exit 1; done

## practice: write every chapter's Colab install cell (and CITATION.cff, the deploy workflow)
## from the repository setting in _config.yml, then regenerate practice/NN_name.ipynb (the
## self-learner's version of each chapter)
.PHONY: practice
practice: $(STAMP)
	$(BIN)/python -m attention_book.classroom.practice

## assignments: nbgrader student versions of the chosen chapters in a course folder outside
## the clone, e.g. make assignments COURSE_DIR=$HOME/attention-course CHAPTERS="02 04" NEW=1
## (NEW=1 the first time: it creates the course; without it a missing course is an error, so
## a typo never starts a new one. CHAPTERS empty: every chapter). Safe to rerun on a running
## course: your nbgrader_config.py is kept and a chapter with submissions is left alone.
## autograde, feedback, grades: the course commands, e.g. ASSIGNMENT=02 (a chapter number or
## the assignment id) and STUDENT=alice (optional; several: STUDENT="alice bob"). autograde
## grades each exercise in clean, sandboxed processes, JOBS students at a time (default: the
## number of cores); it refuses where the machine gives no kernel-enforced isolation unless
## UNSAFE=1 (every grade of such a run is marked UNPROTECTED); grades writes grades.csv and
## exercises.csv
COURSE_DIR ?=
CHAPTERS ?=
ASSIGNMENT ?=
STUDENT ?=
NEW ?=
JOBS ?= $(shell nproc 2>/dev/null || echo 1)
UNSAFE ?=
CLASSROOM = $(BIN)/python -m attention_book.classroom
STUDENT_ARGS = $(foreach s,$(STUDENT),--student $(s))
.PHONY: assignments autograde feedback grades
assignments: $(STAMP)
	$(CLASSROOM) generate --course-dir "$(COURSE_DIR)" $(if $(strip $(NEW)),--new) $(if $(strip $(CHAPTERS)),--chapters $(CHAPTERS))

autograde: $(STAMP)
	tools/ensure_seccomp.sh $(BIN)/python
	$(CLASSROOM) autograde "$(ASSIGNMENT)" --course-dir "$(COURSE_DIR)" $(STUDENT_ARGS) \
	    --jobs "$(JOBS)" $(if $(strip $(UNSAFE)),--unsafe-no-isolation)

feedback: $(STAMP)
	$(CLASSROOM) feedback "$(ASSIGNMENT)" --course-dir "$(COURSE_DIR)" $(STUDENT_ARGS)

grades: $(STAMP)
	$(CLASSROOM) export --course-dir "$(COURSE_DIR)"

## test-gpu: the device tests on CUDA (not part of `make test`: CI has no GPU). Fails, with a
## message, on a machine where PyTorch sees no CUDA device; never passes silently. It first
## installs the project's requirements into .venv ($(STAMP): torch==2.13.0, PyPI's CUDA build
## on Linux, and bertviz, which the picture tests need), so it runs on a fresh GPU machine. The
## meta-device tests in it also hold on torch 2.5.1, the oldest release pyproject.toml allows.
.PHONY: test-gpu
test-gpu: $(STAMP)
	@$(BIN)/python -c "import sys, torch; ok = torch.cuda.is_available(); \
	print('CUDA device:', torch.cuda.get_device_name(0) if ok else 'none (this target needs a GPU)'); \
	sys.exit(0 if ok else 1)"
	$(BIN)/python -m pytest tests/test_devices.py --device cuda

lint: $(STAMP)
	$(BIN)/ruff check src tests

clean:
	rm -rf _build
