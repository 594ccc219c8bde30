"""The chat page at `/`, in a real browser: Debian's Chromium (headless) driven by selenium through Debian's
chromedriver, both given by path so Selenium Manager never runs (and SE_OFFLINE keeps it from the network if
it did). `.ci/run` installs them.

One server (`--threads 1`) and one browser serve the module; each test opens the page with its settings in
the URL, which starts a fresh conversation. After every test, the browser's log holds no errors (bar the
HTTP statuses a test provokes on purpose) and Chromium's performance log shows every URL the page loaded on
the server's own origin. Waits are WebDriverWait on a condition, with a bound; never a sleep.

Replies come from the real model at temperature 0, so they are deterministic and the page's text can be
compared with what the API answers to the same request. The XSS checks: the default (base) model echoes the
user's message, so a chat message holding `<script>` and `<img onerror>` gets a real reply holding them too
(asserted through the API first), and likewise a completion prompt that repeats the payload; the renderer is
also run, through the page's own module, on crafted Markdown around the payload (in code, link targets,
image syntax, tables). Each must show as text: no such element in the page, no handler run.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import tempfile

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from pyserve.bench.launch import ServerProcess
from pyserve.bench.prometheus import parse_metrics, total
from pyserve.server.routes.webui import CSP
from support.paths import REPO

# Debian's packages `chromium` and `chromium-driver` (no browser download at test time)
CHROMIUM, CHROMEDRIVER = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
BROWSER_MISSING = "the chat page's browser tests need Debian's chromium and chromedriver: " \
                  "apt-get install chromium chromium-driver"
os.environ["SE_OFFLINE"] = "true"
PAYLOAD = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">'
WEBUI = str(REPO / "pyserve" / "server" / "webui")


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(threads=1).wait_ready()
    yield srv
    assert srv.stop() == 0, "".join(srv.stderr)


@pytest.fixture(scope="module")
def driver():
    if not (CHROMIUM and CHROMEDRIVER):
        if os.environ.get("CI") == "true":  # .ci/run installs both: a missing browser there is a failure
            pytest.fail(BROWSER_MISSING)
        pytest.skip(BROWSER_MISSING)
    downloads = tempfile.mkdtemp(prefix="pyserve-webui-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,860", "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    d = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    d.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": downloads})
    d.downloads = downloads
    yield d
    d.quit()


class Page:
    """The page in the browser, and the checks every test ends with."""

    def __init__(self, driver, server):
        self.d, self.srv = driver, server
        self.origins = {server.url}
        self.expected_statuses: set[int] = set()  # HTTP errors a test provokes: their log lines are expected

    def open(self, query: str = "", url: str = "") -> None:
        self.d.get((url or self.srv.url) + "/" + query)
        self.wait(lambda: self.d.find_elements(By.CSS_SELECTOR, "#model option"))

    def wait(self, cond, timeout: float = 30):
        # (a condition that read an element the page redrew meanwhile is asked again)
        return WebDriverWait(self.d, timeout, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda _: cond())

    def js(self, script: str, *args):
        return self.d.execute_script(script, *args)

    def js_async(self, script: str, *args):
        """`script` is an async function body; its return value comes back."""
        return self.d.execute_async_script(
            f"const done = arguments[arguments.length - 1]; (async () => {{ {script} }})().then(done, "
            "(e) => done({error: String(e)}));", *args)

    def send(self, text: str) -> None:
        """Types `text` as a person would (Shift+Enter between lines), then Enter."""
        n = len(self.replies())
        box = self.d.find_element(By.ID, "input")
        for k, line in enumerate(text.split("\n")):
            if k:
                box.send_keys(Keys.SHIFT, Keys.ENTER)
            box.send_keys(line)
        box.send_keys(Keys.ENTER)
        self.wait(lambda: len(self.replies()) == n + 1)

    def replies(self):
        return self.d.find_elements(By.CSS_SELECTOR, "#messages article.assistant")

    def wait_idle(self, timeout: float = 60) -> None:
        """Till no generation runs: Send is back, no reply pending."""
        self.wait(lambda: self.d.find_element(By.ID, "stop").get_attribute("hidden") is not None
                  and not self.d.find_elements(By.CSS_SELECTOR, ".pending"), timeout)

    def conversation(self) -> dict:
        """The current conversation as the page stored it."""
        convs = json.loads(self.js("return localStorage.getItem('pyserve.conversations')"))
        current = self.js("return localStorage.getItem('pyserve.current')")
        return next(c for c in convs if c["id"] == current)

    def rendered_text(self, markdown: str) -> str:
        """The text the page's own renderer makes of `markdown`."""
        return self.js_async("const m = await import('/webui/markdown.js'); const div = document.createElement('div');"
                             "div.append(m.render(arguments[0])); return div.textContent;", markdown)

    def check_logs(self) -> None:
        errors = [e for e in self.d.get_log("browser") if e["level"] == "SEVERE"
                  and not (e["source"] == "network" and any(f"status of {s} " in e["message"]
                                                            for s in self.expected_statuses))]
        assert errors == [], errors
        urls = set()
        for entry in self.d.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            if msg["method"] == "Network.requestWillBeSent":
                urls.add(msg["params"]["request"]["url"])
        foreign = {u for u in urls if not any(u.startswith(o + "/") or u.startswith("blob:" + o + "/")
                                              for o in self.origins)}
        assert foreign == set(), foreign


