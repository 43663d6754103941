"""``python -m replay.cli ...``: the ``replay`` command."""

from replay.cli import main

main()
