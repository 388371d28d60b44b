"""What the commands that produce a results JSON share."""

from __future__ import annotations

import json
from pathlib import Path


def unwritable(dest: str | None) -> str | None:
    """Why the file `dest` cannot be written (None: it can, or none is asked for). Checked
    before a run, so that its results are not lost to a path that was mistyped."""
    if not dest or dest == "-":
        return None
    path = Path(dest)
    if path.is_dir():
        return f"{dest} is a directory"
    if not path.resolve().parent.is_dir():
        return f"{dest}: no such directory"
    return None


def not_png(dest: str | None) -> str | None:
    """Why `--plot DEST` names no PNG file (None: it does, or none is asked for): the plots
    are PNG, and their siblings are named from the stem (-sweep.png, -ttft.png)."""
    if dest and not dest.lower().endswith(".png"):
        return f"{dest}: the plots are PNG files; give a name ending in .png"
    return None


def write_json(res: dict, dest: str) -> bool:
    """`--json DEST`: the results to the file DEST, or to stdout for "-" (then True: the
    command prints nothing else)."""
    text = json.dumps(res, indent=1)
    if dest == "-":
        print(text)
        return True
    Path(dest).write_text(text)
    return False
