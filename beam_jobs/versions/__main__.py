"""``python -m beam_jobs.versions``: see ``beam_jobs.versions.cli``."""

import sys

from beam_jobs.versions.cli import main

sys.exit(main())
