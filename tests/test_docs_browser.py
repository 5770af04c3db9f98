"""The built documentation reads well in a real browser.

Every HTML page of the site is opened from disk (``file://``, as an offline
reader opens a local build) in headless Chromium through selenium, with every
network host unresolvable, at a desktop, a laptop and a phone width. A page
fails, naming the page and the element, if

* it scrolls horizontally as a whole;
* a code block, table, equation, image, inline literal or signature of the
  text is cut off: its content is wider than its box and the box has no
  scroll bar, or it sticks out of an ancestor that clips it, out of the text
  column or out of the window, with no scrolling box in between;
* math was not typeset: raw TeX (``\\(``, ``\\[``, ``$$``, ``\\frac`` ...)
  still visible outside code once MathJax has finished, a ``.math`` element
  MathJax left alone, a MathJax error;
* a web font or an image failed to load, or the browser asked the network
  for anything (a CDN script, a remote font).

It skips, saying why, only when selenium, Chromium or chromedriver is missing
(``.ci/run`` installs Debian's ``chromium`` and ``chromium-driver``). A
screenshot of every page at every width is saved, the whole page, under the
test's temporary folder (the path is printed); set
``LAYERNORM_C_DOCS_SCREENSHOTS`` to a folder to keep them there instead.
(Full-page screenshots do not paint scroll bars; the window does.)
"""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from docs_support import built_pages, sphinx_build

# (name, CSS width, height, mobile): a desktop, a laptop or tablet, a phone.
WIDTHS = [
    ("desktop", 1280, 900, False),
    ("laptop", 800, 900, False),
    ("phone", 375, 740, True),
]

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMEDRIVER_PATHS = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")

# Raw TeX that must not survive typesetting in the visible text outside code.
RAW_TEX = re.compile(r"\\[()\[\]]|\$\$|\\begin\{|\\end\{|\\[A-Za-z]{2,}")

# Boxes whose content must never be cut off.
BOXES = ("pre, table, div.highlight, .math, mjx-container, img, figure, "
         "code, dt, .admonition")

# Runs in the page: every box that is cut off, and why.
FIND_CUT_OFF = r"""
const selector = arguments[0];
const style = (el) => getComputedStyle(el);
const scrolls = (el) => ['auto', 'scroll'].includes(style(el).overflowX);
// overflow acts only on boxes that are not plain inline (span.math is inline)
const clips = (el) => style(el).overflowX !== 'visible' &&
                      !['inline', 'contents'].includes(style(el).display);
const name = (el) => {
  let s = el.tagName.toLowerCase();
  if (el.id) s += '#' + el.id;
  if (typeof el.className === 'string' && el.className.trim())
    s += '.' + el.className.trim().split(/\s+/).slice(0, 3).join('.');
  const text = (el.innerText || el.getAttribute('src') || '').trim().replace(/\s+/g, ' ');
  return s + (text ? ' "' + text.slice(0, 50) + '"' : '');
};
const px = (x) => Math.round(x);
// the text column: the innermost of these that the page has
const column = ['article', '[role="main"]', 'main', 'body']
  .map((s) => document.querySelector(s)).find((e) => e);
const vw = document.documentElement.clientWidth;
// MathJax's copy of each formula for screen readers is invisible by design
// but counts in scrollWidth: leave it out while measuring.
const assistive = [...document.querySelectorAll('mjx-assistive-mml')];
assistive.forEach((e) => e.style.setProperty('display', 'none', 'important'));
const problems = [];
for (const el of column.querySelectorAll(selector)) {
  if (!el.checkVisibility()) continue;
  const r = el.getBoundingClientRect();
  if (r.width === 0 || r.height === 0) continue;
  // 1. content wider than a box that clips it and has no scroll bar
  if (clips(el) && !scrolls(el) && el.scrollWidth > el.clientWidth + 1) {
    problems.push(`${name(el)}: content ${el.scrollWidth}px wide in a ` +
                  `${el.clientWidth}px box without a scroll bar ` +
                  `(overflow-x: ${style(el).overflowX})`);
    continue;
  }
  // 2. what is visible of the box (with any content spilling out of it)
  //    sticks out of an ancestor that clips it, of the text column or of
  //    the window; a scrolling ancestor shows only its own box
  let left = r.left;
  let right = scrolls(el) ? r.right
            : Math.max(r.right, r.left + el.clientLeft + el.scrollWidth);
  for (let a = el.parentElement; a && a !== document.documentElement; a = a.parentElement) {
    const ar = a.getBoundingClientRect();
    const out = right > ar.right + 1 || left < ar.left - 1;
    if (scrolls(a)) {
      left = Math.max(left, ar.left);
      right = Math.min(right, ar.right);
    } else if (clips(a) && out) {
      problems.push(`${name(el)}: ${px(left)}..${px(right)}px, cut off by ` +
                    `${name(a).slice(0, 60)} (${px(ar.left)}..${px(ar.right)}px, ` +
                    `overflow-x: ${style(a).overflowX})`);
      break;
    } else if (a === column && out) {
      problems.push(`${name(el)}: ${px(left)}..${px(right)}px sticks out of the ` +
                    `text column (${px(ar.left)}..${px(ar.right)}px)`);
      break;
    }
    if (a === document.body && (right > vw + 1 || left < -1)) {
      problems.push(`${name(el)}: ${px(left)}..${px(right)}px goes past the ` +
                    `window (0..${vw}px)`);
    }
  }
}
assistive.forEach((e) => e.style.removeProperty('display'));
return problems;
"""