@pytest.fixture
def page(driver, server):
    p = Page(driver, server)
    driver.get_log("browser"), driver.get_log("performance")  # what earlier tests left
    yield p
    p.check_logs()


def chat_api(server, messages: list[str], system: str = "", **params) -> str:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": m} for i, m in enumerate(messages)]
    msgs = [{"role": "system", "content": system}] * bool(system) + msgs
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                   json={"model": server.model, "messages": msgs, **params})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def metric(server, name: str) -> float:
    samples, _ = parse_metrics(httpx.get(server.url + "/metrics").text)
    return total(samples, name)


def test_page_and_assets_headers(server):
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["content-security-policy"] == CSP and CSP.startswith("default-src 'self'")
    assert page.headers["cache-control"] == "no-cache" and page.headers["x-content-type-options"] == "nosniff"
    again = httpx.get(server.url + "/", headers={"If-None-Match": page.headers["etag"]})
    assert again.status_code == 304 and again.content == b""
    js = httpx.get(server.url + "/webui/app.js")
    assert js.status_code == 200 and js.headers["content-type"] == "text/javascript; charset=utf-8"
    assert js.headers["content-security-policy"] == CSP
    assert httpx.get(server.url + "/webui/style.css").headers["content-type"] == "text/css; charset=utf-8"
    assert httpx.get(server.url + "/webui/nothing.js").status_code == 404
    assert httpx.get(server.url + "/webui/../pyserve/server/app.py").status_code == 404


def test_sources_never_parse_html():
    """No string reaches the DOM as HTML: the renderer and views build nodes (the XSS tests check the effect)."""
    for path in glob.glob(os.path.join(WEBUI, "*.js")):
        src = re.sub(r"^\s*//.*$", "", open(path, encoding="utf-8").read(), flags=re.M)  # (comments may say it)
        assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function",
                             src), path


