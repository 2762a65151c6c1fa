"""A decoder whose module, imported in a child process, waits at the test's start-up gate: what a
decoder with heavy imports (Beam, Pillow's plugins, numpy) looks like on a cold machine."""

from __future__ import annotations

from tests.reliability.startup_gate import wait_at_gate

wait_at_gate()


def square(x: int) -> int:
    return x * x
