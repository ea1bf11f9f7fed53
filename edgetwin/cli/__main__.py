"""``python -m edgetwin.cli``."""

from edgetwin.cli.entry import main

main()
