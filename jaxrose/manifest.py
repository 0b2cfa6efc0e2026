"""Checksums of a checkpoint step's files, written once the step is complete and checked before restoring.

orbax keeps no checksums: a bit flipped in a data file restores silently as a different number. The
manifest lists every file of the step with its size and SHA-256; a step without one (written by an
older jaxrose, or cut off between orbax's commit and the manifest) is restored unchecked.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Optional

NAME = "jaxrose_checksums.json"
VERSION = 1


def _files(folder: str) -> list[str]:
    paths = []
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.relpath(os.path.join(root, name), folder)
            if path != NAME and not path.startswith(NAME + "."):
                paths.append(path)
    return sorted(paths)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write(folder: str) -> None:
    """Writes the manifest of `folder` atomically (a temporary file renamed into place)."""
    files = {path: {"size": os.path.getsize(os.path.join(folder, path)), "sha256": _sha256(os.path.join(folder, path))}
             for path in _files(folder)}
    target = os.path.join(folder, NAME)
    with open(target + ".tmp", "w") as f:
        json.dump({"version": VERSION, "algorithm": "sha256", "files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(target + ".tmp", target)


def verify(folder: str) -> Optional[str]:
    """None when `folder` matches its manifest (or has none); else what differs, in a few words."""
    path = os.path.join(folder, NAME)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            files = json.load(f)["files"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"its checksum manifest {NAME} is unreadable: {error}"
    bad = []
    for name, expected in sorted(files.items()):
        full = os.path.join(folder, name)
        if not os.path.exists(full):
            bad.append(f"{name} is missing")
        elif os.path.getsize(full) != expected["size"]:
            bad.append(f"{name} has {os.path.getsize(full)} bytes, {expected['size']} were saved")
        elif _sha256(full) != expected["sha256"]:
            bad.append(f"{name} differs from its saved checksum")
    if not bad:
        return None
    more = f" (and {len(bad) - 1} more file(s))" if len(bad) > 1 else ""
    return f"{bad[0]}{more}"
