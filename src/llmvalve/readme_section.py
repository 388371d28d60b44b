"""Replace one generated section of the README (between its begin and end markers), or insert
it before an anchor heading the first time: the docs generators (`python -m llmvalve.sim.docs`,
`python -m llmvalve.bench.docs`) own their sections, and the prose around them is left alone."""

from __future__ import annotations

from pathlib import Path


def update_readme(readme: Path, begin: str, end: str, section: str, anchor: str) -> None:
    """`section` includes its own `begin` and `end` lines."""
    text = readme.read_text()
    if begin in text and end in text:
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        text = head + section + tail
    else:
        if anchor not in text:
            raise SystemExit(f"{readme}: no {anchor.strip()!r} section to insert before")
        text = text.replace(anchor, "\n" + section + "\n" + anchor, 1)
    readme.write_text(text)
