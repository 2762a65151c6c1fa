"""A forward proxy that tunnels every HTTPS CONNECT to one local port: how TensorFlow's GCS client
reaches a GCS emulator.

TensorFlow's GCS client has no endpoint setting (www.googleapis.com and storage.googleapis.com
are compiled in), but its libcurl honours HTTPS_PROXY and CURL_CA_BUNDLE. This proxy answers the
CONNECT and then relays bytes both ways, unchanged, to fake-gcs-server serving TLS with a
certificate for those hosts from a test CA. Written by hand because it is a plain TCP relay: no
HTTP is parsed beyond the CONNECT line, and nothing it relays is altered.

    python -m tests.objectstores.connect_tunnel LISTEN_PORT TARGET_PORT
"""

from __future__ import annotations

import socket
import sys
import threading


def _relay(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _tunnel(client: socket.socket, target: tuple[str, int]) -> None:
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = client.recv(4096)
        if not chunk:
            client.close()
            return
        head += chunk
    if not head.startswith(b"CONNECT "):
        client.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
        client.close()
        return
    upstream = socket.create_connection(target)
    client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
    threading.Thread(target=_relay, args=(client, upstream), daemon=True).start()
    _relay(upstream, client)


def main() -> None:
    listen_port, target_port = int(sys.argv[1]), int(sys.argv[2])
    server = socket.create_server(("127.0.0.1", listen_port))
    print(f"tunnelling CONNECT on 127.0.0.1:{listen_port} to 127.0.0.1:{target_port}", flush=True)
    while True:
        client, _ = server.accept()
        threading.Thread(target=_tunnel, args=(client, ("127.0.0.1", target_port)), daemon=True).start()


if __name__ == "__main__":
    main()
