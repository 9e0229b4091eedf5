"""The Web App in a real headless Chromium (Debian's, driven through its chromedriver by
Selenium) against `hutch serve` with the local driver and the embedded profile. Screenshots of
every page go to $HUTCH_TEST_ARTIFACTS (default tests/artifacts/webapp)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.compat.test_agentuity_client import _free_port, _hutch_command, _stop, _wait_ready
from tests.compat.test_agentuity_client import profile_flags as profile_flags

ARTIFACTS = Path(os.environ.get("HUTCH_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / "artifacts")) / "webapp"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture
def server(tmp_path: Path, profile_flags: list[str]) -> Iterator[tuple[str, str]]:
    key, port = "hk_boot_" + os.urandom(8).hex(), _free_port()
    url, log = f"http://127.0.0.1:{port}", tmp_path / "server.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen([*_hutch_command(), "serve", "--host", "127.0.0.1", "--port", str(port),
                                 "--data-dir", str(tmp_path / "data"), "--driver", "local", *profile_flags],
                                env={**os.environ, "HUTCH_API_KEY": key}, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        _wait_ready(proc, url, key, log)
        yield url, key
    finally:
        _stop(proc, url, key)


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            pytest.fail(f"{path} is missing: ./scripts/install --dev installs chromium and chromium-driver")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,800"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _api(url: str, key: str, method: str, path: str, body: Any = None) -> Any:
    req = urllib.request.Request(url + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())["data"]


class Page:
    def __init__(self, driver: WebDriver, shots: Path) -> None:
        self.d, self.shots = driver, shots
        shots.mkdir(parents=True, exist_ok=True)

    def wait(self, what: Callable[[WebDriver], Any], timeout: float = 60, why: str = "") -> Any:
        try:
            # The pages redraw what changes (live): an element may go stale between two looks.
            return WebDriverWait(self.d, timeout, poll_frequency=0.1,
                                 ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)).until(what)
        except WebDriverException:
            self.shot("failure")
            error = self.d.find_elements(By.ID, "error")
            shown = error[0].text if error and error[0].is_displayed() else ""
            raise AssertionError(f"waited {timeout} s for {why or what}; error box: {shown!r}") from None

    def css(self, selector: str, timeout: float = 30) -> Any:
        return self.wait(lambda d: d.find_element(By.CSS_SELECTOR, selector), timeout, selector)

    def act(self, selector: str, action: Callable[[Any], object], timeout: float = 30) -> None:
        """Find and act in one look, again if the element went stale in between: a page that
        redraws (the sign-in form once app.js has loaded) replaces what css() just found."""
        def attempt(d: WebDriver) -> bool:
            action(d.find_element(By.CSS_SELECTOR, selector))
            return True
        self.wait(attempt, timeout, selector)

    def type(self, selector: str, text: str) -> None:
        self.act(selector, lambda e: e.send_keys(text))

    def click(self, selector: str) -> None:
        self.act(selector, lambda e: e.click())

    def text_in(self, selector: str, text: str, timeout: float = 60) -> None:
        self.wait(lambda d: text in d.find_element(By.CSS_SELECTOR, selector).text, timeout, f"{text!r} in {selector}")

    def shot(self, name: str) -> None:
        self.d.save_screenshot(str(self.shots / f"{name}.png"))

    def no_error(self) -> None:
        error = self.d.find_element(By.ID, "error")
        assert not error.is_displayed(), error.text


@pytest.mark.timeout(600)
# The embedded profile only: the browser drives the same routes on both, and what the profile
# changes under them (sessions, the live feed, the keys) is tests/api/test_webapp.py's, on both
# profiles. The production run took another 15 s plus its server's start (run1.log).
@pytest.mark.parametrize("profile_flags", ["embedded"], indirect=True)
def test_the_web_app_flows_in_chromium(server: tuple[str, str], browser: WebDriver, profile_flags: list[str]) -> None:
    url, boot = server
    shots = ARTIFACTS / ("production" if profile_flags else "embedded")
    page = Page(browser, shots)
    _api(url, boot, "POST", "/orgs", {"name": "web"})
    key = _api(url, boot, "POST", "/keys?orgId=org_web", {"role": "admin", "name": "browser"})["secret"]

    # Sign in.
    browser.get(url + "/app")
    page.type("#api-key", key)
    page.shot("01-sign-in")
    page.click("#sign-in button")
    page.text_in("#who", "org_web · admin")
    page.text_in("#sandboxes", "No sandboxes yet.")

    # A sandbox made elsewhere appears live (the page follows the event log, no reload).
    other = _api(url, key, "POST", "/sandbox", {"runtime": "base:latest", "name": "from-the-api"})["sandboxId"]
    page.text_in("#sandboxes", other)
    page.shot("02-sandboxes")

    # Create one with the form.
    page.click("details.card summary")
    Select(page.css("#create select[name=runtime]")).select_by_value("python:3.13")
    page.type("#create input[name=name]", "browser-made")
    page.type("#create textarea[name=env]", "STAGE=one")
    page.click("#create-submit")
    page.wait(lambda d: "#/sandbox/sbx_" in d.current_url, why="the new sandbox's page")
    sid = browser.current_url.rsplit("/", 1)[1]
    page.text_in("#sandbox-head", "idle", timeout=120)

    # The terminal: python3 prints 42.
    page.click("#open-terminal")
    page.css("#terminal .xterm-helper-textarea")
    page.wait(lambda d: "$" in _screen(d), why="a shell prompt")
    browser.find_element(By.CSS_SELECTOR, "#terminal .xterm-helper-textarea").send_keys("python3 -c 'print(6*7)'" + Keys.ENTER)
    page.wait(lambda d: "\n42" in _screen(d), why="42 on the terminal")
    page.shot("03-sandbox-terminal")

    # A command's output, live under the form.
    page.css("#run-command").send_keys("echo run-$((20+1))")
    page.click("#run button")
    page.text_in("#run-output", "run-21")
    page.text_in("#run-output", "[exit 0]")

    # Upload a file; it is listed.
    upload = page.shots.parent / "hello.txt"
    upload.write_text("hello from the browser\n")
    page.css("#upload").send_keys(str(upload))
    page.text_in("#files", "hello.txt")

    # Change the env, then take a snapshot and see it in the lineage.
    rows = browser.find_elements(By.CSS_SELECTOR, "#env tr")
    stage = next(r for r in rows if r.find_element(By.CSS_SELECTOR, ".env-key").get_attribute("value") == "STAGE")
    value = stage.find_element(By.CSS_SELECTOR, ".env-value")
    value.clear()
    value.send_keys("two")
    page.click("#save-env")
    page.text_in("#timeline", "env")
    page.click("#snapshot")
    alert = page.wait(lambda d: d.switch_to.alert, why="the snapshot name prompt")
    alert.send_keys("webshot")
    alert.accept()
    page.wait(lambda d: "webshot" in d.find_element(By.ID, "lineage").text, why="the snapshot in the lineage")
    page.shot("04-sandbox-env-snapshot")

    # Time travel to before the env change: the old env and that moment's status.
    started = page.css("#timeline button[data-type='lifecycle:started']")
    started.click()
    page.text_in("#travel", "As of lifecycle:started")
    assert "one" in page.css("#travel-env").text and "two" not in page.css("#travel-env").text
    assert page.css("#travel .badge").get_attribute("data-status") == "idle"
    page.shot("05-time-travel")

    # The other pages render without an error.
    for name in ("runtimes", "snapshots", "usage", "keys"):
        browser.get(f"{url}/app#/{name}")
        page.wait(lambda d: d.find_element(By.TAG_NAME, "h1").text != "", why=f"the {name} page")
        time.sleep(0.3)
        page.no_error()
        page.shot(f"06-{name}")
    browser.get(f"{url}/app#/snapshots")
    page.text_in("#snapshot-list", "webshot")

    # Usage per project: the selector lists the organization's projects.
    _api(url, key, "POST", "/projects", {"name": "web-project"})
    browser.get(f"{url}/app#/usage")
    Select(page.css("#usage-project")).select_by_visible_text("web-project")
    page.wait(lambda d: d.find_element(By.CSS_SELECTOR, "#usage-project option:checked").text == "web-project",
              why="the project's usage")
    page.no_error()

    # A read-only key sees no button that would fail.
    reader = _api(url, key, "POST", "/keys", {"role": "read-only"})["secret"]
    page.click("#sign-out")
    page.type("#api-key", reader)
    page.click("#sign-in button")
    page.text_in("#who", "read-only")
    browser.get(f"{url}/app#/sandbox/{sid}")
    page.text_in("#timeline", "lifecycle:started")
    for control in ("#destroy", "#pause", "#snapshot", "#open-terminal", "#save-env", "#run", "#upload"):
        assert not [e for e in browser.find_elements(By.CSS_SELECTOR, control) if e.is_displayed()], control
    assert "null" not in browser.find_element(By.ID, "main").text.split()  # nothing left out shows as text
    page.shot("06-read-only-sandbox")
    page.click("#sign-out")
    page.type("#api-key", key)
    page.click("#sign-in button")
    page.text_in("#who", "admin")

    # Destroy, then sign out.
    browser.get(f"{url}/app#/sandbox/{sid}")
    page.click("#destroy")
    page.wait(lambda d: d.find_element(By.CSS_SELECTOR, "#sandbox-head .badge").get_attribute("data-status")
              in ("terminated", "deleted"), why="the sandbox destroyed")
    page.shot("07-destroyed")
    page.click("#sign-out")
    page.css("#api-key")
    browser.get(url + "/app#/")
    page.css("#api-key")  # the session is gone: back to the sign-in page
    page.no_error()
    # A phone's width: the sandboxes page still usable.
    browser.set_window_size(390, 844)
    page.type("#api-key", key)
    page.click("#sign-in button")
    page.text_in("#sandboxes", other)
    page.shot("08-phone-sandboxes")


def _screen(driver: WebDriver) -> str:
    return str(driver.execute_script(
        "const t = window.hutchTerminal; if (!t) return ''; const b = t.buffer.active; const out = [];"
        "for (let i = 0; i < b.length; i++) out.push(b.getLine(i).translateToString(true)); return out.join('\\n');"))
