"""The bad-input suite: every kind of bad dataset gives ONE clear DatasetError naming the file, row or
field — no other exception — and leaves the workspace exactly as it was (files and database dump).

Table-driven and meant to grow: add a spoiler (a function that damages a valid dataset folder) and
the words its error must contain to ``CASES``."""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sqlite3
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from annotations.infra.workspace import Workspace
from annotations.io.dataset import import_dataset
from annotations.io.readers import DatasetError

Spoiler = Callable[[Path, Path], "Path | None"]  # (dataset folder, a folder outside it) → other root


def small_dataset(root: Path) -> Path:
    """Three 30×20 photos with two wounds each, wounds/images/patients/triplets CSVs, dataset.json."""
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    (root / "truth").mkdir()
    for i, name in enumerate(("a", "b", "c")):
        Image.fromarray(np.full((20, 30, 3), 40 * i, np.uint8)).save(root / "images" / f"{name}.png")
        mask = np.zeros((20, 30), np.uint8)
        mask[2:7, 2:7] = 1
        mask[10:15, 10:20] = 2
        Image.fromarray(mask).save(root / "masks" / f"{name}.png")
    (root / "wounds.csv").write_text("image_id,wound_index,description,site\n"
                                     "a,1,red granulation,shin\na,2,fibrin,\nb,1,crust,back\n")
    (root / "images.csv").write_text("image_id,patient_id,camera\na,p1,phone\nb,p1,\nc,p2,dslr\n")
    (root / "patients.csv").write_text("patient_id,age,sex\np1,12,f\np2,30,m\n")
    (root / "triplets.csv").write_text("anchor,ref_j,ref_k,choice,annotator\na,b,c,j,ann\nb,a,c,skip,ann\n")
    (root / "dataset.json").write_text(json.dumps({"name": "small", "synthetic": False}))
    (root / "truth" / "notes.txt").write_text("planted truth")
    return root


def workspace_state(root: Path) -> tuple[dict[str, str], str]:
    """Every file's hash under the workspace (the database as a SQL dump)."""
    files = {}
    for path in sorted(root.rglob("*")):
        if not path.name.startswith("triderm.sqlite"):
            files[path.relative_to(root).as_posix()] = (
                hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "folder")
    con = sqlite3.connect(f"file:{root / 'triderm.sqlite'}?mode=ro", uri=True)
    try:
        dump = "\n".join(con.iterdump())
    finally:
        con.close()
    return files, dump


# ---- spoilers -------------------------------------------------------------------------------

def write(name: str, content: str | bytes) -> Spoiler:
    def spoil(d: Path, _out: Path) -> None:
        (d / name).unlink(missing_ok=True)
        (d / name).write_bytes(content.encode() if isinstance(content, str) else content)
    return spoil


def append(name: str, row: str) -> Spoiler:
    def spoil(d: Path, _out: Path) -> None:
        with (d / name).open("a") as fh:
            fh.write(row + "\n")
    return spoil


def remove(name: str) -> Spoiler:
    def spoil(d: Path, _out: Path) -> None:
        path = d / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return spoil


def symlink(name: str, target: Callable[[Path, Path], Path]) -> Spoiler:
    """Replace ``name`` by a symbolic link to ``target(dataset, outside)``."""
    def spoil(d: Path, out: Path) -> None:
        path, to = d / name, target(d, out)
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        path.symlink_to(to)
    return spoil


def secret(_d: Path, out: Path) -> Path:
    """A readable file outside the dataset that must never be copied into a workspace."""
    path = out / "secret.png"
    path.write_bytes(png_bytes(np.full((20, 30), 7, np.uint8)))
    return path


def outside_images(d: Path, out: Path) -> Path:
    shutil.copytree(d / "images", out / "elsewhere")
    return out / "elsewhere"


def outside_csv(_d: Path, out: Path) -> Path:
    path = out / "other.csv"
    path.write_text("image_id,wound_index,description\na,1,x\n")
    return path