def test_chat_streams_the_api_reply(page):
    page.open("?temperature=0&max_tokens=24")
    assert page.d.current_url == page.srv.url + "/"  # the preset went into the conversation, not the reload
    served = [m["id"] for m in httpx.get(page.srv.url + "/v1/models").json()["data"]]
    options = page.d.find_elements(By.CSS_SELECTOR, "#model option")
    assert [o.get_attribute("value") for o in options] == served and options[0].is_selected()
    page.js("window.__lengths = []; new MutationObserver(() => { const b = document.querySelector("
            "'article.assistant.pending .body'); if (b) window.__lengths.push(b.textContent.length); })"
            ".observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});")
    box = page.d.find_element(By.ID, "input")
    box.send_keys("Name three")
    box.send_keys(Keys.SHIFT, Keys.ENTER)  # a line break, not a send
    assert box.get_attribute("value") == "Name three\n" and page.replies() == []
    box.send_keys(Keys.BACKSPACE)
    page.send(" animals.")
    page.wait_idle()
    want = chat_api(page.srv, ["Name three animals."], temperature=0, max_tokens=24)
    conv = page.conversation()
    assert [m["content"] for m in conv["messages"]] == ["Name three animals.", want]
    body = page.replies()[-1].find_element(By.CSS_SELECTOR, ".body")
    assert body.get_property("textContent") == page.rendered_text(want)
    meta = page.replies()[-1].find_element(By.CSS_SELECTOR, ".meta").text
    assert re.fullmatch(r"24 tokens · [\d.]+ tokens/s · TTFT \d+ ms · cut at max_tokens", meta), meta
    lengths = page.js("return window.__lengths")
    assert len(set(lengths)) >= 5 and lengths == sorted(lengths), lengths  # it grew piece by piece
    assert box.get_attribute("value") == ""


def contrast(fg: str, bg: str) -> float:
    """WCAG contrast ratio of two computed `rgb(r, g, b)` colours."""
    def lum(c):
        r, g, b = (int(v) / 255 for v in re.findall(r"\d+", c)[:3])
        lin = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in (r, g, b)]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    hi, lo = sorted((lum(fg), lum(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def colour_pairs(page) -> dict:
    return page.js(
        "const css = (sel, p) => getComputedStyle(document.querySelector(sel))[p];"
        "return {body: [css('body', 'color'), css('body', 'backgroundColor')],"
        "meta: [css('.meta', 'color'), css('body', 'backgroundColor')],"
        "user: [css('article.user .body', 'color'), css('article.user .body', 'backgroundColor')],"
        "send: [css('#send', 'color'), css('#send', 'backgroundColor')]};")


def test_light_dark_and_phone_width(page, driver, tmp_path_factory):
    shots = tmp_path_factory.mktemp("webui-screenshots")
    page.open("?temperature=0&max_tokens=30")
    page.send("## Shopping list\n- apples\n- pears\n- bread")
    page.wait_idle()
    want = chat_api(page.srv, ["## Shopping list\n- apples\n- pears\n- bread"], temperature=0, max_tokens=30)
    items = [li.text for li in page.replies()[-1].find_elements(By.CSS_SELECTOR, ".body li")]
    assert items and items == [line[2:] for line in want.splitlines() if line.startswith("- ")]
    for scheme in ("light", "dark"):
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia",
                               {"features": [{"name": "prefers-color-scheme", "value": scheme}]})
        pairs = colour_pairs(page)
        assert all(contrast(fg, bg) >= 4.5 for fg, bg in pairs.values()), (scheme, pairs)
        dark = page.js("return matchMedia('(prefers-color-scheme: dark)').matches")
        assert dark == (scheme == "dark")
        driver.save_screenshot(str(shots / f"desktop-{scheme}.png"))
    assert colour_pairs(page)["body"][1] != "rgb(255, 255, 255)"  # the dark scheme is not the light one
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": 390, "height": 844,
                                                                   "deviceScaleFactor": 2, "mobile": True})
    try:
        page.wait(lambda: page.js("return innerWidth") == 390)
        assert page.js("return document.documentElement.scrollWidth <= innerWidth")
        side = lambda: page.js("return document.getElementById('sidebar').getBoundingClientRect().right")  # noqa: E731
        page.wait(lambda: side() <= 0, 5)  # (the drawer slides away)
        assert page.d.find_element(By.ID, "input").is_displayed()
        page.d.find_element(By.ID, "menu").click()
        page.wait(lambda: side() > 200, 5)
        driver.save_screenshot(str(shots / "phone-drawer-dark.png"))
        page.d.find_element(By.CSS_SELECTOR, "#conversations li.active .title").click()
        page.wait(lambda: side() <= 0, 5)
        driver.save_screenshot(str(shots / "phone-dark.png"))
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
    print(f"screenshots: {shots}")


