"""``e2b-code-interpreter`` unchanged against hutch's E2B wire, with only E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY set: its default template is hutch's code-interpreter runtime,
its run_code reaches port 49999 through the E2B listener (api/e2b/ports.py). One sandbox for
the module; the runtime is built by scripts/install (a first build takes about 2 minutes)."""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from e2b import Sandbox as BaseSandbox
from e2b.exceptions import NotFoundException, TimeoutException
from e2b_code_interpreter import Sandbox

from tests.e2b.conftest import E2bServer
from tests.system.server import KEY

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def served(e2b_embedded_server: E2bServer) -> Iterator[E2bServer]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("E2B_API_URL", e2b_embedded_server.url)
        mp.setenv("E2B_SANDBOX_URL", e2b_embedded_server.url)
        mp.setenv("E2B_API_KEY", KEY)
        mp.delenv("E2B_DEBUG", raising=False)
        mp.delenv("E2B_DOMAIN", raising=False)
        yield e2b_embedded_server


@pytest.fixture(scope="module")
def sbx(served: E2bServer) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(timeout=300)
    yield sandbox
    sandbox.kill()


def test_the_default_template_runs_code_with_rich_results(sbx: Sandbox) -> None:
    assert Sandbox.get_info(sbx.sandbox_id).template_id == "code-interpreter-v1"
    seen: list[str] = []
    sbx.run_code("x = 20")
    ran = sbx.run_code("print('hi'); x + 1", on_stdout=lambda m: seen.append(m.line))
    assert ran.text == "21" and ran.logs.stdout == ["hi\n"] and seen == ["hi\n"]  # state kept, streamed
    chart = sbx.run_code("import matplotlib.pyplot as plt\nplt.bar([1, 2], [3, 4])\nplt.show()")
    assert chart.results and base64.b64decode(chart.results[0].png).startswith(PNG_MAGIC)
    table = sbx.run_code("import pandas as pd\npd.DataFrame({'k': [1], 'v': ['seen']})")
    assert "<table" in table.results[0].html and "<td>seen</td>" in table.results[0].html
    failed = sbx.run_code("def boom():\n    raise KeyError('gone')\nboom()")
    assert failed.error is not None and failed.error.name == "KeyError"
    assert "boom()" in failed.error.traceback and "gone" in failed.error.traceback
    context = sbx.create_code_context(cwd="/tmp")
    apart = sbx.run_code("x", context=context)
    assert apart.error is not None and apart.error.name == "NameError"


def test_no_hutch_credential_reaches_the_interpreter(sbx: Sandbox) -> None:
    """The envd token opens envd: the interpreter is given a token of its own instead."""
    ran = sbx.run_code("open('/home/agentuity/.hutch-interpreter-token').read().strip()")
    own = (ran.text or "").strip("'")
    assert own and own != sbx._envd_access_token and own != KEY and sbx._envd_access_token not in own


