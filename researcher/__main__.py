"""``python -m secure_release.researcher``: see :mod:`secure_release.researcher.cli`."""

from secure_release.researcher.cli import main

raise SystemExit(main())
