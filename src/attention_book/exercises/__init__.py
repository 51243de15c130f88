"""Checkers for the exercises of every chapter.

Each checker takes a learner's answer, prints ``Correct: …`` when it is right
and otherwise prints which property failed (expected vs actual, with a hint)
and raises ``AssertionError`` so an autograder sees the failure.

Each chapter's checkers live in their own module (``ch00`` … ``ch16``) and are
re-exported here, so a notebook writes ``from attention_book.exercises import check_…``.
"""

from .ch00 import *  # noqa: F403
from .ch01 import *  # noqa: F403
from .ch02 import *  # noqa: F403
from .ch03 import *  # noqa: F403
from .ch04 import *  # noqa: F403
from .ch05 import *  # noqa: F403
from .ch06 import *  # noqa: F403
from .ch07 import *  # noqa: F403
from .ch08 import *  # noqa: F403
from .ch09 import *  # noqa: F403
from .ch10 import *  # noqa: F403
from .ch11 import *  # noqa: F403
from .ch12 import *  # noqa: F403
from .ch13 import *  # noqa: F403
from .ch14 import *  # noqa: F403
from .ch15 import *  # noqa: F403
from .ch16 import *  # noqa: F403
from .ch17 import *  # noqa: F403
from .ch18 import *  # noqa: F403
from .ch19 import *  # noqa: F403
from .ch20 import *  # noqa: F403
from .feedback import ExerciseFailure as ExerciseFailure
from .feedback import hand_over as hand_over
from .feedback import in_private_order as in_private_order