def test_regenerate_and_edit_the_last_message(page):
    page.open("?temperature=0&max_tokens=16")
    page.send("Name three animals.")
    page.wait_idle()
    first = page.conversation()["messages"][1]["content"]
    page.replies()[-1].find_element(By.CSS_SELECTOR, "[data-action=regenerate]").click()
    page.wait_idle()
    assert [m["content"] for m in page.conversation()["messages"]] == ["Name three animals.", first]
    page.d.find_element(By.CSS_SELECTOR, "article.user [data-action=edit]").click()
    box = page.d.find_element(By.ID, "input")
    assert box.get_attribute("value") == "Name three animals." and page.d.find_element(By.ID, "editing").is_displayed()
    box.clear()
    box.send_keys("Name three colors.", Keys.ENTER)
    page.wait(lambda: len(page.conversation()["messages"]) == 2 and page.conversation()["messages"][0]["content"]
              == "Name three colors.")
    page.wait_idle()
    want = chat_api(page.srv, ["Name three colors."], temperature=0, max_tokens=16)
    assert [m["content"] for m in page.conversation()["messages"]] == ["Name three colors.", want]
    assert not page.d.find_element(By.ID, "editing").is_displayed()


def test_settings_dialog_is_per_conversation(page):
    page.open("?temperature=0&max_tokens=8")
    page.d.find_element(By.ID, "open-settings").click()
    form = page.d.find_element(By.ID, "settings-form")
    field = lambda name: form.find_element(By.NAME, name)  # noqa: E731
    save = form.find_element(By.CSS_SELECTOR, "button[type=submit]")
    assert field("temperature").get_attribute("value") == "0" and field("max_tokens").get_attribute("value") == "8"
    field("system").send_keys("Answer in one word.")
    field("max_tokens").clear()
    field("max_tokens").send_keys("12")
    field("extra").send_keys('{"seed": 1, "stop": ["\\n"')
    save.click()
    assert page.d.find_element(By.ID, "settings-error").text.startswith("The other fields are not JSON")
    field("extra").send_keys("]}")
    save.click()
    page.wait(lambda: not page.d.find_element(By.ID, "settings").is_displayed(), 5)
    summary = lambda: page.d.find_element(By.ID, "settings-summary").text  # noqa: E731
    assert summary() == "temperature 0 · max_tokens 12 · +2"
    page.send("Name three animals.")
    page.wait_idle()
    want = chat_api(page.srv, ["Name three animals."], system="Answer in one word.", temperature=0, max_tokens=12,
                    seed=1, stop=["\n"])
    first = page.conversation()
    assert first["messages"][1]["content"] == want
    assert first["settings"] == {"model": None, "system": "Answer in one word.", "temperature": 0, "top_p": None,
                                 "max_tokens": 12, "extra": {"seed": 1, "stop": ["\n"]}}
    page.d.find_element(By.ID, "new").click()  # it starts with these settings; its own changes stay its own
    page.d.find_element(By.ID, "open-settings").click()
    assert field("system").get_attribute("value") == "Answer in one word."
    field("temperature").clear()
    field("temperature").send_keys("1")
    save.click()
    page.wait(lambda: summary() == "temperature 1 · max_tokens 12 · +2", 5)
    page.d.find_elements(By.CSS_SELECTOR, "#conversations .title")[1].click()
    assert summary() == "temperature 0 · max_tokens 12 · +2" and page.conversation()["id"] == first["id"]


