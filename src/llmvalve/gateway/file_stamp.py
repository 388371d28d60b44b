"""Whether a file changed since it was last read, without reading it: the watched files (the
policy and its secrets, the admin token, the admin TLS pair) are all mounted Secrets or
ConfigMaps, replaced by a symlink swap, or files an operator edits."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def file_stamp(path: Path) -> tuple[Any, ...] | None:
    """The file's fingerprint (None: it cannot be read): the path with every symlink resolved
    (a Kubernetes `..data` swap changes it), inode, size, mtime, and ctime (`cp -p` or
    `rsync -t --inplace` can restore size and mtime, never ctime)."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return None
    return (real, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