def hard_link_outside(name: str) -> Spoiler:
    def spoil(d: Path, out: Path) -> None:
        outside = out / f"outside-{Path(name).name}"
        shutil.copyfile(d / name, outside)
        (d / name).unlink()
        os.link(outside, d / name)
    return spoil


def fifo(name: str) -> Spoiler:
    def spoil(d: Path, _out: Path) -> None:
        (d / name).unlink(missing_ok=True)
        os.mkfifo(d / name)
    return spoil


def png_bytes(array: np.ndarray, **save) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG", **save)
    return buf.getvalue()


def png_header_bomb(side: int = 20000) -> bytes:
    """A tiny PNG whose header claims side×side pixels."""
    data = bytearray(png_bytes(np.zeros((1, 1), np.uint8)))
    ihdr = bytes(data[12:16]) + struct.pack(">II", side, side) + bytes(data[24:29])
    data[16:24] = ihdr[4:12]
    data[29:33] = struct.pack(">I", zlib.crc32(ihdr) & 0xFFFFFFFF)
    return bytes(data)


def jpeg_header_bomb() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(buf, format="JPEG")
    data = bytearray(buf.getvalue())
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", 20000, 20000)
    return bytes(data)


def replace_image(name: str, content: Callable[[], bytes], drop: str | None = None) -> Spoiler:
    def spoil(d: Path, _out: Path) -> None:
        if drop:
            (d / "images" / drop).unlink()
        (d / "images" / name).write_bytes(content())
    return spoil


def float_tiff() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.zeros((20, 30), np.float32)).save(buf, format="TIFF")
    return buf.getvalue()


def sideways_jpeg() -> bytes:
    """A 30×20 photo that EXIF orientation 6 shows as 20×30 (the masks are 30×20)."""
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    Image.fromarray(np.zeros((20, 30, 3), np.uint8)).save(buf, format="JPEG", exif=exif)
    return buf.getvalue()


def folder(name: str) -> Spoiler:
    """A folder ``name`` holding a valid photo (its contents must not be skipped unseen)."""
    def spoil(d: Path, _out: Path) -> None:
        (d / name).mkdir()
        shutil.copyfile(d / "images" / "a.png", d / name / "a.png")
    return spoil


def triplet(**cells: str) -> Spoiler:
    """triplets.csv with one judgment whose extra columns are ``cells``."""
    return write("triplets.csv", "anchor,ref_j,ref_k,choice,annotator," + ",".join(cells) + "\n"
                 "a,b,c,j,ann," + ",".join(cells.values()) + "\n")


