"""One way to replace a file whole: a reader, or a process that died mid-write, sees the old file or the new one,
never a part of one. Site state, benchmark records and summaries, SOLO's report, the Tiny-ImageNet cache and the
allow-list are written through it (the decoded-image caches and resume points, several files each, rename a staging
folder instead)."""

import contextlib
import json
import os
import threading
from typing import IO, Any, Callable


def write_atomic(path: str, write: Callable[[IO], None], binary: bool = False) -> None:
    """Fill a temporary file beside ``path`` with ``write(f)``, flush it to disk, then rename it over ``path`` in one
    step. The temporary name is this process's and thread's own, so concurrent writers never share one. On any error
    the temporary file is removed and the error raised; ``path`` is then as it was.

    Args:
        path: the file to write; its folder is created if missing.
        write: writes the content into the open file object it is given.
        binary: open the temporary file in binary mode (``torch.save``) instead of text mode (``json.dump``).
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    try:
        with open(tmp, "wb") if binary else open(tmp, "w", encoding="utf-8") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # the write's own error is the one to report
            os.remove(tmp)
        raise


def write_json_atomic(path: str, data: Any, indent: int = 1) -> None:
    """``data`` as JSON in ``path``, through :func:`write_atomic`."""
    write_atomic(path, lambda f: json.dump(data, f, indent=indent))