def test_stop_aborts_the_engine_request(page):
    page.open("?temperature=0&max_tokens=4000&ignore_eos=true")
    aborted = metric(page.srv, "pyserve:request_aborted_total")
    page.send("Tell me a story.")
    page.wait(lambda: len(page.replies()[-1].find_element(By.CSS_SELECTOR, ".body").text) > 40)
    assert metric(page.srv, "pyserve:kv_blocks_used") > 0
    page.d.find_element(By.ID, "stop").click()
    page.wait_idle(10)
    page.wait(lambda: metric(page.srv, "pyserve:request_aborted_total") == aborted + 1
              and metric(page.srv, "pyserve:kv_blocks_used") == 0, 20)
    assert metric(page.srv, "pyserve:num_requests_running") == 0
    reply = page.conversation()["messages"][1]
    assert reply["stopped"] and len(reply["content"]) > 40 and "error" not in reply
    assert page.replies()[-1].find_element(By.CSS_SELECTOR, ".meta").text.endswith("· stopped")


def test_reload_keeps_the_conversation(page):
    page.open("?temperature=0&max_tokens=8")
    page.send("Name three animals.")
    page.wait_idle()
    before, texts = page.conversation(), [a.text for a in page.d.find_elements(By.CSS_SELECTOR, "article.msg")]
    page.d.refresh()
    page.wait(lambda: len(page.d.find_elements(By.CSS_SELECTOR, "article.msg")) == 2)
    assert [a.text for a in page.d.find_elements(By.CSS_SELECTOR, "article.msg")] == texts
    assert page.conversation() == before
    assert page.d.find_element(By.ID, "settings-summary").text == "temperature 0 · max_tokens 8"
    active = page.d.find_element(By.CSS_SELECTOR, "#conversations li.active .title").text
    assert active == "Name three animals."


def test_conversations_rename_switch_export_delete_import(page):
    page.open("?temperature=0&max_tokens=4")
    page.send("First")
    page.wait_idle()
    page.d.find_element(By.ID, "new").click()
    page.send("Second")
    page.wait_idle()
    titles = lambda: [li.text for li in page.d.find_elements(By.CSS_SELECTOR, "#conversations .title")]  # noqa: E731
    assert titles()[:2] == ["Second", "First"]
    page.d.find_element(By.CSS_SELECTOR, "#conversations li.active [data-action=rename]").click()
    field = page.d.find_element(By.CSS_SELECTOR, "#conversations input.rename")
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys("Renamed", Keys.ENTER)
    assert titles()[:2] == ["Renamed", "First"] and page.conversation()["title"] == "Renamed"
    page.d.find_elements(By.CSS_SELECTOR, "#conversations .title")[1].click()
    assert page.d.find_element(By.CSS_SELECTOR, "article.user").text.startswith("First")
    page.d.find_element(By.ID, "export").click()
    exported = page.wait(lambda: glob.glob(os.path.join(page.d.downloads, "pyserve-conversations-*.json")))
    data = json.load(open(exported[0], encoding="utf-8"))
    stored = json.loads(page.js("return localStorage.getItem('pyserve.conversations')"))
    assert data["format"] == "pyserve-conversations" and data["conversations"] == stored
    renamed = next(c for c in stored if c["title"] == "Renamed")
    delete = page.d.find_elements(By.CSS_SELECTOR, "#conversations li")[0].find_element(By.CSS_SELECTOR,
                                                                                         "[data-action=delete]")
    delete.click()
    assert delete.text == "Delete?" and titles()[0] == "Renamed"  # a second click deletes
    delete.click()
    assert "Renamed" not in titles()
    assert all(c["id"] != renamed["id"] for c in json.loads(page.js("return localStorage.getItem("
                                                                     "'pyserve.conversations')")))
    page.d.find_element(By.ID, "import").send_keys(exported[0])
    page.wait(lambda: titles()[0] == "Renamed")
    assert len(titles()) == len(stored) * 2 - 1  # every exported conversation, added again
    got = page.conversation()
    assert got["messages"] == renamed["messages"] and got["id"] != renamed["id"]
    assert page.d.find_element(By.CSS_SELECTOR, "article.user").text.startswith("Second")


