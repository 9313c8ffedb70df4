"""Screenshots of the built docs site in headless Chromium, and what overflows its column there.

    python scripts/screenshot-docs.py                       # builds the site into /tmp, shoots the default pages
    python scripts/screenshot-docs.py --site site --out /tmp/shots --widths 1280 1400 --pages index reference/config

For each page and window width it writes ``PAGE-WIDTH.png`` (the top ``--height`` pixels) and prints one line per
table or code block whose content is wider than the box it sits in (measured by the browser: ``scrollWidth`` against
``clientWidth``), with the widths in px. Needs a Chromium binary (``chromium``, Debian's package, driven headless);
nothing is downloaded: the site is read from disk (``file://``), so the theme's web fonts fall back to local ones.
The default suite checks widths without a browser (tests/test_docs_widths.py); this is the check by eye.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = ("index", "reference/config", "troubleshooting", "integrations/trinity", "integrations/verl",
         "integrations/trl", "when-does-divopd-help")

#: appended to each page: lists every table / code block wider than its box in a <pre id="overflow-report">
MEASURE = """
<script>
window.addEventListener("load", () => {
  const rows = [];
  const article = document.querySelector("article.md-content__inner");
  // material's table is itself display:inline-block with overflow:auto and max-width:100%, so a wide table scrolls
  // inside the <table> (its wrapper then measures no overflow): measure the table, its wrapper, and each code block
  for (const el of document.querySelectorAll("article .md-typeset__scrollwrap, article table, article pre > code")) {
    if (el.scrollWidth > el.clientWidth + 1) {
      const what = el.tagName === "CODE" ? "code" : el.tagName === "TABLE" ? "table" : "table wrapper";
      const text = (el.innerText || "").trim().split("\\n")[0].slice(0, 70);
      rows.push({what, need: el.scrollWidth, box: el.clientWidth, text});
    }
  }
  const out = document.createElement("pre");
  out.id = "overflow-report";
  out.textContent = JSON.stringify({column: article ? article.clientWidth : null, rows});
  document.body.appendChild(out);
});
</script>
"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return name
    sys.exit("screenshot-docs: no chromium on PATH (Debian: apt-get install chromium)")


def build(site: Path) -> None:
    subprocess.run([sys.executable, "docs/gen_reference.py"], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)], cwd=REPO, check=True,
                   env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})


def shoot(browser: str, page: Path, png: Path, width: int, height: int) -> dict:
    measured = page.with_name("index.measure.html")
    measured.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={width},{height}"]
    subprocess.run([browser, *flags, f"--screenshot={png}", page.as_uri()], check=True, capture_output=True,
                   timeout=120)
    dom = subprocess.run([browser, *flags, "--virtual-time-budget=3000", "--dump-dom", measured.as_uri()],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    measured.unlink()
    report = dom.split('<pre id="overflow-report">', 1)[-1].split("</pre>", 1)[0]
    return json.loads(report.replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, help="a built site (default: build one into a temporary folder)")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "divopd-shots")
    parser.add_argument("--widths", type=int, nargs="+", default=[1280, 1400])
    parser.add_argument("--height", type=int, default=1600)
    parser.add_argument("--pages", nargs="+", default=list(PAGES), help="page paths without .md; 'all': every page")
    args = parser.parse_args()
    browser = chromium()
    site = args.site or Path(tempfile.mkdtemp(prefix="divopd-site-"))
    if args.site is None:
        build(site)
    args.out.mkdir(parents=True, exist_ok=True)
    wide = 0
    if args.pages == ["all"]:
        args.pages = sorted(str(p.parent.relative_to(site)) for p in site.rglob("*/index.html")
                            if p.parent.name not in ("search", "assets")) + ["index"]
    for name in args.pages:
        html = site / ("index.html" if name == "index" else f"{name}/index.html")
        if not html.is_file():
            print(f"{name}: not in the site ({html})")
            continue
        for width in args.widths:
            png = args.out / f"{name.replace('/', '_')}-{width}.png"
            report = shoot(browser, html, png, width, args.height)
            print(f"{name} @ {width}px: column {report['column']} px, {len(report['rows'])} too wide  -> {png}")
            for row in report["rows"]:
                wide += 1
                print(f"    {row['what']}: needs {row['need']} px in {row['box']} px: {row['text']}")
    return 1 if wide else 0


if __name__ == "__main__":
    sys.exit(main())
