"""Detection inputs whose truth is known exactly: crops of real photos pasted onto real photos.

Each pasted crop's box is where it was pasted, in the stored pixels of the file; an EXIF
orientation tag then turns the image (and so the box) when it is shown. ``object_view`` gives what
a box of the converted image must show: the crop, turned the same way.
"""

from __future__ import annotations

import dataclasses
import io
import json
import pathlib

import numpy as np
from PIL import Image, ImageOps

from tests.photos import real_photo

__all__ = ["OBJECTS", "Pasted", "PastedImage", "make_pasted_images", "object_view", "write_coco", "write_jsonl"]

# class -> (photo, crop box of it): a cat's face, a cup of coffee, a rocket.
OBJECTS = {
    "cat": ("chelsea", (140, 20, 300, 180)),
    "cup": ("coffee", (190, 80, 430, 300)),
    "rocket": ("rocket", (230, 50, 330, 400)),
}
_BACKGROUNDS = (("astronaut", (400, 300)), ("rocket", (300, 420)), ("coffee", (480, 240)), ("chelsea", (320, 320)))


@dataclasses.dataclass(frozen=True)
class Pasted:
    label: str
    box: tuple[int, int, int, int]  # xmin, ymin, xmax, ymax in stored pixels


@dataclasses.dataclass(frozen=True)
class PastedImage:
    name: str  # relative path
    size: tuple[int, int]  # stored (width, height)
    orientation: int
    objects: tuple[Pasted, ...]

    @property
    def upright_size(self) -> tuple[int, int]:
        return (self.size[1], self.size[0]) if self.orientation in (5, 6, 7, 8) else self.size


def _crop(label: str, size: tuple[int, int]) -> Image.Image:
    photo, box = OBJECTS[label]
    return real_photo(photo).crop(box).resize(size, Image.Resampling.BICUBIC)


def make_pasted_images(folder: pathlib.Path, orientations=(1, 6, 3, 8), count: int = 8) -> list[PastedImage]:
    """``count`` JPEGs under folder/images, each a background photo with two objects pasted on it,
    one of them touching the image's edge; orientations cycle through ``orientations``."""
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    made = []
    labels = sorted(OBJECTS)
    for index in range(count):
        photo, size = _BACKGROUNDS[index % len(_BACKGROUNDS)]
        image = real_photo(photo, size)
        width, height = size
        objects = []
        for k, label in enumerate((labels[index % 3], labels[(index + 1) % 3])):
            w, h = int(rng.integers(60, 110)), int(rng.integers(50, 100))
            # The first on the left edge, the second in the right half: they never overlap.
            x = 0 if k == 0 else int(rng.integers(width // 2, width - w))
            y = int(rng.integers(0, height - h))
            image.paste(_crop(label, (w, h)), (x, y))
            objects.append(Pasted(label, (x, y, x + w, y + h)))
        orientation = orientations[index % len(orientations)]
        exif = Image.Exif()
        exif[0x0112] = orientation
        name = f"images/{index:03d}.jpg"
        image.save(folder / name, quality=95, exif=exif.tobytes())
        made.append(PastedImage(name, size, orientation, tuple(objects)))
    return made


def object_view(pasted: Pasted, orientation: int) -> Image.Image:
    """The pasted crop as the converted image shows it: turned by the image's orientation."""
    crop = _crop(pasted.label, (pasted.box[2] - pasted.box[0], pasted.box[3] - pasted.box[1]))
    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    crop.save(buffer, "PNG", exif=exif.tobytes())
    return ImageOps.exif_transpose(Image.open(buffer)).convert("RGB")


def write_jsonl(folder: pathlib.Path, images: list[PastedImage], *, labels: bool = False) -> pathlib.Path:
    """An input list with each image's objects (boxes in stored pixels) and, with ``labels``, its classes."""
    lines = []
    for image in images:
        row: dict = {
            "uri": image.name,
            "objects": [
                dict(zip(("xmin", "ymin", "xmax", "ymax"), o.box, strict=True), label=o.label) for o in image.objects
            ],
        }
        if labels:
            row["labels"] = sorted({o.label for o in image.objects})
        lines.append(json.dumps(row))
    path = folder / "list.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_coco(folder: pathlib.Path, images: list[PastedImage], *, extra: dict | None = None) -> pathlib.Path:
    """A COCO file of the images: width and height as stored, boxes [x, y, w, h] in stored pixels."""
    categories = {name: index + 1 for index, name in enumerate(sorted(OBJECTS))}
    coco: dict = {"images": [], "annotations": [], "categories": [{"id": i, "name": n} for n, i in categories.items()]}
    for image_id, image in enumerate(images, start=1):
        coco["images"].append(
            {"id": image_id, "file_name": image.name, "width": image.size[0], "height": image.size[1]}
        )
        for o in image.objects:
            x0, y0, x1, y1 = o.box
            coco["annotations"].append(
                {
                    "id": len(coco["annotations"]) + 1,
                    "image_id": image_id,
                    "category_id": categories[o.label],
                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                    "area": (x1 - x0) * (y1 - y0),
                    "iscrowd": 0,
                }
            )
    for key, values in (extra or {}).items():
        coco[key] = coco[key] + values
    path = folder / "coco.json"
    path.write_text(json.dumps(coco))
    return path


def write_masks(folder: pathlib.Path, images: list[PastedImage]) -> dict[str, str]:
    """A semantic mask per image (class id = 1 + the class's place in sorted OBJECTS, 0 elsewhere),
    in the stored frame as the boxes are; returns {image name: mask name}."""
    (folder / "masks").mkdir(exist_ok=True)
    ids = {name: index + 1 for index, name in enumerate(sorted(OBJECTS))}
    names = {}
    for image in images:
        mask = np.zeros((image.size[1], image.size[0]), np.uint8)
        for o in image.objects:
            x0, y0, x1, y1 = o.box
            mask[y0:y1, x0:x1] = ids[o.label]
        name = image.name.replace("images/", "masks/").replace(".jpg", ".png")
        Image.fromarray(mask).save(folder / name)
        names[image.name] = name
    return names


def polygon_of(box: tuple[int, int, int, int]) -> list[list[int]]:
    """A box as a COCO polygon (its four corners)."""
    x0, y0, x1, y1 = box
    return [[x0, y0, x1, y0, x1, y1, x0, y1]]
