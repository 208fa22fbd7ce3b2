"""The shared data sets (../shared/data: real patient photos, masks, labels) are never copied into
the repository, under any name: every shared file's sha256 against every file of the repository."""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def repository_files(root: Path) -> list[Path]:
    """Every file git would see in ``root``: tracked, plus untracked ones that are not ignored
    (local workspaces and the virtual environment are ignored)."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    return [root / n for n in names if n and (root / n).is_file()]


def copies(shared: Path, repo: list[Path]) -> list[str]:
    """``repo file == shared file`` for every repository file with the content of a non-empty shared file."""
    by_size: dict[int, dict[str, Path]] = {}
    for path in (p for p in shared.rglob("*") if p.is_file() and p.stat().st_size > 0):
        by_size.setdefault(path.stat().st_size, {})[sha256(path)] = path
    return [f"{p} == {by_size[p.stat().st_size][digest]}" for p in repo
            if p.stat().st_size in by_size and (digest := sha256(p)) in by_size[p.stat().st_size]]


def test_no_shared_data_file_in_the_repository() -> None:
    if not SHARED.is_dir():
        pytest.skip(f"no shared data at {SHARED}")
    if not (ROOT / ".git").exists():
        pytest.skip(f"{ROOT} is not a git checkout")
    assert not copies(SHARED, repository_files(ROOT)), "shared data copied into the repository"


def test_a_renamed_copy_is_found(tmp_path) -> None:
    """The check compares contents: a shared photo saved under another name is caught."""
    shared, repo = tmp_path / "shared", tmp_path / "repo"
    (shared / "medetec" / "images").mkdir(parents=True)
    (repo / "docs").mkdir(parents=True)
    (shared / "medetec" / "images" / "foot-ulcer-0001.png").write_bytes(b"\x89PNG photo")
    (shared / "empty.txt").write_bytes(b"")
    (repo / "docs" / "figure.png").write_bytes(b"\x89PNG photo")
    (repo / "other.png").write_bytes(b"\x89PNG other")
    (repo / "__init__.py").write_bytes(b"")
    found = copies(shared, [p for p in repo.rglob("*") if p.is_file()])
    assert found == [f"{repo / 'docs' / 'figure.png'} == {shared / 'medetec' / 'images' / 'foot-ulcer-0001.png'}"]
