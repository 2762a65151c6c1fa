"""The tf.data service's command: `python -m tfdata_readers.data_service_server --role dispatcher|worker ...`.

The code is in `tfdata_readers/service/server.py`. This module stays because its path is the
documented command (docs/data-service.md, launch/data_service.sh) and the string that
`launch/data_service.sh` and the benchmarks look for in process command lines to find the
servers they started, so it is the one entry point. It imports no TensorFlow: `--help` and a bad
flag answer at once.
"""

from __future__ import annotations

from tfdata_readers.service.server import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
