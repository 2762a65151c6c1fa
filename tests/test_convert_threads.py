"""A worker converts several images at once on threads: the results must not depend on it.

Pillow's pixel limit and Python's warnings filters are process-wide, so concurrent decodes could
see each other's limit or record each other's EXIF warnings; and the shard must hold the same
bytes, in plan order, whatever the number of threads.
"""

from __future__ import annotations

import concurrent.futures
import pathlib

import pytest

from beam_jobs.config import ImageConfig
from beam_jobs.errors import BadInputError
from beam_jobs.imaging.decode import decode_image, decode_rgb_pixels
from beam_jobs.imaging.preprocess import normalize_mode
from beam_jobs.planning.rules import plan_dataset
from beam_jobs.records import DeadLetter, InputFile, ShardResult
from beam_jobs.writing.convert_shards import ConvertShardFn
from tests.photos import ODD_VALID_FILES, encode, make_test_tree, real_photo, write_broken_files


def _verdict(decode, data: bytes, max_pixels: int):
    try:
        decoded = decode(data, max_pixels)
    except BadInputError as error:
        return "refused", error.reason, error.detail
    return "accepted", tuple(decoded.events)


_DECODERS = {
    "pillow": lambda data, max_pixels: decode_image(data, max_pixels=max_pixels),
    "pixels": lambda data, max_pixels: decode_rgb_pixels(
        data, max_pixels=max_pixels, normalize=lambda image: normalize_mode(image, channels=3)
    ),
}


@pytest.mark.parametrize("decoder", sorted(_DECODERS))
def test_concurrent_decodes_each_see_their_own_pixel_limit_and_exif_warnings(tmp_path, decoder):
    decode = _DECODERS[decoder]
    broken = write_broken_files(tmp_path)
    cases = [
        (encode(real_photo("chelsea", (64, 48)), fmt), limit)
        for fmt in ("JPEG", "PNG", "GIF")
        for limit in (64 * 48, 1000, 400)
    ]  # accepted, then refused by one check or the other
    cases += [(pathlib.Path(path).read_bytes(), limit) for path in sorted(broken) for limit in (1000, 10**8)]
    cases += [(make(), limit) for _, make in sorted(ODD_VALID_FILES.items()) for limit in (1000, 10**8)]
    cases *= 12
    expected = [_verdict(decode, data, limit) for data, limit in cases]
    assert {verdict[0] for verdict in expected} == {"accepted", "refused"}
    assert any("exif_malformed" in verdict[1] for verdict in expected if verdict[0] == "accepted")
    with concurrent.futures.ThreadPoolExecutor(6) as threads:
        got = list(threads.map(lambda case: _verdict(decode, *case), cases))
    assert got == expected


def _convert_shard(inputs: list[InputFile], out: pathlib.Path, threads: int) -> tuple[bytes, list]:
    shard = plan_dataset(inputs, num_shards=1, example_bytes=1).shards[0]
    out.mkdir()
    fn = ConvertShardFn(ImageConfig(width=64, height=64), str(out), convert_threads=threads)
    fn.setup()
    try:
        outputs = list(fn.process(shard))
    finally:
        fn.teardown()
    (result,) = [o.file for o in outputs if isinstance(o, ShardResult)]
    others = [o.value if hasattr(o, "value") else o for o in outputs if not isinstance(o, ShardResult)]
    return (out / result).read_bytes(), others


def test_a_shard_holds_the_same_bytes_in_plan_order_whatever_the_number_of_threads(tmp_path):
    good, broken = make_test_tree(tmp_path / "photos", num_images=24)
    files = sorted([*good, *(pathlib.Path(p) for p in broken)])
    inputs = [InputFile(str(p.relative_to(tmp_path / "photos")), str(p), label=p.parent.name) for p in files]
    one, one_outputs = _convert_shard(inputs, tmp_path / "one", threads=1)
    many, many_outputs = _convert_shard(inputs, tmp_path / "many", threads=4)
    assert one == many
    assert one_outputs == many_outputs
    dead = [o for o in many_outputs if isinstance(o, DeadLetter)]
    assert len(dead) == len(broken)
    assert len(one) > 24 * 1000


def test_counters_counted_for_conversions_on_threads_reach_beams_metrics(tmp_path):
    """Beam's metrics belong to the bundle's thread: a counter incremented on a converter thread
    would be lost, so the converter counts on its own thread what its threads did."""
    import apache_beam as beam
    from apache_beam.metrics.metric import MetricsFilter
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    from beam_jobs.writing.convert_shards import METRICS_NAMESPACE

    folder = tmp_path / "cat"
    folder.mkdir()
    inputs = []
    for index, fmt in enumerate(["TIFF", "JPEG", "TIFF", "PNG", "TIFF"]):
        path = folder / f"{index}.{fmt.lower()}"
        path.write_bytes(encode(real_photo("chelsea", (64, 48)), fmt))
        inputs.append(InputFile(f"cat/{path.name}", str(path), label="cat"))
    shards = plan_dataset(inputs, num_shards=1, example_bytes=1).shards
    pipeline = beam.Pipeline(runner=FnApiRunner())
    _ = (
        pipeline
        | beam.Create(shards)
        | beam.ParDo(ConvertShardFn(ImageConfig(width=32, height=32), str(tmp_path / "out"), convert_threads=3))
    )
    result = pipeline.run()
    result.wait_until_finish()
    counters = {
        c.key.metric.name: c.committed
        for c in result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))["counters"]
    }
    assert counters["isolated_decodes"] == 3
    assert counters["images_written"] == 5


def test_a_neighbours_warning_during_a_decode_is_neither_this_images_event_nor_lost(tmp_path, recwarn):
    """Python's warnings machinery is process-wide: while one thread decodes, another thread's
    warning must not become the decoded image's exif_malformed event, and must still be shown."""
    import threading
    import warnings

    clean = encode(real_photo("chelsea", (1500, 1200)), "PNG")
    stop = threading.Event()

    def neighbour():
        while not stop.is_set():
            warnings.warn("Corrupt EXIF data in a neighbour", UserWarning, stacklevel=1)

    thread = threading.Thread(target=neighbour, daemon=True)
    thread.start()
    try:
        events = [decode_image(clean, max_pixels=10**8).events for _ in range(5)]
    finally:
        stop.set()
        thread.join()
    assert events == [[]] * 5
    assert any("neighbour" in str(w.message) for w in recwarn.list)
