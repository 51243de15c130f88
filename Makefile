# Everyday commands. The first two are the README's set-up commands: each one
# creates the virtual environment and installs everything it needs.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: book test lab execute lint clean

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	touch $(STAMP)

# The website's JavaScript libraries (package.json, pinned by package-lock.json); the build
# copies them into _static/npm/ (_ext/static_site.py), so no page loads anything from a CDN.
NODE_STAMP := node_modules/.installed
$(NODE_STAMP): package.json package-lock.json
	@command -v npm >/dev/null || { echo "npm (Node.js) is needed to build the website" >&2; exit 1; }
	npm ci --ignore-scripts --no-audit --no-fund
	touch $(NODE_STAMP)

## book: build the static website into _build/html and say where to open it
book: $(STAMP) $(NODE_STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going
	@echo "The book is built. Open file://$(CURDIR)/_build/html/index.html"

## test: every test: package, notebooks (strict nbval), hygiene, ruff, the book build, on both
## cores (pytest-xdist; conftest.py decides which tests run together on one worker)
test: $(STAMP) $(NODE_STAMP)
	tools/ensure_chromium.sh
	$(BIN)/python -m pytest -n 2

## lab: open the notebooks in JupyterLab
lab: $(STAMP)
	$(BIN)/jupyter lab chapters/

## execute: re-run every chapter (or NB=chapters/03_x.ipynb) and store its outputs, in the
## pinned numeric environment of tools/numerics/pinned.env (the test command uses the same,
## through conftest.py)
NB ?= chapters/*.ipynb
execute: $(STAMP)
	for nb in $(NB); do tools/with_numerics pinned $(BIN)/jupyter execute --inplace $$nb || exit 1; done

## practice: regenerate practice/NN_name.ipynb (the self-learner's version of each chapter)
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
## grades each exercise in clean, sandboxed processes; grades writes grades.csv and
## exercises.csv
COURSE_DIR ?=
CHAPTERS ?=
ASSIGNMENT ?=
STUDENT ?=
NEW ?=
CLASSROOM = $(BIN)/python -m attention_book.classroom
STUDENT_ARGS = $(foreach s,$(STUDENT),--student $(s))
.PHONY: assignments autograde feedback grades
assignments: $(STAMP)
	$(CLASSROOM) generate --course-dir "$(COURSE_DIR)" $(if $(strip $(NEW)),--new) $(if $(strip $(CHAPTERS)),--chapters $(CHAPTERS))

autograde: $(STAMP)
	$(CLASSROOM) autograde "$(ASSIGNMENT)" --course-dir "$(COURSE_DIR)" $(STUDENT_ARGS)

feedback: $(STAMP)
	$(CLASSROOM) feedback "$(ASSIGNMENT)" --course-dir "$(COURSE_DIR)" $(STUDENT_ARGS)

grades: $(STAMP)
	$(CLASSROOM) export --course-dir "$(COURSE_DIR)"

## test-gpu: the device tests on CUDA (not part of `make test`: CI has no GPU). Fails, with a
## message, on a machine where PyTorch sees no CUDA device; never passes silently.
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
