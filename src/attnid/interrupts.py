"""SIGTERM read as Ctrl-C, so that one handler stops a command (or a suite's jobs) either way. Standard library only:
the ``attnid`` command enters it before it knows which modules its subcommand loads."""

from __future__ import annotations

import contextlib
import signal
import threading


@contextlib.contextmanager
def sigterm_as_interrupt():
    """In the main thread: SIGTERM raises ``KeyboardInterrupt`` (with ``.signame``) like Ctrl-C, so that one handler
    stops the jobs either way; the previous handler is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        e = KeyboardInterrupt()
        e.signame = "SIGTERM"
        raise e

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
