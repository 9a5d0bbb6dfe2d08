"""Output paths: checked before any work starts, written whole or not at all.

Every command checks each path it will write (a dataset directory, a submission file, a report, a run
directory) right after reading its arguments, so a typo or a read-only location costs a second, not a
finished build or evaluation: :func:`check_writable_dir`, :func:`check_writable_file`. The check creates
and removes a uniquely named probe in the nearest existing directory; it never touches anything else.

The write itself goes through :func:`write_atomically`: a temporary file beside the target, then a
rename, so a full disk leaves the previous file (or none) and one line saying what it needed. Files that belong
together (a model and its card) are staged whole, then moved into place together (:func:`replace_together`).

Nothing a command did not write is overwritten, the same way in every command: a result whose file name is taken
in the output folder (the user's file, or an earlier run's) is written beside it under the next free numbered name,
and the command says so (:func:`unused_stem`; ``sudoku_1.png`` -> ``sudoku_1-2.png``). A file the user names
explicitly (``--submission x.json``) is theirs to replace, and the command says that it does
(:func:`announce_replacing`).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Sequence

from utils.errors import RunFailure, UserError, first_in_chain

log = logging.getLogger(__name__)


def _process_umask() -> int:
    """The process's umask (reading it means setting it: done once, at import, before any thread writes)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


# Failures that making room cures; any other failed write is about the place, and says so.
_NO_ROOM = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}
# A name longer than this (in bytes) is refused where the file system does not tell its own limit.
_NAME_MAX = 255
# mkstemp makes its file 0600; a finished output gets the mode open() would give it, as the user's umask asks.
FILE_MODE = 0o666 & ~_process_umask()


class OutputPathError(UserError):
    """An output path cannot be created or written (read-only, under a file, a directory where a file goes)."""


class OutputWriteError(RunFailure):
    """Writing an output failed part-way (full disk, quota, a vanished directory); nothing partial was left."""


def check_writable_dir(path: str | os.PathLike, what: str) -> None:
    """Refuse a directory that cannot be created or written into, before any work.

    ``path`` may not exist yet: then its nearest existing ancestor must be a directory that takes a new
    directory (probed by creating and removing one).

    Args:
        path: the output directory.
        what: how the user named it, for the message (e.g. ``"--output-dir"``).
    Raises:
        OutputPathError: naming ``what``, ``path``, the ancestor at fault and the reason, or a folder name longer than
            the file system takes.
    """
    path = Path(path)
    for part in (path, *path.parents):  # every folder on the way: a name past the limit fails only when it is made
        if part.name:
            _check_name_length(part, what)
    _check_can_create(path, path, what)


def check_writable_file(path: str | os.PathLike, what: str) -> None:
    """Refuse a file path that cannot be written, before any work: an existing directory, a name longer than the
    file system takes, or a parent directory that cannot be created or written into (see :func:`check_writable_dir`).

    Raises:
        OutputPathError: naming ``what``, ``path`` and the reason.
    """
    path = Path(path)
    _check_name_length(path, what)  # first: stat() of a name past the limit raises ENAMETOOLONG
    if path.is_dir():
        raise OutputPathError(f"{what} {path} is a directory; give the path of a file to write")
    _check_can_create(path, path.parent, what)


def _nearest_existing(directory: Path) -> Path:
    """``directory`` (made absolute) or its nearest ancestor that exists."""
    directory = directory.absolute()
    return next(p for p in (directory, *directory.parents) if os.path.lexists(p))


def _check_can_create(target: Path, directory: Path, what: str) -> None:
    """Raise unless ``directory`` (where ``target`` goes), or its nearest existing ancestor, takes a new directory."""
    existing = _nearest_existing(directory)
    verb = "cannot be written" if os.path.lexists(target) else "cannot be created"
    if not existing.is_dir():
        raise OutputPathError(f"{what} {target} {verb}: {existing} is not a directory; choose another location")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-probe-", dir=existing))
    except OSError as e:
        raise OutputPathError(f"{what} {target} {verb}: {existing} is not writable ({e.strerror or e}); "
                              "choose a writable location") from None


def _check_name_length(path: Path, what: str) -> None:
    """Raise unless ``path``'s file name fits the file system it goes to (its own limit, else 255 bytes)."""
    existing = _nearest_existing(path.parent)
    try:
        limit = os.pathconf(existing, "PC_NAME_MAX")
    except (AttributeError, ValueError, OSError):  # no pathconf (Windows), or a file system that does not say
        limit = _NAME_MAX
    size = len(os.fsencode(path.name))
    if 0 < limit < size:  # -1: the file system sets no limit
        shown = path.name if len(path.name) <= 40 else f"{path.name[:40]}..."
        raise OutputPathError(f"{what} {path.parent / shown}: the file name is {size:,} bytes, more than the {limit} "
                              f"a file name may have in {existing}; choose a shorter name")


def unused_stem(folder: str | os.PathLike, stem: str, endings: Sequence[str]) -> str:
    """``stem``, or else ``stem-2``, ``stem-3``, ...: the first for which no ``folder/<stem><ending>`` exists, so the
    files of one result (a picture, its GIF and strip) keep one name and overwrite nothing.

    Args:
        folder: where the files go.
        stem: the wanted name without its ending (``sudoku_1``).
        endings: what each file adds to the stem (``.png``, ``.gif``, ``_strip.png``).
    """
    folder, n, name = Path(folder), 1, stem
    while any(os.path.lexists(folder / f"{name}{ending}") for ending in endings):
        n += 1
        name = f"{stem}-{n}"
    if name != stem:
        log.info("%s exists and is kept: this result is %s", folder / f"{stem}{endings[0]}", folder / f"{name}{endings[0]}")
    return name