def _execute(url: str, sandbox_id: str, **tokens: str) -> int:
    headers = {"Content-Type": "application/json", "E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49999",
               **{name.replace("_", "-"): value for name, value in tokens.items()}}
    req = urllib.request.Request(url + "/execute", data=json.dumps({"code": "print('ran')"}).encode(),
                                 headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def test_another_orgs_key_and_token_run_nothing_in_it(served: E2bServer, sbx: Sandbox) -> None:
    other_key = served.key_of_new_org("e2b-interp-attacker")
    with pytest.raises(NotFoundException):
        Sandbox.connect(sbx.sandbox_id, api_key=other_key)
    theirs = BaseSandbox.create(template="base", api_key=other_key, timeout=60)
    try:
        their_token = theirs._envd_access_token
        assert their_token
        assert _execute(served.url, sbx.sandbox_id, X_Access_Token=their_token) == 401
        assert _execute(served.url, sbx.sandbox_id, E2B_Traffic_Access_Token=their_token) == 401
        # A's own token beside B's: every token sent must be A's.
        assert _execute(served.url, sbx.sandbox_id, X_Access_Token=sbx._envd_access_token,
                        E2B_Traffic_Access_Token=their_token) == 401
        assert _execute(served.url, sbx.sandbox_id) == 401
        # B's own sandbox has no interpreter port: B's token gets nothing from it either.
        assert _execute(served.url, theirs.sandbox_id, X_Access_Token=their_token) == 404
    finally:
        theirs.kill()
    assert _execute(served.url, sbx.sandbox_id, X_Access_Token=sbx._envd_access_token) == 200


def test_output_streams_and_a_timed_out_cell_is_interrupted(sbx: Sandbox) -> None:
    """The relay streams: a line printed before a pause arrives before the cell ends; a caller
    that leaves at its timeout interrupts the cell and the context keeps its state."""
    started = time.monotonic()
    arrived: list[float] = []
    sbx.run_code("import time\nprint('first', flush=True)\ntime.sleep(2)\nprint('second')",
                 on_stdout=lambda m: arrived.append(time.monotonic() - started))
    ended = time.monotonic() - started
    assert len(arrived) == 2 and ended - arrived[0] > 1.5, (arrived, ended)
    sbx.run_code("kept = 'still here'")
    with pytest.raises(TimeoutException):
        sbx.run_code("import time\nfor _ in range(60):\n    time.sleep(0.5)", timeout=2)
    started = time.monotonic()
    assert sbx.run_code("kept").text == "still here" and time.monotonic() - started < 10


def test_javascript_keeps_state_streams_and_awaits(sbx: Sandbox) -> None:
    """language "js" (the SDK's alias, as E2B's server takes it) and "javascript" share the
    default JavaScript context: a top-level let survives into the next call."""
    assert sbx.run_code("let x = 1", language="js").error is None
    assert sbx.run_code("x + 1", language="javascript").text == "2"
    seen: list[str] = []
    ran = sbx.run_code("console.log('out', x); console.error('err'); 'done'", language="javascript",
                       on_stdout=lambda m: seen.append(m.line))
    assert ran.logs.stdout == ["out 1\n"] and ran.logs.stderr == ["err\n"] and seen == ["out 1\n"]
    assert ran.text == "done"
    waited = sbx.run_code("const y = await new Promise(r => setTimeout(() => r(x + 4), 10))\ny", language="js")
    assert waited.error is None and waited.text == "5"
    assert sbx.run_code("y * 2", language="js").text == "10"  # a declaration beside an await is kept too
    assert sbx.run_code("({a: [1, 2], b: 'z'})", language="js").text == "{ a: [ 1, 2 ], b: 'z' }"


def test_javascript_import_statements(sbx: Sandbox) -> None:
    """A static import, as in a module, though a cell is a script (where it is a SyntaxError)."""
    code = ("import os from 'os'\nimport { join as j,\n  sep } from 'node:path'\nimport * as util from 'node:util'\n"
            "import 'node:fs';\nj('a', os.platform(), typeof util.inspect) + sep")
    imported = sbx.run_code(code, language="js")
    assert imported.error is None and imported.text == "a/linux/function/"
    assert sbx.run_code(code, language="js").text == "a/linux/function/"  # the same cell again
    assert sbx.run_code("const importer = 'import x from \"y\"'\nimporter.length", language="js").text == "17"


def test_typescript_is_javascript_with_its_types_stripped(sbx: Sandbox) -> None:
    typed = sbx.run_code("interface P { n: number }\nconst p: P = { n: await Promise.resolve(21) }\np.n * 2",
                         language="typescript")
    assert typed.error is None and typed.text == "42"
    assert sbx.run_code("enum Colour { Red, Green }\nColour.Green", language="ts").text == "1"  # transformed
    context = sbx.create_code_context(language="ts")
    assert context.language == "typescript"
    assert sbx.run_code("typeof p", context=context).text == "undefined"  # a context of its own
    wrong = sbx.run_code("const q: = 1", language="typescript")
    assert wrong.error is not None and wrong.error.name == "SyntaxError"


def test_a_javascript_exception_is_a_structured_error(sbx: Sandbox) -> None:
    failed = sbx.run_code("function boom() { throw new TypeError('no good') }\nboom()", language="javascript")
    assert failed.error is not None and (failed.error.name, failed.error.value) == ("TypeError", "no good")
    assert "boom" in failed.error.traceback and "TypeError: no good" in failed.error.traceback
    syntax = sbx.run_code("let = = 2", language="javascript")
    assert syntax.error is not None and syntax.error.name == "SyntaxError"
    assert sbx.run_code("1 + 1", language="javascript").text == "2"  # the context lives on


def test_javascript_contexts_are_apart_and_a_runaway_loop_is_stopped(sbx: Sandbox) -> None:
    sbx.run_code("let kept = 'still here'", language="javascript")
    other = sbx.create_code_context(language="javascript", cwd="/tmp")
    assert other.language == "javascript" and other.cwd == "/tmp"
    assert sbx.run_code("process.cwd()", context=other).text == "/tmp"
    apart = sbx.run_code("kept", context=other)
    assert apart.error is not None and apart.error.name == "ReferenceError"
    sbx.run_code("let mine = 1", context=other)
    assert other.id in {c.id: c.language for c in sbx.list_code_contexts() if c.language == "javascript"}
    sbx.restart_code_context(other)  # a fresh process under the same id
    assert sbx.run_code("typeof mine", context=other).text == "undefined"
    sbx.remove_code_context(other)
    assert other.id not in {c.id for c in sbx.list_code_contexts()}
    with pytest.raises(NotFoundException):
        sbx.run_code("1", context=other)
    with pytest.raises(TimeoutException):
        sbx.run_code("while (true) {}", language="javascript", timeout=2)
    started = time.monotonic()
    assert sbx.run_code("kept", language="javascript").text == "still here"  # interrupted, state kept
    assert time.monotonic() - started < 10


def test_a_cells_late_output_reaches_no_later_cell(sbx: Sandbox) -> None:
    """What a cell left running prints after the cell ended (a JavaScript child's exec callback,
    a Python thread) was the next cell's output, if that cell was running then: it is the
    ended cell's, and dropped. A subprocess writing to the inherited stdout is not told apart
    (docs/code-interpreter.md)."""
    late = {"js": "require('child_process').exec('sleep 0.5; echo late', (e, out) => console.log(out))",
            "python": "import threading, time\n"
                      "threading.Thread(target=lambda: (time.sleep(0.5), print('late'))).start()"}
    following = {"js": "await new Promise(r => setTimeout(r, 1500)); console.log('own')",
                 "python": "import time; time.sleep(1.5); print('own')"}
    for language in ("js", "python"):
        assert sbx.run_code(late[language], language=language).logs.stdout == []
        ran = sbx.run_code(following[language], language=language)
        assert (ran.error, ran.logs.stdout, ran.logs.stderr) == (None, ["own\n"], []), language
    # Its own cell's still: a thread's output while the cell runs, a pool an earlier cell made
    # running a later cell's task, a subprocess's output.
    sbx.run_code("from concurrent.futures import ThreadPoolExecutor\npool = ThreadPoolExecutor(1)\n"
                 "pool.submit(print, 'first').result()")
    mine = sbx.run_code("t = threading.Thread(target=lambda: print('mine')); t.start(); t.join()\n"
                        "pool.submit(print, 'pooled').result()\n"
                        "import subprocess; subprocess.run('echo child', shell=True)")
    assert "".join(mine.logs.stdout) == "mine\npooled\nchild\n"


def test_run_code_reaches_the_interpreter_by_the_domain(served: E2bServer, sbx: Sandbox) -> None:
    """Found by E2B_DOMAIN, the SDK sends run_code to https://49999-{id}.{domain}: host routing
    relays it to the interpreter as the header form is (api/e2b/hosts.py, ports.py). The same
    sandbox, connected from a process of its own (the SDK's TLS pool takes the CA at its first
    use); without the traffic token that host is a 403."""
    script = ("import json\nfrom e2b_code_interpreter import Sandbox\n"
              f"sbx = Sandbox.connect({sbx.sandbox_id!r})\n"
              "print(json.dumps({'url': sbx._jupyter_url, 'text': sbx.run_code('6 * 7').text}))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(served.domain_env(), PYTHONPATH="")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"url": f"https://49999-{sbx.sandbox_id}.{served.domain}", "text": "42"}
    context = ssl.create_default_context(cafile=str(served.ca_file))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{found['url']}/contexts", timeout=30, context=context)
    refused.value.close()
    assert refused.value.code == 403


def test_an_agent_pauses_the_interpreter_between_its_turns(sbx: Sandbox) -> None:
    """E2B's use of pause: a code-interpreter sandbox paused between an agent's turns, its
    kernel and a cell's background thread frozen with it; the connect resumes them, the
    variables kept and the thread counting on from where it was."""
    sbx.run_code("import threading, time\nturns = ['first']\nticks = [0]\n"
                 "def tick():\n    while True:\n        ticks[0] += 1\n        time.sleep(0.1)\n"
                 "threading.Thread(target=tick, daemon=True).start()")
    time.sleep(0.5)
    before = int(sbx.run_code("ticks[0]").text)
    assert sbx.pause() is True
    assert sbx.get_info().state.value == "paused"
    time.sleep(3)
    resumed = Sandbox.connect(sbx.sandbox_id)
    assert resumed.run_code("turns.append('second'); turns").text == "['first', 'second']"
    after = int(resumed.run_code("ticks[0]").text)
    assert before < after < before + 20, (before, after)  # 30 had it run on while paused
