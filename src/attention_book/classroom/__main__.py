"""``python -m attention_book.classroom``: see :mod:`attention_book.classroom.course`."""

from .course import main

raise SystemExit(main())
