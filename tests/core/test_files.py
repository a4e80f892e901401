"""atomic_folder: a folder is replaced whole or not at all."""

from __future__ import annotations

import pytest

from assay.core.files import atomic_folder


def test_a_folder_written_through_atomic_folder_replaces_the_old_one_whole(tmp_path):
    target = tmp_path / "out"
    with atomic_folder(target) as staging:
        (staging / "a.txt").write_text("first")
    with atomic_folder(target) as staging:
        assert (target / "a.txt").read_text() == "first"  # readers still see the old folder while the new one is built
        (staging / "b.txt").write_text("second")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging or retired folder left


def test_an_error_while_writing_leaves_the_old_folder_and_no_staging(tmp_path):
    target = tmp_path / "out"
    with atomic_folder(target) as staging:
        (staging / "a.txt").write_text("kept")
    with pytest.raises(RuntimeError), atomic_folder(target) as staging:
        (staging / "half.txt").write_text("half")
        raise RuntimeError("killed mid-write")
    assert [p.name for p in target.iterdir()] == ["a.txt"] and (target / "a.txt").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
