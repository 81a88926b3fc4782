"""Ctrl-C aimed at the moment the main thread is inside a given ``CommandHandle`` method,
so a test's SIGINT never lands before the call it means to interrupt."""

from __future__ import annotations

import signal
import sys
import threading

__all__ = ["interrupt_main_inside"]


def interrupt_main_inside(method: str, within: float = 10.0) -> None:
    """SIGINT once the main thread runs ``CommandHandle.<method>`` (looked at every ms);
    nothing if it does not within ``within`` seconds."""
    main = threading.main_thread().ident
    looked = threading.Event()
    for _ in range(int(within * 1000)):
        frame = sys._current_frames().get(main or 0)
        while frame is not None:
            code = frame.f_code
            if code.co_name == method and code.co_filename.endswith("command_handle.py"):
                signal.raise_signal(signal.SIGINT)
                return
            frame = frame.f_back
        looked.wait(0.001)
