"""Cost of decoder isolation: the same conversions in-process and in the isolated child process.

    python benchmarks/isolation.py            # 300 real-photo JPEGs (500x375) to 224 px

Prints per-image medians and the ratio. Under the default --isolation=risky, JPEG and PNG stay
in-process, so this cost applies only to the rarer formats (or to every file with "all").
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from beam_jobs.config import ImageConfig  # noqa: E402
from beam_jobs.imaging.isolation import IsolatedRunner  # noqa: E402
from beam_jobs.records import InputFile  # noqa: E402
from beam_jobs.sample_data import make_photo_tree  # noqa: E402
from beam_jobs.writing.convert_shards import convert_image  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_images", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        paths = make_photo_tree(work, num_images=args.num_images, seed=3)
        items = [(p.read_bytes(), InputFile(p.name, str(p), label="x", label_id=0)) for p in paths]
    config = ImageConfig()
    runner = IsolatedRunner(timeout_s=60)
    start = time.perf_counter()
    runner(convert_image, *items[0], config)  # Start the child before timing the conversions.
    startup = time.perf_counter() - start
    timings: dict[str, list[float]] = {"in-process": [], "isolated child": []}
    for data, input_file in items:  # Interleaved, so load drift hits both alike.
        start = time.perf_counter()
        in_process = convert_image(data, input_file, config)
        timings["in-process"].append(time.perf_counter() - start)
        start = time.perf_counter()
        isolated = runner(convert_image, data, input_file, config)
        timings["isolated child"].append(time.perf_counter() - start)
        if isolated != in_process:
            raise AssertionError(f"isolated output differs for {input_file.filename}")
    runner.close()
    base = statistics.median(timings["in-process"])
    print(f"| conversion of one 500x375 JPEG to 224 px ({args.num_images} photos) | median ms | vs in-process |")
    print("|---|---:|---:|")
    for name, values in timings.items():
        median = statistics.median(values)
        print(f"| {name} | {median * 1000:.2f} | {median / base:.2f}x |")
    # Paid once per worker (and after each killed decoder), and never charged to --decode_timeout_s.
    print(f"\nchild start-up (Python, imports, first conversion): {startup * 1000:.0f} ms")


if __name__ == "__main__":
    main()
