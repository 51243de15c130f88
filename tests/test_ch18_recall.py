"""Chapter 18's recall experiment: the stored results and the code that trains them.

Section 18.5 reads its accuracies from ``recall_sweep.json`` (``load_recall_sweep``), which
``tools/recall_sweep.py`` wrote by training every run of ``RECALL_RUNS`` with seeds 0 to 4:
minutes of training, which the chapter cannot afford. The chapter retrains one of those runs
(DeltaNet, its ``SEED``) and asserts its claims for every stored seed; ``tools/recall_sweep.py
--check`` retrains them all. Here: the file holds every run of every seed, and one run trained
again gives exactly the stored numbers, so a change to the models or the training that moves
the results fails the tests rather than leaving the chapter to quote stale numbers.
"""

from __future__ import annotations

import pytest

from attention_book.recall_task import (
    RECALL_RUNS,
    RECALL_SETUP,
    load_recall_sweep,
    recall_mixer,
    recall_pairs,
    recall_run,
)


def test_the_stored_sweep_holds_every_run_of_every_seed():
    sweep = load_recall_sweep()
    assert sweep["setup"] == RECALL_SETUP and sweep["seeds"] == [0, 1, 2, 3, 4]
    stored = {(run["model"], tuple(run["layers"]), run["d_k"], run["task"], run["seed"])
              for run in sweep["runs"]}
    assert stored == {(*run, seed) for run in RECALL_RUNS for seed in sweep["seeds"]}
    for run in sweep["runs"]:
        if run["task"] == "recall":
            assert run["pairs"] == list(recall_pairs(run["d_k"]))
            assert len(run["accuracy"]) == len(run["pairs"])
            assert all(0.0 <= value <= 1.0 for value in run["accuracy"])
        else:
            assert 0.0 <= run["new"] <= 1.0 and 0.0 <= run["stale"] <= 1.0


def test_one_stored_run_trains_again_to_the_same_numbers():
    """The cheapest run (linear attention, d_k = 4, seed 0: 1000 steps, a few seconds)."""
    stored = next(run for run in load_recall_sweep()["runs"]
                  if (run["model"], run["d_k"], run["task"], run["seed"]) == ("linear", 4, "recall", 0))
    trained = recall_run(["linear"], head_dim=4, seed=0)
    assert trained == {key: stored[key] for key in ("pairs", "accuracy", "loss")}


def test_recall_pairs_and_bad_arguments():
    assert recall_pairs(8) == (2, 4, 6, 8, 12, 16)
    assert recall_pairs(4) == (1, 2, 3, 4, 6, 8)
    assert recall_pairs(16) == (4, 8, 12, 16, 24, 32)
    with pytest.raises(ValueError, match="kind must be one of"):
        recall_mixer("mamba", d_model=32, head_dim=8)
    with pytest.raises(ValueError, match="task must be 'recall' or 'changed'"):
        recall_run(["linear"], head_dim=4, seed=0, task="copy", steps=1)
    with pytest.raises(TypeError, match="layers must be a non-empty list"):
        recall_run("linear", head_dim=4, seed=0, steps=1)
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        recall_run(["linear"], head_dim=4, seed=-1, steps=1)
