"""``python -m attention_book.classroom``: see :mod:`attention_book.classroom.cli`."""

from .cli import main

raise SystemExit(main())