# Runs in the page: waits for MathJax (if the page loads it), then the fonts.
WAIT_FOR_TYPESETTING = r"""
const done = arguments[arguments.length - 1];
const t0 = Date.now();
const fonts = () => document.fonts.ready.then(() => done('ok'), () => done('ok'));
if (!document.querySelector('.math')) { fonts(); return; }
(function poll() {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    MathJax.startup.promise.then(fonts, (e) => done('MathJax failed: ' + e));
  } else if (Date.now() - t0 > 10000) {
    done('MathJax never started (no MathJax script, or it did not load)');
  } else {
    setTimeout(poll, 25);
  }
})();
"""

# Runs in the page: the visible text outside code, math MathJax missed, and
# fonts or images that failed to load.
PAGE_STATE = r"""
const skip = 'pre, code, kbd, samp, script, style, textarea, mjx-assistive-mml, .highlight';
const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
const parts = [];
for (let n = walker.nextNode(); n; n = walker.nextNode()) {
  const p = n.parentElement;
  if (!p || p.closest(skip) || !p.checkVisibility({visibilityProperty: true})) continue;
  parts.push(n.data);
}
const short = (s) => s.trim().replace(/\s+/g, ' ').slice(0, 80);
return {
  text: parts.join(''),
  untypeset: [...document.querySelectorAll('span.math, div.math')]
               .filter((m) => !m.querySelector('mjx-container'))
               .map((m) => short(m.textContent)),
  errors: [...document.querySelectorAll('mjx-merror')].map((m) => short(m.textContent)),
  fonts: [...document.fonts].filter((f) => f.status === 'error')
           .map((f) => `${f.family} ${f.style} ${f.weight}`),
  images: [...document.images].filter((i) => !i.complete || i.naturalWidth === 0)
            .map((i) => i.getAttribute('src')),
};
"""


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def _chromedriver() -> str | None:
    found = shutil.which("chromedriver")
    return found or next((p for p in CHROMEDRIVER_PATHS if os.access(p, os.X_OK)), None)


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium driven by the system's chromedriver, offline."""
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
    chromium, driver = _chromium(), _chromedriver()
    if chromium is None or driver is None:
        pytest.skip("Chromium and chromedriver are not both installed "
                    "(Debian: apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--disable-gpu", "--force-device-scale-factor=1", "--lang=en-US",
                "--no-first-run", "--no-default-browser-check",
                "--disable-background-networking",
                # offline: no host resolves, so a CDN cannot rescue a page
                "--host-resolver-rules=MAP * ~NOTFOUND"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    try:
        drv = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    except Exception as exc:  # installed but broken: a failure, not a skip
        pytest.fail(f"could not start {chromium} through {driver}: {exc}")
    drv.set_script_timeout(30)
    drv.set_page_load_timeout(60)
    try:
        yield drv
    finally:
        drv.quit()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The HTML site, built once for the module."""
    out = tmp_path_factory.mktemp("docs_browser") / "html"
    proc = sphinx_build("html", out)
    assert proc.returncode == 0, (
        f"sphinx html build failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return out


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = os.environ.get("LAYERNORM_C_DOCS_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("docs_screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _requests(drv) -> list[str]:
    """The URLs the browser asked for since the last call."""
    urls = []
    for entry in drv.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def _screenshot(drv, path: Path) -> None:
    """The whole page, not only the window."""
    width, height = drv.execute_script(
        "const e = document.scrollingElement;"
        "return [e.scrollWidth, Math.min(e.scrollHeight, 16000)];")
    png = drv.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
    })["data"]
    path.write_bytes(base64.b64decode(png))


def _check_page(drv, page: Path, width: int, height: int, mobile: bool,
                shot: Path) -> list[str]:
    drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile})
    _requests(drv)  # forget the previous page's requests
    drv.get(page.as_uri())
    state = drv.execute_async_script(WAIT_FOR_TYPESETTING)
    problems = [] if state == "ok" else [state]

    scroll_width, client_width = drv.execute_script(
        "const e = document.scrollingElement; return [e.scrollWidth, e.clientWidth];")
    if scroll_width > client_width:
        problems.append(f"the page scrolls horizontally: {scroll_width}px of content "
                        f"in a {client_width}px window")
    problems += drv.execute_script(FIND_CUT_OFF, BOXES)

    state = drv.execute_script(PAGE_STATE)
    raw = RAW_TEX.search(state["text"])
    if raw:
        around = state["text"][max(0, raw.start() - 40):raw.end() + 40]
        problems.append(f"raw TeX {raw.group()!r} visible: ...{' '.join(around.split())}...")
    problems += [f"math not typeset: {t!r}" for t in state["untypeset"][:3]]
    problems += [f"MathJax error: {t!r}" for t in state["errors"][:3]]
    problems += [f"font failed to load: {f}" for f in state["fonts"][:3]]
    problems += [f"image failed to load: {i}" for i in state["images"][:3]]
    remote = [u for u in _requests(drv)
              if not u.startswith(("file:", "data:", "blob:", "about:"))]
    problems += [f"asked the network for {u}" for u in remote[:3]]

    _screenshot(drv, shot)
    return problems


@pytest.mark.parametrize("label,width,height,mobile", WIDTHS,
                         ids=[f"{w[0]}-{w[1]}px" for w in WIDTHS])
def test_pages_read_well(browser, site, shots, label, width, height, mobile):
    pages = built_pages(site)
    assert {"index.html", "math.html", "validating.html", "benchmarks.html"} <= {
        p.name for p in pages}, pages
    failures = []
    for page in pages:
        rel = page.relative_to(site).as_posix()
        shot = shots / f"{rel[:-len('.html')].replace('/', '_')}-{width}px.png"
        failures += [f"{rel} at {width}px: {problem}"
                     for problem in _check_page(browser, page, width, height, mobile, shot)]
    print(f"screenshots of {len(pages)} pages at {width}px: {shots}")
    assert not failures, "\n".join(failures)