def unused_name(folder: str | os.PathLike, name: str) -> str:
    """``name`` (one file, ``predictions.json``), or the first free ``<stem>-N.<ending>`` (:func:`unused_stem`)."""
    stem, dot, ending = name.rpartition(".")
    return f"{unused_stem(folder, stem, (dot + ending,))}{dot}{ending}" if dot else unused_stem(folder, name, ("",))


def announce_replacing(path: str | os.PathLike, flag: str) -> None:
    """Say that ``path``, which the user named with ``flag``, exists and will be replaced (their choice)."""
    if os.path.lexists(path):
        log.warning("%s %s exists: replacing it, as named", flag, path)


def write_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], None], what: str) -> Path:
    """Write ``path`` whole or not at all: ``write(f)`` fills a temporary file beside it (created with the
    parent directories), which is synced and renamed over ``path``.

    Args:
        path: the file to write; a previous file there is replaced only once the new one is complete.
        write: fills the open binary file it is given (and does not close it), e.g.
            ``lambda f: torch.save(obj, f)``.
        what: what the file is, for the message (e.g. ``"ARC submission"``).
    Returns:
        ``path`` as a Path.
    Raises:
        OutputWriteError: the write failed with an OSError (also one a library re-raised as another type,
            as ``torch.save`` does); the message names the path, the reason, the bytes written so far and
            the free space. The temporary file is removed; a previous file at ``path`` is intact.
    """
    path = Path(path)
    written, tmp = 0, None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A short prefix: a name that fits the file system keeps fitting with the temporary file's additions.
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:32]}.", suffix=".tmp", dir=path.parent)
        os.chmod(tmp, FILE_MODE)  # by path: os.fchmod is missing on Windows before Python 3.13
        with os.fdopen(fd, "wb") as f:
            try:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            finally:
                written = f.tell()
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        cause = _os_error(e) if isinstance(e, Exception) else None  # Ctrl-C stays Ctrl-C
        if cause is None:
            raise
        if cause.errno == errno.ENAMETOOLONG:  # the name is at fault, not the room: no advice to free space
            raise OutputPathError(f"could not write {what} {path}: a name in that path is longer than the file "
                                  "system takes; choose a shorter name") from None
        cure = "free some space or choose another location" if cause.errno in _NO_ROOM else "choose another location"
        raise OutputWriteError(f"could not write {what} {path} ({cause.strerror or cause}) after {written:,} bytes, "
                               f"{_free_space(path.parent)}; {path} was not changed: {cure}, then run again") from None
    return path


def write_failure(path: Path, error: OSError, what: str) -> OutputWriteError:
    """The one-line error of an append to ``path`` (a file written as it goes, such as ``answers.csv``) that failed
    with ``error``: the path, the reason, the bytes it holds, the free space and the cure; what was written before the
    failure is kept, so the same command continues it."""
    try:
        size = f"{os.path.getsize(path):,} bytes"
    except OSError:
        size = "an unknown size"
    cure = ("free some space or raise the file-size limit (ulimit -f)" if error.errno in _NO_ROOM else
            "choose another location")
    return OutputWriteError(f"could not write {what} to {path} ({error.strerror or error}) at {size}, "
                            f"{_free_space(path.parent)}: {cure}, then run the same command again to continue; "
                            "everything written before is kept")


def replace_together(moves: dict[Path, Path], what: str) -> None:
    """Move each complete staged file over its target, all or none, so files that describe each other (a model and
    its card) are never left half old, half new by a failure.

    Args:
        moves: ``{target: staged}``; each staged file lies in a folder of its own on the targets' file system (it
            is renamed, not copied), and that folder also takes the previous targets' backups.
        what: what the files are, for the message (e.g. ``"bundled model and card"``).
    Raises:
        OutputWriteError: a move failed with an OSError; every target is back as it was.
    """
    backups, moved = {}, []
    try:
        for target, staged in moves.items():
            if os.path.lexists(target):
                backups[target] = staged.with_name(f"{staged.name}.previous")
                _keep_copy(target, backups[target])
        for target, staged in moves.items():
            os.replace(staged, target)
            moved.append(target)
    except BaseException as e:
        for target in reversed(moved):
            if target in backups:
                os.replace(backups[target], target)
            else:
                target.unlink(missing_ok=True)
        cause = _os_error(e) if isinstance(e, Exception) else None
        if cause is None:
            raise
        raise OutputWriteError(f"could not move the {what} into place ({cause.strerror or cause}); "
                               f"{', '.join(map(str, moves))} were not changed: choose another location") from None


def _keep_copy(path: Path, backup: Path) -> None:
    """``backup`` holds what ``path`` holds: a hard link where the file system has them, else a copy."""
    try:
        os.link(path, backup, follow_symlinks=False)
    except OSError:
        shutil.copy2(path, backup, follow_symlinks=False)


def _os_error(error: BaseException | None) -> OSError | None:
    """The OSError behind ``error``: itself, or one it was raised while handling (``torch.save`` turns a failed
    write into a RuntimeError); None when there is none."""
    return first_in_chain(error, lambda e: isinstance(e, OSError))


def _free_space(directory: Path) -> str:
    try:
        return f"{shutil.disk_usage(directory).free / 2**20:,.1f} MiB free in {directory}"
    except OSError:
        return f"the free space in {directory} unknown"
