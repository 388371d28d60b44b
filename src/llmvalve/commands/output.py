"""What the commands that produce a results JSON share."""

from __future__ import annotations

import json
from pathlib import Path


def write_json(res: dict, dest: str) -> bool:
    """`--json DEST`: the results to the file DEST, or to stdout for "-" (then True: the
    command prints nothing else)."""
    text = json.dumps(res, indent=1)
    if dest == "-":
        print(text)
        return True
    Path(dest).write_text(text)
    return False
