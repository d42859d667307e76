"""A leaderboard YAML without the entries whose mask file does not exist yet.

The searches and the comparison of one ratio run side by side (commands.sh compare): the
static entries are scored while the searches run, and a later call, once a search has
written its mask.json, resumes the same output directory with that entry added. Every
dropped entry is named on stderr, so nothing is left out silently.

    python results/smollm2/available_entries.py results/smollm2/leaderboard_r0.75.yaml OUT.yaml
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml


def entry_mask_file(entry: str) -> Path | None:
    """The file an entry's ``mask=`` argument names (None when it names none, or ``full``)."""
    _, _, args = entry.partition("=")
    for pair in args.split(","):
        key, _, value = pair.partition("=")
        if key.strip() == "mask" and value.strip() not in ("", "full"):
            return Path(value.strip())
    return None


def main(config: str, out: str) -> None:
    spec = yaml.safe_load(Path(config).read_text())
    kept = []
    for entry in spec["entries"]:
        mask = entry_mask_file(entry) if isinstance(entry, str) else None
        if mask is not None and not mask.is_file():
            print(f"{config}: entry {entry.partition('=')[0]!r} left for a later call: {mask} does not exist yet", file=sys.stderr)
            continue
        kept.append(entry)
    Path(out).write_text(yaml.safe_dump({**spec, "entries": kept}, sort_keys=False))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