def truncated(name: str) -> Spoiler:
    def spoil(d: Path, _out: Path) -> None:
        data = (d / name).read_bytes()
        (d / name).write_bytes(data[: len(data) // 2])
    return spoil


def mask(name: str, array: np.ndarray) -> Spoiler:
    def spoil(d: Path, _out: Path) -> None:
        Image.fromarray(array).save(d / "masks" / name)
    return spoil


def two_labels(fill: int, band: tuple[slice, slice], dtype=np.uint8) -> np.ndarray:
    """Labels 1 and 2 (the valid masks' wounds) plus a region of ``fill`` (an "ignore" band or a big label)."""
    labels = np.zeros((20, 30), dtype)
    labels[2:7, 2:7] = 1
    labels[10:15, 10:20] = 2
    labels[band] = fill
    return labels


def alpha_only(d: Path, _out: Path) -> None:
    rgba = np.zeros((20, 30, 4), np.uint8)  # black everywhere; the wounds are opaque, the skin transparent
    rgba[..., 3] = np.where(two_labels(0, np.s_[0:0, 0:0]) > 0, 255, 0)
    Image.fromarray(rgba).save(d / "masks" / "a.png")


def declared_binary_with_labels(d: Path, _out: Path) -> None:
    (d / "dataset.json").write_text(json.dumps({"name": "small", "mask_format": "binary"}))
    Image.fromarray(two_labels(255, np.s_[0:2, :])).save(d / "masks" / "a.png")


def tiny_wound(d: Path, _out: Path) -> None:
    labels = np.zeros((20, 30), np.uint8)
    labels[2:5, 2:5] = 1  # 9 px, under the default minimum of 25
    labels[10:15, 10:20] = 2
    Image.fromarray(labels).save(d / "masks" / "a.png")


def too_many_components(d: Path, _out: Path) -> None:
    Image.fromarray(np.zeros((512, 512, 3), np.uint8)).save(d / "images" / "a.png")
    checker = ((np.indices((512, 512)).sum(axis=0) % 2) * 255).astype(np.uint8)  # 131,072 single pixels
    Image.fromarray(checker).save(d / "masks" / "a.png")
    (d / "wounds.csv").write_text("image_id,wound_index,description\n")


def min_area_one(ws: Workspace) -> None:
    ws.store.set_meta("min_wound_area", 1)


def not_a_folder(d: Path, out: Path) -> Path:
    (out / "file.txt").write_text("not a folder")
    return out / "file.txt"


def images_only_hidden(d: Path, _out: Path) -> None:
    for p in (d / "images").iterdir():
        p.unlink()
    (d / "images" / ".DS_Store").write_bytes(b"x")


def deep_json(d: Path, _out: Path) -> None:
    (d / "dataset.json").write_text("[" * 100_000 + "]" * 100_000)


def dup_image_id(d: Path, _out: Path) -> None:
    Image.fromarray(np.zeros((20, 30, 3), np.uint8)).save(d / "images" / "a.jpg")


def odd_name(name: str, folder: str = "images") -> Spoiler:
    def spoil(d: Path, _out: Path) -> None:
        Image.fromarray(np.zeros((20, 30, 3), np.uint8)).save(d / folder / name, format="PNG")
    return spoil


def columns(schema: object, name: str = "patients.csv", content: str | None = None) -> Spoiler:
    def spoil(d: Path, _out: Path) -> None:
        (d / "dataset.json").write_text(json.dumps({"columns": schema}))
        if content is not None:
            (d / name).write_text(content)
    return spoil


def both(*spoilers: Spoiler) -> Spoiler:
    def spoil(d: Path, out: Path) -> None:
        for s in spoilers:
            s(d, out)
    return spoil


W = "image_id,wound_index,description,site\n"
LONG = "x" * 200_000

# name → (spoiler, words the error must contain[, workspace setup])
CASES: dict[str, tuple] = {
    # -- the folder: links, special files, outside paths (checked before anything is opened) --
    "dataset path is a file": (not_a_folder, ("file.txt", "not a folder")),
    "no images folder": (remove("images"), ("no images/ folder",)),
    "images folder empty": (images_only_hidden, ("no images",)),
    "symlinked photo to an outside file": (symlink("images/b.png", secret), ("images/b.png", "symbolic link")),
    "symlinked photo to /etc/passwd": (symlink("images/b.png", lambda d, o: Path("/etc/passwd")),
                                       ("images/b.png", "symbolic link")),
    "symlinked photo to a photo inside": (symlink("images/b.png", lambda d, o: d / "images" / "a.png"),
                                          ("images/b.png", "symbolic link")),
    "dangling symlink": (symlink("images/zz.png", lambda d, o: o / "missing.png"), ("images/zz.png", "symbolic")),
    "hidden symlink": (symlink("images/.hidden", secret), ("images/.hidden", "symbolic link")),
    "symlinked images folder": (symlink("images", outside_images), ("images", "symbolic link")),
    "symlinked masks folder": (symlink("masks", lambda d, o: o), ("masks", "symbolic link")),
    "symlinked mask": (symlink("masks/a.png", secret), ("masks/a.png", "symbolic link")),
    "symlinked wounds.csv": (symlink("wounds.csv", outside_csv), ("wounds.csv", "symbolic link")),
    "symlinked dataset.json": (symlink("dataset.json", lambda d, o: Path("/etc/hostname")),
                               ("dataset.json", "symbolic link")),
    "symlink in truth/": (symlink("truth/notes.txt", lambda d, o: Path("/etc/passwd")),
                          ("truth/notes.txt", "symbolic link")),
    "symlinked folder in truth/": (symlink("truth/sub", lambda d, o: Path("/etc")), ("truth/sub", "symbolic")),
    "hard link to an outside photo": (hard_link_outside("images/b.png"), ("images/b.png", "hard link", "outside")),
    "hard link to an outside CSV": (hard_link_outside("wounds.csv"), ("wounds.csv", "hard link")),
    "hard link to an outside mask": (hard_link_outside("masks/a.png"), ("masks/a.png", "hard link")),
    "FIFO as a photo": (fifo("images/f.png"), ("images/f.png", "not a regular file")),
    "FIFO as wounds.csv": (fifo("wounds.csv"), ("wounds.csv", "not a regular file")),
    "FIFO in truth/": (fifo("truth/pipe"), ("truth/pipe", "not a regular file")),
    # -- photos --
    "corrupt photo": (write("images/b.png", b"\x89PNG not really"), ("images/b.png", "cannot be read")),
    "empty photo": (write("images/b.png", b""), ("images/b.png", "cannot be read")),
    "truncated photo": (truncated("images/b.png"), ("images/b.png", "cannot be read")),
    "PNG named .jpg": (replace_image("b.jpg", lambda: png_bytes(np.zeros((20, 30), np.uint8)), drop="b.png"),
                       ("images/b.jpg", "JPEG")),
    "unsupported photo type": (write("images/d.gif", b"GIF89a"), ("images/d.gif", "unsupported file type")),
    "two photos with one id": (dup_image_id, ("images/a.png", "a second image with id 'a'")),
    "odd characters in a photo id": (odd_name("bad id!.png"), ("images/bad id!.png", "not a valid id")),
    "photo id starting with a dash": (odd_name("-a.png"), ("images/-a.png", "not a valid id")),
    "photo id of 129 characters": (odd_name("x" * 129 + ".png"), ("not a valid id",)),
    "PNG header of 20000x20000": (replace_image("b.png", png_header_bomb), ("images/b.png", "400,000,000 pixels")),
    "PNG header of 10000x10000": (replace_image("b.png", lambda: png_header_bomb(10000)),
                                  ("images/b.png", "100,000,000 pixels", "89,478,485")),
    "JPEG header of 20000x20000": (replace_image("b.jpg", jpeg_header_bomb, drop="b.png"), ("images/b.jpg", "pixels")),
    "floating-point photo": (replace_image("b.tif", float_tiff, drop="b.png"), ("images/b.tif", "floating-point")),
    # -- masks --
    "mask size": (mask("b.png", np.zeros((21, 30), np.uint8)), ("masks/b.png", "mask size 30×21")),
    "mask for unknown image": (mask("zz.png", np.zeros((20, 30), np.uint8)), ("masks/zz.png", "unknown image")),
    "mask not a PNG": (write("masks/a.jpg", b"\xff\xd8\xff"), ("masks/a.jpg", "PNG")),
    "corrupt mask": (write("masks/a.png", b"\x89PNG\r\n\x1a\n garbage"), ("masks/a.png", "cannot be read")),
    "truncated mask": (truncated("masks/a.png"), ("masks/a.png", "cannot be read")),
    "mask header of 20000x20000": (write("masks/a.png", png_header_bomb()), ("masks/a.png", "pixels")),
    "odd characters in a mask id": (odd_name("bad id!.png", "masks"), ("masks/bad id!.png", "not a valid id")),
    "mask of the unrotated photo": (replace_image("a.jpg", sideways_jpeg, drop="a.png"),
                                    ("masks/a.png", "upright", "EXIF orientation 6")),
    "described wound under the minimum area": (tiny_wound, ("wounds.csv: line 2", "minimum wound area")),
    "more than 65,535 wounds in one mask": (too_many_components, ("masks/a.png", "131,072", "65,535"), min_area_one),
    # -- dataset.json --
    "dataset.json not JSON": (write("dataset.json", "{name: small"), ("dataset.json", "not valid JSON")),
    "dataset.json a list": (write("dataset.json", "[1, 2]"), ("dataset.json", "JSON object")),
    "dataset.json not UTF-8": (write("dataset.json", '{"name": "\xe9"}'.encode("latin-1")), ("dataset.json",)),
    "dataset.json nested 100,000 deep": (deep_json, ("dataset.json", "not valid JSON")),
    "mask_format unknown": (write("dataset.json", '{"mask_format": "rgb"}'), ("dataset.json", "mask_format")),
    "synthetic not a boolean": (write("dataset.json", '{"synthetic": "maybe"}'), ("dataset.json: synthetic",)),
    "name not text": (write("dataset.json", '{"name": 12}'), ("dataset.json", "name")),
    "column type unknown": (columns({"age": "integer"}), ("dataset.json", "columns")),
    "columns not an object": (columns(["age"]), ("dataset.json", "columns")),
    # -- CSV, any file --
    "missing column": (write("wounds.csv", "image_id,description\na,x\n"), ("wounds.csv", "wound_index")),
    "not UTF-8": (write("wounds.csv", "image_id,wound_index,description\na,1,\xe9rosion\n".encode("latin-1")),
                  ("wounds.csv: line 2", "UTF-8")),
    "not UTF-8, CR-only newlines": (write("wounds.csv", "image_id,wound_index,description\ra,1,ok\rb,1,\xe9\r"
                                          .encode("latin-1")), ("wounds.csv: line 3", "UTF-8")),
    "ragged row in wounds.csv": (append("wounds.csv", "b,2"), ("wounds.csv: line 5", "2 cell(s) for 4 columns")),
    "ragged row in images.csv": (append("images.csv", "c"), ("images.csv: line 5", "missing patient_id")),
    "ragged row in patients.csv": (append("patients.csv", "p3,40"), ("patients.csv: line 4", "missing sex")),
    "ragged row in triplets.csv": (append("triplets.csv", "a,b,c,j"), ("triplets.csv: line 4", "annotator")),
    "ragged row with CR-only newlines": (write("wounds.csv", W.replace("\n", "\r") + "a,1,x,shin\ra,2\r"),
                                         ("wounds.csv: line 3",)),
    "more cells than columns": (append("wounds.csv", "b,2,crust,back,extra"), ("wounds.csv: line 5", "more cells")),
    "a 200,000-character cell": (append("wounds.csv", f"b,2,{LONG},"), ("wounds.csv: line 5", "longer than")),
    "a 20,001-character cell": (append("wounds.csv", f"b,2,{'y' * 20_001},"),
                                ("wounds.csv: line 5", "description", "20,001")),
    "a 20,001-character column name": (write("patients.csv", f"patient_id,{'z' * 20_001}\np1,1\n"),
                                       ("patients.csv: line 1", "column 2")),
    "unterminated quote": (append("wounds.csv", 'b,2,"never closed'), ("wounds.csv: line 5",)),
    "duplicate column": (write("patients.csv", "patient_id,age,age\np1,1,2\n"), ("patients.csv", "duplicate", "age")),
    "column without a name": (write("patients.csv", "patient_id,,sex\np1,1,f\n"), ("patients.csv", "column 2")),
    "semicolon-separated CSV": (write("wounds.csv", "image_id;wound_index;description\na;1;x\n"),
                                ("wounds.csv", "missing required column", "';'")),
    "empty CSV file": (write("wounds.csv", b""), ("wounds.csv", "missing required column")),
    "declared int column with text": (columns({"age": "int"}, content="patient_id,age\np1,12\np2,twelve\n"),
                                      ("patients.csv: line 3: age", "'twelve'")),
    "declared bool column with text": (columns({"smoker": "bool"}, content="patient_id,smoker\np1,maybe\n"),
                                       ("patients.csv: line 2: smoker", "'maybe'")),
    "declared float column with text": (columns({"age": "float"}, content="patient_id,age\np1,abc\n"),
                                        ("patients.csv: line 2: age", "'abc'", "number")),
    "declared float column with inf": (columns({"age": "float"}, content="patient_id,age\np1,inf\n"),
                                       ("patients.csv: line 2: age", "finite")),
    # -- wounds.csv --
    "missing wound index": (append("wounds.csv", "c,7,does not exist,"), ("wounds.csv: line 5", "wound_index 7")),
    "wound of an unknown image": (append("wounds.csv", "zz,1,x,"), ("wounds.csv: line 5", "'zz'")),
    "wound_index not a number": (append("wounds.csv", "b,one,x,"), ("wounds.csv: line 5", "'one'")),
    "wound listed twice": (append("wounds.csv", "a,1,again,"), ("wounds.csv: line 5", "listed twice")),
    "wound of a photo without mask": (both(remove("masks/c.png"), append("wounds.csv", "c,1,x,")),
                                      ("wounds.csv: line 5", "not in the mask of 'c'")),
    # -- patients.csv --
    "invalid patient id": (append("patients.csv", "p 3,40,m"), ("patients.csv: line 4", "patient_id")),
    "patient listed twice": (append("patients.csv", "p1,13,f"), ("patients.csv: line 4", "listed twice")),
    "patients.csv without patient_id": (write("patients.csv", "id,age\np1,1\n"), ("patients.csv", "patient_id")),
    # -- images.csv --
    "path traversal id": (write("images.csv", "image_id,patient_id\n../../etc/passwd,p1\n"),
                          ("images.csv: line 2", "'../../etc/passwd'")),
    "image listed twice": (append("images.csv", "a,p1,phone"), ("images.csv: line 5", "listed twice")),
    "image row of an unknown photo": (append("images.csv", "zz,p9,x"), ("images.csv: line 5", "'zz' is not in images/")),
    "unknown patient of a known image": (write("images.csv", "image_id,patient_id\na,p9\n"),
                                         ("images.csv: line 2", "'p9' is not in patients.csv")),
    "invalid patient id in images.csv": (write("images.csv", "image_id,patient_id\na,p/1\n"),
                                         ("images.csv: line 2", "patient_id")),
    # -- triplets.csv --
    "triplet unknown image": (append("triplets.csv", "a,b,nope,j,ann"), ("triplets.csv: line 4", "'nope'")),
    "triplet repeated image": (append("triplets.csv", "a,a,c,j,ann"), ("triplets.csv: line 4", "three different")),
    "bad choice": (append("triplets.csv", "a,b,c,left,ann"), ("triplets.csv: line 4", "choice")),
    "triplet without annotator": (append("triplets.csv", "a,b,c,j,"), ("triplets.csv: line 4", "annotator")),
    "triplet rep not a number": (write("triplets.csv", "anchor,ref_j,ref_k,choice,annotator,rep\na,b,c,j,x,two\n"),
                                 ("triplets.csv: line 2", "rep")),
    "triplet latency not a number": (write("triplets.csv", "anchor,ref_j,ref_k,choice,annotator,latency_ms\n"
                                           "a,b,c,j,x,fast\n"), ("triplets.csv: line 2", "latency_ms")),
    "judgment listed twice": (write("triplets.csv", "anchor,ref_j,ref_k,choice,annotator,rep\n"
                                    "a,b,c,j,x,0\na,b,c,k,x,0\n"), ("triplets.csv", "listed twice")),
    "triplets.csv without choice": (write("triplets.csv", "anchor,ref_j,ref_k\na,b,c\n"), ("triplets.csv", "choice")),
    # -- ids and fields read exactly (issue 29) --
    "photo id ending in a newline": (replace_image("ph7\n.png", lambda: png_bytes(np.zeros((20, 30, 3), np.uint8))),
                                     ("images/'ph7\\n.png'", "control character U+000A")),
    "NUL in a description": (append("wounds.csv", "b,2,cru\x00st,back"),
                             ("wounds.csv: line 5: description", "U+0000")),
    "NUL in dataset.json's name": (write("dataset.json", json.dumps({"name": "sm\x00all"})),
                                   ("dataset.json: name", "U+0000")),
    "non-ASCII digit as wound index": (append("wounds.csv", "b,\u0662,crust,back"),
                                       ("wounds.csv: line 5: wound_index", "'\u0662' is not a whole number")),
    "wound index 0": (append("wounds.csv", "b,0,crust,back"), ("wounds.csv: line 5: wound_index", "less than 1")),
    "created that is not a date": (triplet(created="yesterday"), ("triplets.csv: line 2: created", "ISO 8601")),
    "negative rep": (triplet(rep="-1"), ("triplets.csv: line 2: rep", "less than 0")),
    "NaN latency": (triplet(latency_ms="nan"), ("triplets.csv: line 2: latency_ms", "not a finite number")),
    "negative latency": (triplet(latency_ms="-5"), ("triplets.csv: line 2: latency_ms", "less than 0")),
    "folder named like a photo": (folder("images/d.png"), ("images/d.png: is a folder", "images/ may hold only files")),
    "folder among the masks": (folder("masks/old"), ("masks/old: is a folder",)),
    # -- masks that a binary reading would erase or merge (issue 29) --
    "label map with 255 = ignore": (mask("a.png", two_labels(255, np.s_[0:2, :])),
                                    ("masks/a.png: ambiguous mask: values found 0, 1, 2, 255", "mask_format")),
    "16-bit label map whose largest label dominates": (mask("a.png", two_labels(300, np.s_[15:20, :], np.uint16)),
                                                       ("masks/a.png", "values found 0, 1, 2, 300", "\"label\"")),
    "wounds drawn only in alpha": (alpha_only, ("masks/a.png", "only in the alpha", "values 0, 255")),
    "binary-declared mask with painted labels": (declared_binary_with_labels,
                                                 ("masks/a.png", "mask_format \"binary\"", "value(s) 1, 2")),
}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> tuple[Path, Path]:
    """A valid dataset and a workspace that already holds it (rejections must leave it as it is)."""
    root = tmp_path_factory.mktemp("baseline")
    dataset = small_dataset(root / "dataset")
    ws = Workspace(root / "ws")
    import_dataset(ws, dataset)
    ws.store.close()
    return dataset, root / "ws"


def test_the_suite_is_large_enough():
    assert len(CASES) >= 70


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gives_one_clear_error_and_changes_nothing(case, baseline, tmp_path):
    spoil, words, *setup = CASES[case]
    dataset = tmp_path / "dataset"
    shutil.copytree(baseline[0], dataset)
    shutil.copytree(baseline[1], tmp_path / "ws")
    outside = tmp_path / "outside"
    outside.mkdir()
    root = spoil(dataset, outside) or dataset
    ws = Workspace(tmp_path / "ws")
    for step in setup:
        step(ws)
    before = workspace_state(ws.root)
    with pytest.raises(DatasetError) as err:
        import_dataset(ws, root)
    message = str(err.value)
    assert type(err.value) is DatasetError and err.value.__cause__ is None
    assert "\n" not in message and len(message) < 1000, message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    assert workspace_state(ws.root) == before
