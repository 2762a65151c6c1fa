"""Step 3, imaging: one input's bytes to one tf.train.Example. Reading a source with a timeout,
decoding (libjpeg-turbo or Pillow, with bomb and EXIF checks), isolating risky decoders in a
child process, preprocessing and resampling, encoding, and the Example's wire format."""
