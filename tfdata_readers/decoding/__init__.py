"""Bytes to tensors: what the reader does to each serialized record. In the order they run:
parse.py checks the manifest's declared features and parses the Examples, decode.py turns the
image bytes into uint8 pixels of the manifest's shape (and to the output dtype last), and
augment.py wraps decoding in the training crop and flip, seeded per example, or the eval path."""
