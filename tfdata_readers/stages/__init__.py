"""The reader's stages, in the order `make_dataset` runs them; each takes and returns a `tf.data.Dataset`.

  plan.py     manifest, split, options -> a `ReaderPlan`: every check and every derived number, once
  records.py  shard pieces -> (serialized, name) records: interleaved, local or through the cache
  passes.py   records -> the batches of each pass: the seeded shuffles of an epoch, or one fixed order
  decode.py   ([B] serialized, [B] name) batches -> (image, label, ...) batches: parse, decode, augment
  ending.py   the step count, the prefetch, the checkpoint's identity check, the tf.data service

As Model Garden keeps its Decoder apart from its Parser and TFDS builds its reader from small
functions, each stage is a screen of code that reads the plan and never decides it again.
"""
