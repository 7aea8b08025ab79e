"""``python -m components.storage upload|download URI FOLDER`` (components/storage/cli.py)."""

from components.storage.cli import main

raise SystemExit(main())
