"""Checking a dataset against its manifest, as the verify command does. verify_cli.py parses the
command's arguments without TensorFlow, then verification.py checks the declared features, dead
letters, unlisted shards and each shard's bytes, sha256 and records, with the reader's own
sources and parsing."""
