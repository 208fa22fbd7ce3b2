"""The one atomic-write helper: all or nothing, unique temporary names, readers never see a torn
file; masks written through it never touch another photo's mask."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from PIL import Image

from annotations.infra.fileio import atomic_write, read_json, staged_folder, write_bytes, write_json, write_text
from annotations.infra.workspace import Workspace


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path) -> None:
    target = tmp_path / "report.json"
    write_json(target, {"v": 1})
    with pytest.raises(RuntimeError), atomic_write(target, "w") as fh:
        fh.write('{"v": 2, "half')
        raise RuntimeError("killed mid-write")
    assert read_json(target) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
    write_text(tmp_path / "a.csv", "x\n")
    write_bytes(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "a.csv").read_text() == "x\n" and (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    with pytest.raises(ValueError, match="mode"):
        atomic_write(target, "a").__enter__()


def test_a_staged_folder_is_renamed_in_whole_or_not_at_all(tmp_path) -> None:
    out = tmp_path / "deep" / "model"
    with pytest.raises(RuntimeError), staged_folder(out) as stage:
        (stage / "half.bin").write_bytes(b"x")
        raise RuntimeError("killed mid-write")
    assert not out.exists() and list((tmp_path / "deep").iterdir()) == []
    out.mkdir()  # an empty folder is filled
    with staged_folder(out) as stage:
        assert stage.parent == out.parent and stage != out
        (stage / "weights.bin").write_bytes(b"w")
    assert [p.name for p in out.iterdir()] == ["weights.bin"] and list((tmp_path / "deep").iterdir()) == [out]
    with pytest.raises(KeyError, match="not an empty folder"), staged_folder(out, KeyError):
        pass
    assert [p.name for p in out.iterdir()] == ["weights.bin"]


def test_readers_never_see_a_torn_file_while_writers_replace_it(tmp_path) -> None:
    target = tmp_path / "results.json"
    rows = [{"row": i, "text": "x" * 200} for i in range(2000)]  # ~0.5 MB: many write() calls each
    write_json(target, {"n": 0, "rows": rows})
    stop = threading.Event()

    def writer(k: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            write_json(target, {"n": n, "writer": k, "rows": rows})

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(200):
            assert read_json(target, retries=1)["rows"] == rows  # retries=1: no second chance
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_save_mask_never_touches_another_photos_mask(tmp_path) -> None:
    ws = Workspace(tmp_path / "ws")
    other = np.zeros((4, 5), dtype=np.int32)
    other[1:3, 1:3] = 2
    ws.save_mask("a.tmp", other)  # masks/a.tmp.png: the old fixed temporary name of photo "a"
    mine = np.zeros((4, 5), dtype=np.int32)
    mine[0, :] = 300  # > 255 wounds: a 16-bit PNG
    ws.save_mask("a", mine)
    assert np.array_equal(np.asarray(Image.open(ws.mask_path("a.tmp"))), other)
    assert np.array_equal(np.asarray(Image.open(ws.mask_path("a"))), mine)
    assert sorted(p.name for p in ws.masks_dir.iterdir()) == ["a.png", "a.tmp.png"]
