"""tests/conftest.py's release of tqdm's write lock when a stop abandoned it (device: none, CPU only).

A bar whose draw is cut short by an exception, as a signal handler's stop raises it, keeps tqdm's lock; the thread
that drew goes on, and any other thread's next bar waits for ever. The page's ARC adaptation (a server thread) hung
at its first bar in one CI run, most likely this way."""

import io
import threading

import pytest
from tqdm import tqdm

from tests.conftest import release_abandoned_progress_locks


def another_thread_can_draw() -> bool:
    """Whether a thread other than this one could take tqdm's write lock now (without waiting)."""
    taken = []

    def attempt():
        for lock in tqdm.get_lock().locks:
            if not lock.acquire(False):
                break
            taken.append(lock)
        for lock in reversed(taken):
            lock.release()

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join()
    return len(taken) == len(tqdm.get_lock().locks)


def test_a_draw_cut_short_by_a_stop_keeps_the_lock_until_it_is_given_back(monkeypatch):
    bar = tqdm(total=4, mininterval=0, miniters=1, file=io.StringIO())

    def stopped_while_drawing(*args, **kwargs):
        raise KeyboardInterrupt  # what a signal handler's stop raises, here in the middle of a draw

    monkeypatch.setattr(bar, "display", stopped_while_drawing)
    with pytest.raises(KeyboardInterrupt):
        bar.update(1)
    assert not another_thread_can_draw()  # tqdm's refresh gives the lock back only when the draw returns
    assert release_abandoned_progress_locks() == len(tqdm.get_lock().locks)
    assert another_thread_can_draw()
    monkeypatch.undo()
    bar.close()


def test_nothing_is_released_where_nothing_was_abandoned():
    with tqdm(total=1, file=io.StringIO()) as bar:
        bar.update(1)
    assert release_abandoned_progress_locks() == 0 and another_thread_can_draw()
