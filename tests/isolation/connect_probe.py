"""A script run inside a sandbox: try each ``host:port`` of its arguments at once and
print, as JSON, "open <first bytes of an HTTP answer>" or the error's type for each.

Shared by the network tests of both modes (test_local_network.py, rootless_probe.py).
"""

SCRIPT = """
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
def one(target):
    host, port = target.rsplit(":", 1)
    try:
        s = socket.create_connection((host, int(port)), timeout=1.5)
        s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
        return "open " + s.recv(12).decode(errors="replace")
    except OSError as err:
        return type(err).__name__
with ThreadPoolExecutor(len(sys.argv) - 1) as pool:
    print(json.dumps(dict(zip(sys.argv[1:], pool.map(one, sys.argv[1:])))))
"""
