"""Which code produced a result: the git commit where git can tell, and a digest of the source itself.

A results file made on a copied checkout (the GPU machine's) may carry a stale .git, so its commit
can be wrong; the digest is computed from the files that ran. `python -m jaxrose.provenance [REV]`
prints the digest of the working tree, or of a commit's tree (from git, nothing checked out), to
check which commit a recorded digest belongs to."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from typing import Iterable, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_DIRS = ("jaxrose", "envs")  # what a training or bench run executes (scripts/ and tests/ do not count)


def digest_files(files: Iterable[tuple[str, bytes]]) -> str:
    """sha256 over (relative path, contents) pairs in path order, short: the same files give the
    same digest wherever they lie."""
    h = hashlib.sha256()
    for path, data in sorted(files):
        h.update(path.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:16]


def _is_source(path: str) -> bool:
    return path.endswith(".py") and path.split("/", 1)[0] in SOURCE_DIRS


def source_digest(root: str = REPO) -> str:
    """The digest of the Python sources under `root`'s SOURCE_DIRS as they are on disk."""
    files = []
    for top in SOURCE_DIRS:
        for folder, dirs, names in os.walk(os.path.join(root, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in names:
                path = os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")
                if _is_source(path):
                    with open(os.path.join(folder, name), "rb") as f:
                        files.append((path, f.read()))
    return digest_files(files)


def commit_source_digest(rev: str, repo: str = REPO) -> str:
    """The digest of the Python sources of commit `rev`, read from git."""
    def git(*args) -> bytes:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, check=True).stdout

    paths = [p for p in git("ls-tree", "-r", "--name-only", rev, "--", *SOURCE_DIRS).decode().splitlines()
             if _is_source(p)]
    return digest_files((p, git("show", f"{rev}:{p}")) for p in paths)


def git_state(repo: str = REPO) -> dict:
    """git_commit and git_dirty (tracked files changed), JAXROSE_GIT_COMMIT where set (a copy whose
    .git is stale or missing), and source_digest, which does not depend on git."""
    state = {"source_digest": source_digest(repo)}
    if os.environ.get("JAXROSE_GIT_COMMIT"):
        return {"git_commit": os.environ["JAXROSE_GIT_COMMIT"], "git_dirty": None, **state}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                                    capture_output=True, text=True, check=True).stdout.strip())
        return {"git_commit": commit, "git_dirty": dirty, **state}
    except (OSError, subprocess.CalledProcessError):  # a copy without .git
        return {"git_commit": None, "git_dirty": None, **state}


def main(args: Optional[list[str]] = None, repo: str = REPO) -> None:
    args = sys.argv[1:] if args is None else args
    if not args:
        print(source_digest(repo))
        return
    try:
        print(commit_source_digest(args[0], repo))
    except (OSError, subprocess.CalledProcessError):
        raise SystemExit(f"{args[0]!r} is not a revision of the git repository at {repo}: give a commit git knows "
                         f"there (`git log --oneline`), or no argument for the working tree's digest.") from None


if __name__ == "__main__":
    main()
