"""The command line and the console: flags and --help without Beam's import (flags.py, cli.py),
the full parse (arguments.py), and what a terminal shows while a run goes on (progress, the
worker-log filter, the summary, and how Ctrl-C and SIGTERM end a run)."""
