"""The README's pictures of the viewer: headless Chromium on a training step's dump and on
``compare-xla`` of the MLP anchor. Needs Debian's chromium + chromium-driver and selenium.

    .venv/bin/python examples/viewer_screenshot.py      # writes docs/viewer.png, docs/compare_xla.png
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    from examples.transformer_train_step import main as make_dump
    from runtime.cli import main as hlotk
    from tests.browser import chromium, wait_ready
    from tests.paths import ANCHORS
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import Select
    tmp = Path(tempfile.mkdtemp(prefix="hlotk-shots-"))
    make_dump(["--out", str(tmp / "dump")])
    suite = tmp / "suite.py"
    suite.write_text("import jax\n\ndef _mlp(x, w1, w2):\n    return jax.nn.gelu(x @ w1) @ w2\n")
    hlotk(["compare-xla", f"{suite}:_mlp", "--args", "bf16[4096,4096]", "bf16[4096,16384]",
           "bf16[16384,4096]", "--xla-dump", str(ANCHORS / "xla_mlp_bf16.hlo.txt"), "--target",
           "h200", "--html", str(tmp / "cmp.html"), "--no-open"])
    with chromium() as d:
        d.get((tmp / "dump" / "viewer.html").as_uri())
        wait_ready(d)
        sel = Select(d.find_element("id", "view"))
        sel.select_by_visible_text(next(o.text for o in sel.options if ". fusion:" in o.text))
        d.find_element("id", "search").send_keys("fusion.31")
        time.sleep(0.5)
        d.find_element("css selector", '#results .hit[data-name="fusion.31"][data-side="R"]').click()
        time.sleep(0.3)
        tg = d.find_element("css selector", '#pane-R .tg[data-name="fusion.31"]')
        ActionChains(d).move_to_element(tg).click().perform()
        time.sleep(0.5)
        d.find_element("id", "membtn").click()
        time.sleep(0.5)
        d.save_screenshot(str(ROOT / "docs" / "viewer.png"))
        d.get((tmp / "cmp.html").as_uri())
        wait_ready(d)
        d.find_element("css selector", '#pane-L .node[data-name="loop_multiply_fusion"] .nb').click()
        time.sleep(0.3)
        d.save_screenshot(str(ROOT / "docs" / "compare_xla.png"))
    print("wrote docs/viewer.png, docs/compare_xla.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
