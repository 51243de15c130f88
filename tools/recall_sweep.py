#!/usr/bin/env python3
"""Train chapter 18's recall experiment for every seed, and store or check its results.

Section 18.5 compares memories on associative recall: softmax attention, linear attention,
DeltaNet, Gated DeltaNet and a hybrid with one head of ``d_k = 8`` features, and the three
fixed states again with ``d_k = 4`` and ``d_k = 16``; section 18.6 compares DeltaNet and
Gated DeltaNet on changed associations (``attention_book.recall_task.RECALL_RUNS``); each
run trains for 1000 steps, with seeds 0 to 4. That takes minutes, more than a chapter may
take, so this tool trains them (``recall_run``, one thread per run) and writes the accuracies
into ``src/attention_book/recall_sweep.json``, which the chapter reads
(``load_recall_sweep``) and whose claims it asserts for every seed.

Run it in the pinned numeric environment, as ``make execute`` does, from the repository root:

    tools/with_numerics pinned .venv/bin/python tools/recall_sweep.py --jobs 2          # write
    tools/with_numerics pinned .venv/bin/python tools/recall_sweep.py --check --jobs 2  # check

``--check`` trains every run again and compares each number with the stored file; it exits
with status 1 and names the runs that differ, if any do. ``--seeds`` and ``--runs
TASK:NAME@D_K`` restrict it (e.g. ``--runs recall:DeltaNet@8 --seeds 3``). About 1.5 minutes
per seed on one idle core (16 runs of 1000 steps); ``--jobs 2`` runs two at a time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from attention_book.recall_task import RECALL_RUNS, RECALL_SETUP, recall_run  # noqa: E402

RESULTS = ROOT / "src" / "attention_book" / "recall_sweep.json"
SEEDS = (0, 1, 2, 3, 4)


def _one(job: tuple[str, tuple[str, ...], int, str, int]) -> dict:
    name, layers, d_k, task, seed = job
    start = time.perf_counter()
    result = recall_run(layers, head_dim=d_k, seed=seed, task=task)
    shown = {key: value for key, value in result.items() if key != "pairs"}
    print(f"  {task} {name} d_k={d_k} seed={seed}: {shown} "
          f"({time.perf_counter() - start:.0f} s)", flush=True)
    return {"model": name, "layers": list(layers), "d_k": d_k, "task": task, "seed": seed,
            **result}


def _key(run: dict) -> tuple[str, int, str, int]:
    return run["model"], run["d_k"], run["task"], run["seed"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="train again and compare with the stored file; write nothing")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--runs", nargs="+", metavar="TASK:NAME@D_K",
                        help="only these runs, e.g. recall:DeltaNet@8 'changed:Gated DeltaNet@8'")
    parser.add_argument("--jobs", type=int, default=1)
    options = parser.parse_args(argv)
    runs = RECALL_RUNS
    if options.runs:
        wanted = set(options.runs)
        runs = tuple(run for run in RECALL_RUNS if f"{run[3]}:{run[0]}@{run[2]}" in wanted)
        if len(runs) != len(wanted):
            known = ", ".join(f"{task}:{name}@{d_k}" for name, _, d_k, task in RECALL_RUNS)
            parser.error(f"--runs: unknown run among {sorted(wanted)}; the runs are {known}")
    if not options.check and (options.runs or sorted(options.seeds) != list(SEEDS)):
        parser.error("writing the file needs every run and the seeds 0 to 4; restrict only "
                     "with --check")
    jobs = [(name, layers, d_k, task, seed) for seed in options.seeds
            for name, layers, d_k, task in runs]
    print(f"{len(jobs)} runs of {RECALL_SETUP['steps']} steps, {options.jobs} at a time",
          flush=True)
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=options.jobs) as pool:
        fresh = list(pool.map(_one, jobs))
    print(f"trained in {time.perf_counter() - start:.0f} s")
    if not options.check:
        RESULTS.write_text(json.dumps({"setup": RECALL_SETUP, "seeds": list(SEEDS),
                                       "runs": fresh}, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {RESULTS.relative_to(ROOT)}")
        return 0
    stored = json.loads(RESULTS.read_text(encoding="utf-8"))
    if stored["setup"] != RECALL_SETUP:
        print(f"the stored setup {stored['setup']} is not RECALL_SETUP {RECALL_SETUP}")
        return 1
    by_key = {_key(run): run for run in stored["runs"]}
    differ = [run for run in fresh if by_key.get(_key(run)) != run]
    for run in differ:
        print(f"DIFFERS: {run['task']} {run['model']} d_k={run['d_k']} seed={run['seed']}: "
              f"trained {run}, stored {by_key.get(_key(run))}")
    print(f"{len(fresh) - len(differ)} of {len(fresh)} runs equal the stored file")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
