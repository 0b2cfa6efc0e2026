"""Provenance of a result: the source digest identifies the code that ran, with or without git."""

import hashlib
import subprocess

import pytest

from jaxrose.provenance import commit_source_digest, digest_files, git_state, source_digest


def _write(root, files: dict) -> None:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


SOURCES = {"jaxrose/a.py": "A = 1\n", "envs/b.py": "B = 2\n"}
OTHERS = {"scripts/c.py": "C = 3\n", "jaxrose/notes.txt": "not code\n", "tests/test_x.py": "def test(): pass\n"}


def test_the_digest_is_sha256_over_sorted_paths_and_content_hashes():
    files = [("jaxrose/a.py", b"A = 1\n"), ("envs/b.py", b"B = 2\n")]
    by_hand = hashlib.sha256()
    for path, data in sorted(files):  # envs/b.py before jaxrose/a.py
        by_hand.update(path.encode() + b"\0" + hashlib.sha256(data).digest())
    assert digest_files(files) == digest_files(reversed(files)) == by_hand.hexdigest()[:16]
    assert digest_files([("jaxrose/a.py", b"A = 2\n"), files[1]]) != digest_files(files)  # content counts
    assert digest_files([("jaxrose/z.py", b"A = 1\n"), files[1]]) != digest_files(files)  # and the path


def test_only_the_python_sources_of_jaxrose_and_envs_count(tmp_path):
    _write(tmp_path, {**SOURCES, **OTHERS})
    (tmp_path / "jaxrose/__pycache__").mkdir()
    (tmp_path / "jaxrose/__pycache__/a.cpython-311.pyc").write_bytes(b"\x00compiled")
    before = source_digest(str(tmp_path))
    assert before == digest_files([(p, t.encode()) for p, t in SOURCES.items()])
    _write(tmp_path, {"scripts/c.py": "C = 4\n", "jaxrose/notes.txt": "changed\n", "tests/test_x.py": "# changed\n"})
    assert source_digest(str(tmp_path)) == before
    _write(tmp_path, {"envs/b.py": "B = 3\n"})
    assert source_digest(str(tmp_path)) != before


def _git(root, *args) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_a_commits_digest_is_its_checkouts_and_git_state_records_both(tmp_path, monkeypatch):
    monkeypatch.delenv("JAXROSE_GIT_COMMIT", raising=False)
    _write(tmp_path, {**SOURCES, **OTHERS})
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "one")
    first = _git(tmp_path, "rev-parse", "HEAD")
    clean = source_digest(str(tmp_path))
    assert commit_source_digest(first, str(tmp_path)) == clean
    assert git_state(str(tmp_path)) == {"git_commit": first, "git_dirty": False, "source_digest": clean}

    _write(tmp_path, {"jaxrose/a.py": "A = 10\n"})  # an uncommitted change: dirty, and another digest
    state = git_state(str(tmp_path))
    assert state["git_dirty"] is True and state["source_digest"] != clean
    _git(tmp_path, "commit", "-qam", "two")
    assert commit_source_digest("HEAD", str(tmp_path)) == state["source_digest"]
    assert commit_source_digest(first, str(tmp_path)) == clean  # the older commit keeps its digest


def test_a_stated_commit_is_recorded_beside_the_digest_of_what_ran(tmp_path, monkeypatch):
    _write(tmp_path, SOURCES)  # no .git at all: a copied checkout
    monkeypatch.setenv("JAXROSE_GIT_COMMIT", "abc123")
    assert git_state(str(tmp_path)) == {"git_commit": "abc123", "git_dirty": None,
                                        "source_digest": source_digest(str(tmp_path))}
    monkeypatch.delenv("JAXROSE_GIT_COMMIT")
    assert git_state(str(tmp_path))["git_commit"] is None  # git cannot tell; the digest still can


def test_the_command_prints_a_digest_and_names_the_fix_for_an_unknown_revision(tmp_path, capsys):
    from jaxrose.provenance import main

    _write(tmp_path, SOURCES)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "one")
    main([], repo=str(tmp_path))
    main(["HEAD"], repo=str(tmp_path))
    working_tree, head = capsys.readouterr().out.split()
    assert working_tree == head == digest_files([(p, t.encode()) for p, t in SOURCES.items()])
    with pytest.raises(SystemExit, match="'no-such-revision' is not a revision.*git log --oneline"):
        main(["no-such-revision"], repo=str(tmp_path))
