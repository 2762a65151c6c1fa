"""Packaging for images-to-tfrecords; also the --setup_file that Beam ships to remote workers."""

import pathlib
import re

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).parent
VERSION = re.search(r'__version__ = "([^"]+)"', (HERE / "beam_jobs" / "__init__.py").read_text()).group(1)

# Ranges: the lower bounds are the versions this project is tested with; the upper bounds stop at
# the next major version, whose API changes we have not tested.
# The core install is what converting needs. TensorFlow, which only the reader (tfdata_readers)
# imports, is the [read] extra, as TFDS leaves it to its users: a trainer's own TensorFlow build
# (tensorflow[and-cuda], tf-nightly) is not replaced, and Dataflow's workers, which get this file's
# requirements through --setup_file, install no 1.9 GB of TensorFlow they never import.
INSTALL_REQUIRES = [
    "apache-beam>=2.77.0,<3",
    # The codecs are pinned exactly: a shard's bytes are a function of the pixels and of these
    # libraries' versions (libjpeg-turbo's inside Pillow and simplejpeg, OpenCV's resize), and the
    # same pins reach Dataflow's workers through this file, so every runner writes the same bytes.
    "pillow==12.3.0",
    "simplejpeg==1.9.0",  # libjpeg-turbo straight to numpy: the fast path's JPEG decode and encode
    "opencv-python-headless==5.0.0.93",  # the fast path's resampling (resample.py)
    "numpy>=2.0,<3",
    "google-crc32c>=1.7,<2",
    "tqdm>=4.66,<5",  # the job's progress bar
    "psutil>=6,<8",  # ending the local runner's workers after Ctrl-C or SIGTERM
    "ijson>=3.3,<4",  # streams COCO annotation files, which reach gigabytes (listing/coco.py)
    "pycocotools>=2.0.8,<3",  # rasterises COCO polygons and RLE into instance masks, as COCO's own tools do
]
READ_REQUIRE = ["tensorflow>=2.21.0,<3"]
SAMPLES_REQUIRE = ["scikit-image>=0.25", "scikit-learn>=1.6"]
GCP_REQUIRE = ["apache-beam[gcp]>=2.77.0,<3"]
AWS_REQUIRE = ["apache-beam[aws]>=2.77.0,<3"]
# The inspection report draws with Pillow (a core dependency): its extra is kept, empty, so that
# `pip install ".[inspect]"` from older instructions still works. The benchmarks' charts use matplotlib.
INSPECT_REQUIRE: list[str] = []
BENCH_REQUIRE = ["matplotlib>=3.8,<4"]
# The docs site (mkdocs.yml), built with --strict by the tests.
DOCS_REQUIRE = ["mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10"]
# The checkers the tests run (their settings are in pyproject.toml), pinned exactly: a new release
# adds rules and changes the formatter's output, which should be a commit of its own.
CHECK_REQUIRE = ["ruff==0.17.6", "mypy==2.4.1"]
# websocket-client drives a real headless Chromium over the DevTools protocol in the report's test;
# the object-store tests run the job against real gs:// and s3:// servers, so they need both clients.
# pytest-xdist runs the suite in 3 processes (pytest.ini), one test module (or the Flink group) per process at a
# time; its --dist loadgroup reads each test's group from a node id that pytest 9 no longer lets it
# change (the groups are silently ignored there, measured), hence pytest 8.
TEST_REQUIRE = [
    "pytest>=8,<9",
    "pytest-timeout>=2.3",
    "pytest-xdist>=3.7",
    "psutil>=6",
    "websocket-client>=1.7,<2",
    *READ_REQUIRE,
    *SAMPLES_REQUIRE,
    *BENCH_REQUIRE,
    *DOCS_REQUIRE,
    *CHECK_REQUIRE,
    *GCP_REQUIRE,
    *AWS_REQUIRE,
]

setup(
    name="images-to-tfrecords",
    version=VERSION,
    description="Convert raw image collections into deterministic, sharded TFRecords with Apache Beam, "
    "and read them fast with tf.data for multi-GPU training.",
    long_description=(HERE / "README.md").read_text(encoding="utf-8") if (HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["beam_jobs", "beam_jobs.*", "tfdata_readers", "tfdata_readers.*"]),
    install_requires=INSTALL_REQUIRES,
    extras_require={
        "test": TEST_REQUIRE,
        "read": READ_REQUIRE,
        "docs": DOCS_REQUIRE,
        "samples": SAMPLES_REQUIRE,
        "inspect": INSPECT_REQUIRE,
        "bench": BENCH_REQUIRE,
        "gcp": GCP_REQUIRE,
        "aws": AWS_REQUIRE,
    },
    entry_points={
        "console_scripts": [
            "images-to-tfrecords=beam_jobs.command_line.cli:main",
            "verify-tfrecords=tfdata_readers.verify:main",
            "inspect-tfrecords=tfdata_readers.inspect:main",
        ]
    },
)
