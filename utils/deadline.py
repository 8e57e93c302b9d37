"""Work under a deadline that holds, whatever the work waits on: the time a message promises is the time kept
(research.studies.storage's check of a --storage: pyarrow retries a storage that never answers for minutes)."""
from __future__ import annotations

import multiprocessing
import threading

from utils.errors import UserError, cut


def first_line(e: BaseException) -> str:
    """An exception's first line (its type where it says nothing), at most 200 characters."""
    text = str(e).strip()
    return cut(text.splitlines()[0] if text else type(e).__name__, 200)


def within(seconds: float, work) -> None:
    """work() under a deadline that holds: a UserError as work raised it, an OSError's first line as an OSError, or
    TimeoutError after `seconds`. It runs in a forked process, killed at the deadline: pyarrow retries a storage that
    never answers for minutes and waits for those requests when the process exits, so a thread left behind would
    hold the command past its message (203 s after "no answer within 60 s"). Without fork (Windows), a daemon
    thread."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return _within_thread(seconds, work)
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def child() -> None:
        try:
            work()
            send.send(None)
        except UserError as e:  # pickles whole (utils.errors.PicklesWhole)
            send.send(("user", e))
        except OSError as e:
            send.send(("os", first_line(e)))
    process = ctx.Process(target=child, name="deadline", daemon=True)
    process.start()
    process.join(seconds)
    if process.is_alive():
        process.kill()
        process.join()
        raise TimeoutError
    outcome = receive.recv() if receive.poll() else ("os", f"the check ended with exit code {process.exitcode}")
    if outcome is not None:
        kind, error = outcome
        raise error if kind == "user" else OSError(error)


def _within_thread(seconds: float, work) -> None:
    failed: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as e:  # handed to the caller's thread
            failed.append(e)
    thread = threading.Thread(target=run, name="deadline", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError
    if failed:
        raise failed[0]
