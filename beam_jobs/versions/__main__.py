"""``python -m beam_jobs.versions``: see ``beam_jobs.versions.cli``."""

import sys

from beam_jobs.versions.cli import main

if __name__ == "__main__":  # importing the module (a tool that imports every module) runs nothing
    sys.exit(main())
