"""``python -m journal``: the ``journal`` command line."""

from .cli import main

main()
