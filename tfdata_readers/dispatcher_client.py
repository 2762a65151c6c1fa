"""The documented path of the dispatcher client: `from tfdata_readers.dispatcher_client import DispatcherWatchdog`.

The code is in `tfdata_readers/service/dispatcher.py`. This module stays because
docs/data-service.md, and trainers written from it, import the watchdog from this path. Like the
module it names, it imports no TensorFlow.
"""

from __future__ import annotations

from tfdata_readers.service.dispatcher import DispatcherWatchdog, ask_dispatcher, parse_host_port

__all__ = ["DispatcherWatchdog", "ask_dispatcher", "parse_host_port"]
