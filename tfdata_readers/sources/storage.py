"""The few file calls the reader makes outside its tf.data graph, on any storage it reads.

TensorFlow's filesystems (`tf.io.gfile`) cover local paths, `file://` and `gs://`, and the reader
uses them there. TensorFlow 2.21 has no `s3://` filesystem, so for an S3 (or S3-compatible) data
dir these calls go to boto3, the AWS SDK, with its default credential chain and endpoint
(`AWS_ENDPOINT_URL` for MinIO, R2 and the like). The shards themselves are read from a verified
local copy (shard_cache.py): TensorFlow's readers never see an s3:// path.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import os
import posixpath
import shutil
import tempfile
from collections.abc import Iterator

import tensorflow as tf

__all__ = [
    "S3_SCHEMES",
    "S3Options",
    "download",
    "exists",
    "is_s3",
    "isdir",
    "listdir",
    "local_copy",
    "read_bytes",
    "s3_client",
    "s3_store",
    "size",
    "split_s3",
    "using",
]

S3_SCHEMES = ("s3://", "s3a://", "s3n://")
_CHUNK = 8 * 2**20


def is_s3(path: str) -> bool:
    """Whether ``path`` is an S3 URI (s3://, or Hadoop's s3a:// and s3n:// spellings of it)."""
    return path.lower().startswith(S3_SCHEMES)


def split_s3(uri: str) -> tuple[str, str]:
    """(bucket, key) of an S3 URI."""
    rest = uri.split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ValueError(f"{uri} names no bucket")
    return bucket, key


@dataclasses.dataclass(frozen=True)
class S3Options:
    """What a reader says about its S3 store beyond the AWS default chain: an endpoint (MinIO, R2,
    any S3-compatible store) and a named profile of ~/.aws (its credentials and region). None:
    the chain's own (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, the environment, instance roles)."""

    endpoint_url: str | None = None
    profile: str | None = None


# The options of the reader call under way in this thread (make_dataset, distribute): the manifest
# and shard-list calls it makes read them here rather than through every signature. The shard
# cache, which downloads on other threads, is given them explicitly.
_OPTIONS: contextvars.ContextVar[S3Options | None] = contextvars.ContextVar("s3_options", default=None)


@contextlib.contextmanager
def using(options: S3Options | None) -> Iterator[None]:
    """The S3 calls made in this block (on this thread) use ``options``."""
    token = _OPTIONS.set(options)
    try:
        yield
    finally:
        _OPTIONS.reset(token)


def is_endpoint_url(value: object) -> bool:
    """Whether ``value`` can name an S3 endpoint: None (the default chain's) or an http(s):// URL."""
    return value is None or (isinstance(value, str) and value.startswith(("http://", "https://")))


def s3_store(endpoint_url: str | None = None, profile: str | None = None) -> contextlib.AbstractContextManager[None]:
    """``with s3_store(endpoint_url=..., profile=...):`` the reader calls that take no ReadConfig
    (`load_manifest`, `steps_per_epoch`, `class_counts`, `verify`, ...) read s3:// from that store,
    as a ReadConfig's `s3_endpoint_url` and `s3_profile` make `make_dataset` and `distribute` do."""
    if not is_endpoint_url(endpoint_url):
        raise ValueError(f"endpoint_url must be an http:// or https:// URL (got {endpoint_url!r})")
    return using(S3Options(endpoint_url=endpoint_url, profile=profile))


@functools.cache
def _client_for(pid: int, options: S3Options):  # noqa: ANN202 - boto3's client class is made at run time
    del pid  # a key only: a client is not shared with a forked child
    try:
        import boto3  # pylint: disable=import-outside-toplevel
        from botocore.config import Config  # pylint: disable=import-outside-toplevel
    except ImportError as error:
        raise ImportError(
            "reading s3:// needs boto3: pip install 'images-to-tfrecords[aws]' (or pip install boto3)"
        ) from error
    # Standard retries: throttling and dropped connections are retried with backoff, by the SDK.
    config = Config(retries={"max_attempts": 10, "mode": "standard"}, max_pool_connections=32)
    session = boto3.session.Session(profile_name=options.profile)
    return session.client("s3", config=config, endpoint_url=options.endpoint_url)


def s3_client(options: S3Options | None = None):  # noqa: ANN201
    """This process's S3 client for ``options`` (by default those of the reader call under way):
    credentials, region and endpoint from the AWS default chain (environment, ~/.aws, instance
    roles; ``AWS_ENDPOINT_URL`` for S3-compatible stores) where the options say nothing."""
    return _client_for(os.getpid(), options or _OPTIONS.get() or S3Options())


def _missing(error: Exception) -> bool:
    response = getattr(error, "response", None) or {}
    return str(response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound")


@contextlib.contextmanager
def _s3_call(path: str) -> Iterator[None]:
    """Names ``path`` and the store in an SDK error (no credentials, no endpoint, access denied);
    a missing object becomes FileNotFoundError."""
    try:
        yield
    except FileNotFoundError:
        raise
    except Exception as error:
        if _missing(error):
            raise FileNotFoundError(path) from None
        if not type(error).__module__.startswith(("botocore", "boto3", "s3transfer")):
            raise
        endpoint = getattr(getattr(s3_client(), "meta", None), "endpoint_url", "?")
        raise OSError(
            f"cannot read {path} from the S3 store at {endpoint}: {error}. The store and identity are "
            f"ReadConfig.s3_endpoint_url and s3_profile (tfdata_readers.s3_store() for calls without a ReadConfig), "
            f"else the AWS default chain (AWS_ENDPOINT_URL, AWS_PROFILE, AWS_ACCESS_KEY_ID, ~/.aws, instance roles)"
        ) from error


def exists(path: str) -> bool:
    """Whether a file exists at ``path``."""
    if not is_s3(path):
        return tf.io.gfile.exists(path)
    try:
        size(path)
    except FileNotFoundError:
        return False
    return True


def size(path: str) -> int:
    """The byte size of the file at ``path``; FileNotFoundError names it when there is none."""
    if not is_s3(path):
        if not tf.io.gfile.exists(path):
            raise FileNotFoundError(path)
        return tf.io.gfile.stat(path).length
    bucket, key = split_s3(path)
    with _s3_call(path):
        return int(s3_client().head_object(Bucket=bucket, Key=key)["ContentLength"])


def read_bytes(path: str) -> bytes:
    """The whole file at ``path`` (a manifest: small)."""
    if not is_s3(path):
        with tf.io.gfile.GFile(path, "rb") as handle:
            return handle.read()
    bucket, key = split_s3(path)
    with _s3_call(path):
        return s3_client().get_object(Bucket=bucket, Key=key)["Body"].read()


def listdir(path: str) -> list[str]:
    """The names directly under the folder ``path`` (sub-folders end with "/", as tf.io.gfile's)."""
    if not is_s3(path):
        return tf.io.gfile.listdir(path)
    bucket, key = split_s3(path)
    prefix = key.rstrip("/") + "/" if key.strip("/") else ""
    names = []
    with _s3_call(path):
        pages = s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/")
        for page in pages:
            names += [posixpath.basename(o["Key"]) for o in page.get("Contents", []) if o["Key"] != prefix]
            names += [p["Prefix"][len(prefix) :] for p in page.get("CommonPrefixes", [])]
    return names


def isdir(path: str) -> bool:
    """Whether ``path`` is a folder (on S3: whether any key lies under it)."""
    if not is_s3(path):
        return tf.io.gfile.isdir(path)
    bucket, key = split_s3(path)
    prefix = key.rstrip("/") + "/" if key.strip("/") else ""
    with _s3_call(path):
        return bool(s3_client().list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1).get("KeyCount"))


def download(uri: str, target: str, options: S3Options | None = None) -> None:
    """Copies the file ``uri`` to the local path ``target``: on S3 with boto3's managed transfer
    (parallel ranged GETs, with retries), elsewhere with tf.io.gfile."""
    if not is_s3(uri):
        with tf.io.gfile.GFile(uri, "rb") as source, open(target, "wb") as sink:
            shutil.copyfileobj(source, sink, _CHUNK)
        return
    from boto3.s3.transfer import TransferConfig  # pylint: disable=import-outside-toplevel

    bucket, key = split_s3(uri)
    config = TransferConfig(multipart_threshold=_CHUNK, multipart_chunksize=_CHUNK, max_concurrency=8)
    with using(options or _OPTIONS.get()), _s3_call(uri):
        s3_client().download_file(bucket, key, target, Config=config)


@contextlib.contextmanager
def local_copy(path: str) -> Iterator[str]:
    """A path TensorFlow's readers can open holding the bytes of ``path``: ``path`` itself unless it
    is on S3, else a temporary download, removed on exit (for the checks that read a shard once,
    as it is, whatever its digest: the shard cache keeps only verified copies)."""
    if not is_s3(path):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="tfdata-readers-") as folder:
        local = os.path.join(folder, posixpath.basename(split_s3(path)[1]) or "file")
        download(path, local)
        yield local
