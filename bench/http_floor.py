"""The HTTP floor under a one-shot through a Node client: no hutch at all.

The real ``@agentuity/core`` client's ``run()`` makes one POST (the create with its command),
then reads the output and long-polls the execution: four requests, the last three at once.
This times exactly that shape against two servers whose handlers do nothing but answer
(aiohttp, as hutch's API, and Node's own ``http``), beside bare ``python3 -c pass``, in
turns. What it gives is the part of a one-shot's time over bare that no server-side change
can take away, so issue 37's "one-shot within 5 ms of bare" can be read against it.

    python3 bench/http_floor.py [--n 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time

AIOHTTP_SERVER = r"""
import sys
from aiohttp import web
async def create(req):
    await req.read()
    return web.json_response({"success": True, "data": {"sandboxId": "sbx_x", "executionId": "exe_x"}})
async def stream(req):
    return web.Response(body=b"1\n", content_type="application/octet-stream")
async def poll(req):
    return web.json_response({"success": True, "data": {"status": "completed", "exitCode": 0}})
app = web.Application()
app.router.add_post("/sandbox", create)
app.router.add_get("/stream/{n}", stream)
app.router.add_get("/execution", poll)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""

NODE_SERVER = r"""
const http = require("node:http");
http.createServer((req, res) => {
  req.resume(); req.on("end", () => {
    if (req.url.startsWith("/stream")) { res.writeHead(200, {"content-type": "application/octet-stream"}); res.end("1\n"); return; }
    const d = req.url === "/sandbox" ? {sandboxId: "sbx_x", executionId: "exe_x"} : {status: "completed", exitCode: 0};
    res.writeHead(200, {"content-type": "application/json"}); res.end(JSON.stringify({success: true, data: d}));
  });
}).listen(+process.argv[1], "127.0.0.1");
"""

CLIENT = r"""
const [base, n] = [process.argv[1], +process.argv[2]];
(async () => {
  const t = [];
  for (let i = 0; i < n + 10; i++) {
    const s = performance.now();
    const r = await fetch(base + "/sandbox", {method: "POST", body: JSON.stringify({command: {exec: ["true"]}}),
                                             headers: {"content-type": "application/json"}});
    await r.json();
    await Promise.all([fetch(base + "/stream/1").then(r => r.text()), fetch(base + "/stream/2").then(r => r.text()),
                       fetch(base + "/execution").then(r => r.json())]);
    if (i >= 10) t.push(performance.now() - s);
  }
  t.sort((x, y) => x - y);
  console.log(t[Math.floor(t.length / 2)].toFixed(3));
})();
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(port: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"http_floor: nothing listens on 127.0.0.1:{port} after 20 s")


def _client(port: int, n: int) -> float:
    out = subprocess.run(["node", "-e", CLIENT, f"http://127.0.0.1:{port}", str(n)], capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip())


def _bare(n: int) -> float:
    times = []
    for _ in range(n + 5):
        t0 = time.perf_counter()
        subprocess.run(["/usr/bin/python3", "-c", "pass"], check=True)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times[5:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=300, help="one-shots' worth of requests per server and round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    pa, pn = _port(), _port()
    servers = [subprocess.Popen([sys.executable, "-c", AIOHTTP_SERVER, str(pa)]),
               subprocess.Popen(["node", "-e", NODE_SERVER, str(pn)])]
    try:
        _wait(pa)
        _wait(pn)
        rows: dict[str, list[float]] = {"aiohttp": [], "node http": [], "bare python3 -c pass": []}
        for _ in range(args.rounds):
            rows["aiohttp"].append(_client(pa, args.n))
            rows["node http"].append(_client(pn, args.n))
            rows["bare python3 -c pass"].append(_bare(20))
        print("| per one-shot's worth of requests (1 POST, then 3 GETs at once), p50 ms | "
              + " | ".join(f"round {i + 1}" for i in range(args.rounds)) + " |")
        print("|---|" + "---|" * args.rounds)
        for name, values in rows.items():
            print(f"| {name} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
    finally:
        for p in servers:
            p.terminate()
            p.wait(10)


if __name__ == "__main__":
    main()