def assert_no_injected_markup(page) -> None:
    found = page.js("return [...document.querySelectorAll('#messages *, #complete *')].filter((e) => "
                    "['SCRIPT', 'IMG', 'IFRAME', 'OBJECT', 'EMBED', 'SVG', 'STYLE', 'LINK'].includes(e.tagName) "
                    "|| [...e.attributes].some((a) => a.name.startsWith('on'))).map((e) => e.outerHTML)")
    assert found == []
    assert page.js("return window.__xss") is None


def test_xss_chat_reply_renders_as_text(page):
    want = chat_api(page.srv, [PAYLOAD], temperature=0, max_tokens=40)
    assert "<script>" in want and "onerror=" in want  # the model echoes the payload (temperature 0)
    page.open("?temperature=0&max_tokens=40")
    page.send(PAYLOAD)
    page.wait_idle()
    assert page.conversation()["messages"][1]["content"] == want
    body = page.replies()[-1].find_element(By.CSS_SELECTOR, ".body")
    assert PAYLOAD in body.text and body.get_property("textContent") == page.rendered_text(want)
    assert page.d.find_element(By.CSS_SELECTOR, "article.user .body").text == PAYLOAD
    assert_no_injected_markup(page)


def test_xss_crafted_markdown_renders_as_text(page):
    page.open("?max_tokens=8")
    cases = [PAYLOAD, f"# {PAYLOAD}", f"- {PAYLOAD}\n- `{PAYLOAD}`", f"```html\n{PAYLOAD}\n```",
             f"> {PAYLOAD}", f"| a | b |\n|---|---|\n| {PAYLOAD} | **{PAYLOAD}** |",
             "[click](javascript:window.__xss=3)", "[x](JaVaScRiPt:window.__xss=3)", "[x](data:text/html,hi)",
             f"![{PAYLOAD}](javascript:window.__xss=4)", "![pic](http://example.com/x.png)",
             f"[{PAYLOAD}](https://example.com/)", '<a href="javascript:window.__xss=5">a</a>',
             "<svg onload=window.__xss=6>", "<iframe src=javascript:window.__xss=7>"]
    out = page.js_async(
        "const m = await import('/webui/markdown.js'); const host = document.getElementById('messages');"
        "const res = []; for (const c of arguments[0]) { const div = document.createElement('div');"
        "div.append(m.render(c)); host.append(div);"  # in the live page: anything injected would load and run
        "res.push({text: div.textContent, tags: [...div.querySelectorAll('*')].map((e) => e.tagName),"
        "attrs: [...div.querySelectorAll('*')].flatMap((e) => [...e.attributes].map((a) => a.name)),"
        "hrefs: [...div.querySelectorAll('a')].map((a) => a.getAttribute('href'))}); }"
        "await new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0))); return res;", cases)
    allowed_tags = {"P", "BR", "STRONG", "EM", "DEL", "CODE", "PRE", "DIV", "SPAN", "BUTTON", "A", "UL", "OL", "LI",
                    "H1", "BLOCKQUOTE", "TABLE", "THEAD", "TBODY", "TR", "TH", "TD"}
    for case, r in zip(cases, out):
        assert set(r["tags"]) <= allowed_tags, (case, r)
        assert set(r["attrs"]) <= {"class", "type", "href", "target", "rel"}, (case, r)
        assert all(h.startswith("https://") for h in r["hrefs"]), (case, r)
        if PAYLOAD in case:
            assert PAYLOAD in r["text"], (case, r)
    assert out[9]["text"] == f"[image: {PAYLOAD}]" and out[10]["text"] == "[image: pic]"
    assert out[6]["text"] == "[click](javascript:window.__xss=3)"
    assert_no_injected_markup(page)


