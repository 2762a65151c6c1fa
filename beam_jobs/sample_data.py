"""Builds a sample class-per-folder tree of real photographs, offline, for demos, tests and benchmarks.

scikit-image and scikit-learn ship a handful of real photographs inside their wheels. Each becomes
one class, and each sample image is a random crop of it (random scale, position and mirror),
resized to the requested size and saved as a JPEG, so the tree looks like a small photo
collection: varied content, real textures, real JPEG statistics.

Run ``python -m beam_jobs.sample_data OUT_DIR --num_images 200`` to make one. With ``--coco FILE``
each photo also gets objects: crops of the other source photographs pasted onto it, whose boxes
(and masks) are written as a COCO annotation file, so that detection examples are known exactly.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import random
from collections.abc import Sequence

from PIL import Image, ImageOps

__all__ = ["SOURCE_PHOTOS", "source_photo_paths", "make_photo_tree", "paste_objects", "main"]

# (package, file inside the package's data folder) for each colour photograph used as a class.
SOURCE_PHOTOS: tuple[tuple[str, str], ...] = (
    ("skimage", "data/astronaut.png"),
    ("skimage", "data/chelsea.png"),
    ("skimage", "data/coffee.png"),
    ("skimage", "data/hubble_deep_field.jpg"),
    ("skimage", "data/motorcycle_left.png"),
    ("skimage", "data/retina.jpg"),
    ("skimage", "data/rocket.jpg"),
    ("sklearn", "datasets/images/china.jpg"),
    ("sklearn", "datasets/images/flower.jpg"),
)


def _package_dir(package: str) -> pathlib.Path:
    # find_spec locates the package without importing it (importing skimage or sklearn is slow).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the sample photos come from the {package!r} package, which is not installed; "
            "install it with: pip install scikit-image scikit-learn"
        )
    return pathlib.Path(list(spec.submodule_search_locations)[0])


def source_photo_paths() -> dict[str, pathlib.Path]:
    """Returns {class name: path of the real photo} for every source photograph."""
    return {pathlib.Path(rel).stem: _package_dir(package) / rel for package, rel in SOURCE_PHOTOS}


def _random_crop(photo: Image.Image, size: tuple[int, int], rng: random.Random) -> Image.Image:
    width, height = size
    aspect = width / height
    scale = rng.uniform(0.45, 1.0)
    crop_w = min(photo.width, round(min(photo.width, photo.height * aspect) * scale))
    crop_h = min(photo.height, round(crop_w / aspect))
    left = rng.randint(0, photo.width - crop_w)
    top = rng.randint(0, photo.height - crop_h)
    crop = photo.resize(size, Image.Resampling.BICUBIC, box=(left, top, left + crop_w, top + crop_h))
    return ImageOps.mirror(crop) if rng.random() < 0.5 else crop


def make_photo_tree(
    root: str | pathlib.Path,
    *,
    num_images: int,
    size: tuple[int, int] = (500, 375),
    seed: int = 0,
    quality: int = 90,
    classes: Sequence[str] | None = None,
) -> list[pathlib.Path]:
    """Writes ``num_images`` JPEGs under ``root/<class>/<class>_NNNNN.jpg`` and returns their paths.

    The same arguments always give the same files, so tests and benchmarks can rebuild the tree.
    Images are spread round-robin over the classes.
    """
    if num_images < 1:
        raise ValueError(f"num_images must be at least 1 (got {num_images!r})")
    root = pathlib.Path(root)
    photos_by_class = source_photo_paths()
    names = list(classes) if classes is not None else sorted(photos_by_class)
    unknown = sorted(set(names) - set(photos_by_class))
    if unknown:
        raise ValueError(f"unknown sample classes {unknown!r}; expected some of {sorted(photos_by_class)!r}")
    photos = {name: Image.open(photos_by_class[name]).convert("RGB") for name in names}
    rng = random.Random(seed)
    paths = []
    for index in range(num_images):
        name = names[index % len(names)]
        path = root / name / f"{name}_{index:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        _random_crop(photos[name], size, rng).save(path, "JPEG", quality=quality)
        paths.append(path)
    return paths


def paste_objects(
    root: str | pathlib.Path,
    paths: Sequence[pathlib.Path],
    coco_file: str | pathlib.Path,
    *,
    per_image: int = 2,
    seed: int = 0,
) -> dict:
    """Pastes ``per_image`` crops of the other source photographs onto each photo of ``paths`` (in
    place) and writes their boxes and masks (each crop's rectangle, as a polygon) to ``coco_file``,
    a COCO annotation file whose ``file_name``s are relative to ``root``. Returns the COCO dict.

    The categories are the source photographs' names: a crop of chelsea's photo is a "chelsea".
    """
    root = pathlib.Path(root)
    rng = random.Random(seed)
    photos = {name: Image.open(path).convert("RGB") for name, path in source_photo_paths().items()}
    names = sorted(photos)
    categories = {name: index + 1 for index, name in enumerate(names)}
    coco: dict = {
        "images": [],
        "annotations": [],
        "categories": [{"id": i, "name": n, "supercategory": "photo"} for n, i in categories.items()],
    }
    for image_id, path in enumerate(paths, start=1):
        image = Image.open(path).convert("RGB")
        width, height = image.size
        for _ in range(per_image):
            name = names[rng.randrange(len(names))]
            w = rng.randint(max(8, width // 8), max(9, width // 3))
            h = rng.randint(max(8, height // 8), max(9, height // 3))
            x, y = rng.randint(0, width - w), rng.randint(0, height - h)
            image.paste(_random_crop(photos[name], (w, h), rng), (x, y))
            coco["annotations"].append(
                {
                    "id": len(coco["annotations"]) + 1,
                    "image_id": image_id,
                    "category_id": categories[name],
                    "bbox": [x, y, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                    "segmentation": [[x, y, x + w, y, x + w, y + h, x, y + h]],
                }
            )
        image.save(path, "JPEG", quality=90)
        coco["images"].append(
            {"id": image_id, "file_name": path.relative_to(root).as_posix(), "width": width, "height": height}
        )
    pathlib.Path(coco_file).write_text(json.dumps(coco))
    return coco


def _parse_size(text: str) -> tuple[int, int]:
    width, _, height = text.lower().partition("x")
    return int(width), int(height or width)


def main(argv: Sequence[str] | None = None) -> None:
    """The ``python -m beam_jobs.sample_data`` command: writes a sample tree and says how many photos it holds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", help="folder to create the <class>/<image>.jpg tree in")
    parser.add_argument("--num_images", type=int, default=200)
    parser.add_argument("--size", type=_parse_size, default=(500, 375), help="WIDTHxHEIGHT, e.g. 500x375")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--coco", default=None, help="also paste objects onto each photo and write their COCO annotation file here"
    )
    args = parser.parse_args(argv)
    paths = make_photo_tree(args.output_dir, num_images=args.num_images, size=args.size, seed=args.seed)
    print(f"wrote {len(paths)} photos to {args.output_dir}")
    if args.coco:
        coco = paste_objects(args.output_dir, paths, args.coco, seed=args.seed)
        print(f"wrote {len(coco['annotations'])} objects of {len(coco['categories'])} categories to {args.coco}")


if __name__ == "__main__":
    main()
