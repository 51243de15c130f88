#!/usr/bin/env python3
"""Store notebooks in one canonical form, so that re-executing an unchanged chapter changes nothing.

A fresh run of a notebook differs from the stored one in ways that say nothing about the
chapter:

* the executor records when each cell ran (``metadata.execution``: the ``iopub.*`` and
  ``shell.execute_reply`` timestamps);
* the kernel sends a cell's printed text in as many stream outputs as it happened to flush,
  so the same text is split differently from run to run (nbval joins them before comparing,
  and so does the website, ``nb_merge_streams``);
* every ipywidget (a progress bar, a slider) gets a random model id, in the notebook's widget
  state and in the outputs that display it.

This tool removes the first, joins consecutive stream outputs of the same name, and renumbers
the widget models in a fixed order (the order in which the outputs display them, each followed
by the models its state refers to). Nothing else changes: the text of every output, the
figures and the order of the outputs stay as they are. ``make execute`` runs it on every
notebook it executes (``tools/execute_notebook.py``); ``tests/test_publishing.py`` checks that
every stored chapter and practice notebook is already in this form.

usage: python tools/normalize_notebooks.py [--check] NOTEBOOK...
       (--check: change nothing, list the notebooks that are not normalised, exit 1 if any)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import nbformat

WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_REFERENCE = re.compile(r"^IPY_MODEL_(.+)$")


def _merge_streams(outputs: list) -> list:
    merged = []
    for output in outputs:
        previous = merged[-1] if merged else None
        if (output.get("output_type") == "stream" and previous is not None
                and previous.get("output_type") == "stream"
                and previous.get("name") == output.get("name")):
            previous["text"] = previous["text"] + output["text"]
        else:
            merged.append(output)
    return merged


def _references(value) -> list[str]:
    """The model ids a widget's state refers to ("IPY_MODEL_<id>"), in a fixed order."""
    found = []
    if isinstance(value, str):
        match = _REFERENCE.match(value)
        if match:
            found.append(match.group(1))
    elif isinstance(value, dict):
        for key in sorted(value):
            found += _references(value[key])
    elif isinstance(value, list):
        for item in value:
            found += _references(item)
    return found


def _widget_ids(notebook) -> dict[str, str]:
    """Old model id -> new one, numbered in the order the notebook shows them and written like
    the random ones (32 hexadecimal digits, as a uuid4's hex), e.g. 000...0001."""
    state = notebook.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    order: list[str] = []

    def visit(model_id: str) -> None:
        if model_id in order:
            return
        order.append(model_id)
        for reference in _references(state.get(model_id, {}).get("state", {})):
            visit(reference)

    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            view = output.get("data", {}).get(WIDGET_VIEW)
            if view and "model_id" in view:
                visit(view["model_id"])

    def content(model_id: str) -> str:  # the models no output shows: ordered by what they hold
        return json.dumps(state[model_id], sort_keys=True)

    for model_id in sorted(set(state) - set(order), key=content):
        visit(model_id)
    return {old: f"{index:032x}" for index, old in enumerate(order, 1)}


def _rename(value, ids: dict[str, str]):
    if isinstance(value, str):
        match = _REFERENCE.match(value)
        if match and match.group(1) in ids:
            return f"IPY_MODEL_{ids[match.group(1)]}"
        return ids.get(value, value) if value in ids else value
    if isinstance(value, dict):
        return {ids.get(key, key): _rename(item, ids) for key, item in value.items()}
    if isinstance(value, list):
        return [_rename(item, ids) for item in value]
    return value


def normalize(notebook):
    """Normalise a notebook (an ``nbformat`` node, changed in place) and return it."""
    for cell in notebook.cells:
        cell.get("metadata", {}).pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = _merge_streams(cell.outputs)
    ids = _widget_ids(notebook)
    if ids:
        widgets = notebook.metadata["widgets"]
        notebook.metadata["widgets"] = nbformat.from_dict(_rename(widgets, ids))
        for cell in notebook.cells:
            for output in cell.get("outputs", []):
                view = output.get("data", {}).get(WIDGET_VIEW)
                if view and view.get("model_id") in ids:
                    view["model_id"] = ids[view["model_id"]]
    return notebook


def normalized_text(text: str) -> str:
    """The normalised form of a notebook's file text, in the layout Jupyter writes."""
    notebook = nbformat.reads(text, as_version=nbformat.NO_CONVERT)
    return nbformat.writes(normalize(notebook)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a notebook is not normalised")
    parser.add_argument("notebooks", nargs="+", type=Path)
    options = parser.parse_args(argv)
    stale = []
    for path in options.notebooks:
        text = path.read_text(encoding="utf-8")
        normal = normalized_text(text)
        if normal != text:
            stale.append(path)
            if not options.check:
                path.write_text(normal, encoding="utf-8")
    if options.check and stale:
        print("not normalised (run python tools/normalize_notebooks.py on them):", file=sys.stderr)
        for path in stale:
            print(f"  {path}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
