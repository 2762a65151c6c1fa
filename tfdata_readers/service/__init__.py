"""The tf.data service: decoding on other processes. dispatcher.py talks to a dispatcher with
deadlines (addresses, a handshake, a watchdog) and imports no TensorFlow; server.py runs a
dispatcher or worker process (started as `python -m tfdata_readers.data_service_server`), checking
its dispatcher with dispatcher.py first; reading.py, on the trainer, hands the reader's pipeline
to the service and checks what comes back."""
