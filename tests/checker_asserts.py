"""What a checker's test asserts about its feedback, shared by the chapters' checker tests.

Checkers print ``Correct: …`` and return True, or print ``Not yet. …`` with one
``expected:``, ``actual:`` and ``hint:`` line each and return False (``exercises/feedback.py``).
"""

from __future__ import annotations

SECTIONS = ("expected:", "actual:", "hint:")


def assert_passes(checker, answer, capsys) -> str:
    """``checker`` accepts ``answer`` and says so; returns what it printed."""
    assert checker(answer) is True
    out = capsys.readouterr().out
    assert out.startswith("Correct:"), out
    return out


def assert_fails(checker, answer, capsys, *phrases: str, sections: tuple[str, ...] = SECTIONS) -> str:
    """``checker`` rejects ``answer`` with each of ``sections`` once and every one of ``phrases``."""
    assert checker(answer) is False
    out = capsys.readouterr().out
    assert out.startswith("Not yet."), out
    for part in sections:
        assert out.count(part) == 1, out
    for phrase in phrases:
        assert phrase in out, out
    return out


def assert_rejected(checker, answer, capsys, *phrases: str,
                    sections: tuple[str, ...] = SECTIONS) -> str:
    """Like :func:`assert_fails`, and the hidden tests of every check cell that calls
    ``checker`` fail ``answer`` too: a wrong answer scores 0 whether or not the checker runs."""
    from checker_agreement import cells_of
    from hidden_tests import hidden_test_failure

    out = assert_fails(checker, answer, capsys, *phrases, sections=sections)
    cells = cells_of(checker.__name__, checker.__module__)
    assert cells, f"no check cell calls {checker.__name__}"
    for cell in cells:
        assert hidden_test_failure(cell.notebook, cell.grade_id, **{cell.answer: answer}), (
            f"the hidden tests of {cell.grade_id} accept an answer {checker.__name__} rejects")
    return out


def unwritten(*args, **kwargs):
    """A blank answer cell: the student version's body."""
    raise NotImplementedError()