def test_markdown_features_and_copy(page, driver):
    """An imported conversation's reply goes through the same rendering as a streamed one."""
    reply = ("# Title\n\nSome **bold**, *italic* and `code`.\n\n1. one\n2. two\n   - nested\n\n"
             "```python\ndef add(a, b):\n    return a + b\n```\n\n| x | y |\n|---|---|\n| 1 | 2 |\n\n"
             "See [the docs](https://example.com/docs).")
    path = os.path.join(driver.downloads, "crafted.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"format": "pyserve-conversations", "version": 1, "conversations": [
            {"title": "Crafted", "messages": [{"role": "user", "content": "Show me Markdown"},
                                              {"role": "assistant", "content": reply}]}]}, f)
    page.open()
    page.d.find_element(By.ID, "import").send_keys(path)
    page.wait(lambda: page.d.find_element(By.CSS_SELECTOR, "#conversations li.active .title").text == "Crafted")
    md = page.replies()[-1].find_element(By.CSS_SELECTOR, ".body")
    q = lambda css: [e.text for e in md.find_elements(By.CSS_SELECTOR, css)]  # noqa: E731
    assert q("h1") == ["Title"] and q("strong") == ["bold"] and q("em") == ["italic"]
    assert q("p > code") == ["code"] and q("ol > li > ul > li") == ["nested"]
    assert q("ol > li")[0] == "one" and q(".code .lang") == ["python"]
    assert q("pre code") == ["def add(a, b):\n    return a + b"] and q("td") == ["1", "2"]
    link = md.find_element(By.CSS_SELECTOR, "a")
    assert link.get_attribute("href") == "https://example.com/docs"
    assert link.get_attribute("rel") == "noopener noreferrer"
    driver.execute_cdp_cmd("Browser.grantPermissions", {
        "origin": page.srv.url, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]})
    copy = md.find_element(By.CSS_SELECTOR, ".code button.copy")
    copy.click()
    page.wait(lambda: copy.text == "Copied", 5)
    assert page.js_async("return await navigator.clipboard.readText();") == "def add(a, b):\n    return a + b"


def test_xss_completion_mode_echo(page):
    prompt = "\n".join([PAYLOAD] * 4) + "\n"
    r = httpx.post(page.srv.url + "/v1/completions", timeout=60,
                   json={"model": page.srv.model, "prompt": prompt, "temperature": 0, "max_tokens": 40})
    want = r.json()["choices"][0]["text"]
    assert "<script>" in want  # echoed
    page.open("?mode=complete&temperature=0&max_tokens=40")
    doc = page.d.find_element(By.ID, "document")
    assert doc.is_displayed() and not page.d.find_element(By.ID, "messages").is_displayed()
    page.js("const d = document.getElementById('document'); d.value = arguments[0];"
            "d.dispatchEvent(new Event('input'));", prompt)
    doc.send_keys(Keys.CONTROL, Keys.ENTER)
    page.wait(lambda: page.d.find_element(By.ID, "complete-status").text.startswith("40 tokens"))
    assert doc.get_property("value") == prompt + want and page.conversation()["document"] == prompt + want
    assert_no_injected_markup(page)


def test_server_errors_are_shown(page):
    page.expected_statuses.add(400)
    page.open("?temperature=0&top_p=7")
    page.send("Hello")
    page.wait_idle()
    err = page.replies()[-1].find_element(By.CSS_SELECTOR, ".error span").text
    assert err.startswith("The server refused the request (400): ") and "top_p" in err, err
    assert page.conversation()["messages"][1]["error"]["status"] == 400
    page.expected_statuses.add(404)
    page.open("?model=no-such-model&max_tokens=4")
    option = page.d.find_element(By.CSS_SELECTOR, "#model option:checked")
    assert option.text == "no-such-model (not served)"
    page.send("Hello")
    page.wait_idle()
    err = page.replies()[-1].find_element(By.CSS_SELECTOR, ".error span").text
    assert err == "The server refused the request (404): The model `no-such-model` does not exist.", err
    described = page.js_async(
        "const api = await import('/webui/api.js'); return [api.describe(new api.ApiError(503, 'the model is "
        "still loading', {retryAfter: 5})), api.describe(new api.ApiError(429, 'Rate limit reached.', "
        "{retryAfter: 12.5}))];")
    assert described == ["The server is unavailable (503): the model is still loading. Try again in 5 s.",
                         "Too many requests (429): Rate limit reached. Try again in 13 s."]


def test_api_key_rate_limit_and_mid_stream_error(page):
    """A keyed server: the page asks for the key, keeps it, shows 401 and 429 in the conversation, and a
    stream the server ends with an error chunk (its shutdown drain) shows that error."""
    srv = ServerProcess("--api-key", "k1", "--api-key", "k2", "--rate-limit-rpm", "1", "--drain-timeout", "1",
                        threads=1).wait_ready()
    try:
        page.origins.add(srv.url)
        page.expected_statuses.update({401, 429})
        assert httpx.get(srv.url + "/").status_code == 200 and httpx.get(srv.url + "/webui/app.js").status_code == 200
        assert httpx.get(srv.url + "/v1/models").status_code == 401
        page.d.get(srv.url + "/?temperature=0&max_tokens=8")
        reason = lambda: page.d.find_element(By.ID, "key-reason").text  # noqa: E731
        page.wait(lambda: page.d.find_element(By.ID, "key-dialog").is_displayed())
        assert reason() == "This server needs an API key."
        key = page.d.find_element(By.CSS_SELECTOR, "#key-form input[name=key]")
        key.send_keys("wrong", Keys.ENTER)
        page.wait(lambda: "refused" in reason())
        key.clear()
        key.send_keys("k1", Keys.ENTER)
        page.wait(lambda: page.d.find_elements(By.CSS_SELECTOR, "#model option"))
        assert not page.d.find_element(By.ID, "key-dialog").is_displayed()
        page.open(url=srv.url)  # a reload: the key is kept
        assert page.js("return localStorage.getItem('pyserve.apiKey')") == "k1"
        assert not page.d.find_element(By.ID, "key-dialog").is_displayed()
        page.send("Hello")
        page.wait_idle()
        assert page.conversation()["messages"][1]["content"] and "error" not in page.conversation()["messages"][1]
        page.send("Hello again")  # the second request of k1 in a minute
        page.wait_idle()
        err = page.replies()[-1].find_element(By.CSS_SELECTOR, ".error span").text
        assert re.match(r"Too many requests \(429\): Rate limit reached: 1 requests per minute.* Try again in \d+ s\.",
                        err), err
        page.js("localStorage.setItem('pyserve.apiKey', 'revoked')")
        page.send("Hello once more")
        page.wait_idle()
        err = page.replies()[-1].find_element(By.CSS_SELECTOR, ".error")
        assert err.text.startswith("The server needs a valid API key (401): Incorrect API key provided.")
        err.find_element(By.CSS_SELECTOR, "[data-action=key]").click()
        key = page.d.find_element(By.CSS_SELECTOR, "#key-form input[name=key]")  # (the page was reloaded)
        key.clear()
        key.send_keys("k2", Keys.ENTER)
        page.wait(lambda: not page.d.find_element(By.ID, "key-dialog").is_displayed())
        page.open("?temperature=0&max_tokens=4000&ignore_eos=true", url=srv.url)
        page.send("Tell me a story.")
        page.wait(lambda: len(page.replies()[-1].find_element(By.CSS_SELECTOR, ".body").text) > 20)
        srv.proc.send_signal(signal.SIGTERM)  # drain: the stream ends with an error chunk after 1 s
        page.wait_idle(20)
        err = page.replies()[-1].find_element(By.CSS_SELECTOR, ".error span").text
        assert err.startswith("The server stopped the reply with an error: server shutting down"), err
        reply = page.conversation()["messages"][1]
        assert len(reply["content"]) > 20 and reply["error"]["status"] == 0
        assert srv.proc.wait(30) == 0  # the drain ended (a second signal now would not be a clean stop)
    finally:
        assert srv.stop() == 0, "".join(srv.stderr)
