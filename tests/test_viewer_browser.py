"""The viewer in a real browser: headless Chromium opens the ``--dump`` of a transformer
training step, searches, expands a fusion, clicks nodes and buffers, and reads the panel.
Expected texts come from the modules on the Python side. Skipped (with the reason) where
no Chromium/chromedriver/selenium is installed; ``make test`` installs them as root."""
from __future__ import annotations

import json
import os
import re

import pytest

import hlo
from hlo.diff import diff_modules
from hlo.graph import source_location
from passes.fusion.cost_model import predict

from tests.browser import browser_or_skip_reason, chromium, wait_ready

pytestmark = pytest.mark.skipif(browser_or_skip_reason() is not None,
                                reason=str(browser_or_skip_reason()))


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    """The dump of a 1-layer transformer training step, profiled (measured µs)."""
    from examples.transformer_train_step import main
    out = tmp_path_factory.mktemp("train_step") / "dump"
    assert main(["--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


def _by(driver, css, timeout: float = 10.0):
    """The element, once it exists (the page renders search results after a short pause)."""
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, timeout).until(lambda d: d.find_element("css selector", css))


def _click(driver, css):
    """Click through a real mouse event at the element (SVG <g> included)."""
    from selenium.webdriver.common.action_chains import ActionChains
    el = _by(driver, css)
    ActionChains(driver).move_to_element(el).click().perform()


def _find(driver, name: str, side: str = "L") -> None:
    """Search for an instruction and click its result (the graph reveals and centres it)."""
    box = _by(driver, "#search")
    box.clear()
    box.send_keys(name)
    _click(driver, f'#results .hit[data-name="{name}"][data-side="{side}"]')


def _choose(driver, label_start: str) -> None:
    from selenium.webdriver.support.ui import Select
    sel = Select(_by(driver, "#view"))
    sel.select_by_visible_text(next(o.text for o in sel.options if o.text.startswith(label_start)))


def _panel(driver) -> str:
    return _by(driver, "#panel").text


def _final(dump):
    return hlo.parse_hlo((dump / "99.final.hlo.txt").read_text())


def test_search_expand_and_click_in_a_training_step(dump, browser):
    final = _final(dump)
    profile_page = (dump / "viewer.html").as_uri()
    browser.get(profile_page)
    timing = wait_ready(browser)
    print(f"\ntraining-step dump: first paint {timing['first_paint_ms']:.0f} ms")
    last = sorted(p.name for p in dump.glob("*.after.hlo.txt"))[-1][:2]
    _choose(browser, f"{last} after")
    # a fusion the fusion pass made from several instructions, and one instruction in it
    fusion = next(i for i in final.entry.instructions if i.opcode == "fusion" and
                  sum(b.opcode != "parameter" for b in i.attrs["calls"].instructions) >= 3)
    body = fusion.attrs["calls"]
    inner = next(i for i in body.instructions if i.opcode not in ("parameter", "constant")
                 and i.metadata.get("op_name"))

    _find(browser, fusion.name)
    panel = _panel(browser)
    assert _by(browser, "#p-name").text == f"%{fusion.name}"
    assert _by(browser, "#p-hlo").text == fusion.to_text().strip()
    assert f"{fusion.shape.to_text()}" in panel
    assert _by(browser, "#p-source").text == source_location(fusion)
    assert _by(browser, "#p-pred").text == f"{round(predict(fusion, 'h100').time_us, 3):g} µs"
    assert _by(browser, "#p-measured").text.endswith(" µs")       # from the profiled run
    decisions = _by(browser, "#p-fusion").text
    assert "fused into this kernel" in decisions and "fused (merge)" in decisions or \
        "fused (duplicate)" in decisions
    # the search highlights matches in the graph
    assert browser.execute_script(
        "return document.querySelectorAll('#pane-L .node.hit').length") >= 1

    # expand the fusion: its body's instructions are drawn; click one
    assert not browser.find_elements("css selector", f'#pane-L .node[data-name="{inner.name}"]')
    _click(browser, f'#pane-L .tg[data-name="{fusion.name}"]')
    _click(browser, f'#pane-L .node[data-name="{inner.name}"] > .nb')
    assert _by(browser, "#p-name").text == f"%{inner.name}"
    assert _by(browser, "#p-hlo").text == inner.to_text().strip()
    assert _by(browser, "#p-source").text == source_location(inner)
    assert re.search(rf"inside\s+%{re.escape(fusion.name)}\n", _panel(browser))
    # and collapse it again
    _click(browser, f'#pane-L .tg[data-name="{fusion.name}"]')
    assert not browser.find_elements("css selector", f'#pane-L .node[data-name="{inner.name}"]')


def test_before_after_keeps_the_selection_and_marks_changes(dump, browser):
    browser.get((dump / "viewer.html").as_uri())
    wait_ready(browser)
    n = next(p.name[:2] for p in sorted(dump.glob("*.fusion.after.hlo.txt")))
    before = hlo.parse_hlo((dump / f"{n}.fusion.before.hlo.txt").read_text())
    after = hlo.parse_hlo((dump / f"{n}.fusion.after.hlo.txt").read_text())
    d = diff_modules(before, after)
    _choose(browser, f"{n}. fusion: before | after")
    marks = browser.execute_script("""return ['L', 'R'].map(s => {
        const out = {}; document.querySelectorAll('#pane-' + s + ' .node').forEach(e => {
          for (const m of ['added', 'removed', 'changed']) if (e.classList.contains(m)) out[e.dataset.name] = m; });
        return out; })""")
    entry_b = {i.name for i in before.entry.instructions}
    entry_a = {i.name for i in after.entry.instructions}
    assert {k for k, v in marks[0].items() if v == "removed"} == set(d.removed) & entry_b
    assert {k for k, v in marks[1].items() if v == "added"} == set(d.added) & entry_a
    # an instruction on both sides: selected on the left, selected on the right too
    kept = next(i.name for i in after.entry.instructions
                if i.name in entry_b and i.opcode == "parameter")
    _find(browser, kept)
    _click(browser, f'#pane-L .node[data-name="{kept}"] > .nb')
    assert browser.execute_script(
        "return [...document.querySelectorAll('#pane-R .node.sel')].map(e => e.dataset.name)") == [kept]
    # a fusion on the right: the left selects the instruction it was made around (its
    # root's namesake)
    fusion = next(i for i in after.entry.instructions if i.opcode == "fusion"
                  and i.attrs["calls"].root.name in entry_b)
    _find(browser, fusion.name, side="R")
    assert browser.execute_script(
        "return [...document.querySelectorAll('#pane-L .node.sel')].map(e => e.dataset.name)") == \
        [fusion.attrs["calls"].root.name]
    # one the fusion took out of the entry: marked removed on the left; on the right it is
    # inside the fusion that computes it now, which opens to show it selected
    everywhere_after = {i.name for i in after.all_instructions()}
    moved = next(i.name for i in before.entry.instructions
                 if i.name in d.removed and i.name in everywhere_after)
    _find(browser, moved)
    assert re.search(r"diff\s+removed\n", _panel(browser))
    assert browser.execute_script(
        "return [...document.querySelectorAll('#pane-R .node.sel')].map(e => e.dataset.name)") == [moved]
    assert _by(browser, "#p-other").text == next(
        i for i in after.all_instructions() if i.name == moved).to_text().strip()


def test_memory_timeline_click_shows_the_producer(dump, browser):
    browser.get((dump / "viewer.html").as_uri())
    wait_ready(browser)
    _click(browser, "#membtn")
    rects = browser.find_elements("css selector", "#mem .buf")
    assert rects
    # the biggest buffer: click it, the graph selects the instruction that produced it
    k = max(range(len(rects)), key=lambda i: float(rects[i].get_attribute("height")) *
            float(rects[i].get_attribute("width")))
    producer = rects[k].get_attribute("data-producer")
    _click(browser, f'#mem .buf[data-i="{k}"]')
    assert _by(browser, "#p-name").text == f"%{producer}"
    assert f"produced by %{producer}" in _by(browser, "#p-buffer").text
    assert browser.execute_script(
        "return [...document.querySelectorAll('#pane-L .node.sel')].map(e => e.dataset.name)") == [producer]
    final = _final(dump)
    assert final.entry.get(producer) is not None or any(
        producer in {i.name for i in c.instructions} for c in final.computations)


def test_first_paint_at_five_thousand_instructions(browser, tmp_path):
    """Measured and printed (benchmarks/NOTES.md has the numbers), not asserted."""
    import jax
    from examples.transformer_train_step import make_args, train_step
    from runtime.viewer import viewer_for_module, write_viewer
    args = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                  make_args(layers=14))
    module = hlo.from_jax(train_step, *args)
    n = sum(len(c.instructions) for c in module.computations)
    assert n >= 5000
    page = write_viewer(viewer_for_module(module), tmp_path / "big.html")
    browser.get(page.as_uri())
    timing = wait_ready(browser, timeout=120)
    print(f"\n{n} instructions: first paint {timing['first_paint_ms']:.0f} ms "
          f"(layout+render {timing['layout_and_render_ms']:.0f} ms)")
    out = os.environ.get("HLOTK_VIEWER_TIMING")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps({"instructions": n, **timing}) + "\n")
    # the page works at that size: a search finds the 14 layers' softmax reductions
    _by(browser, "#search").send_keys("reduce_max")
    from selenium.webdriver.support.ui import WebDriverWait
    WebDriverWait(browser, 10).until(lambda d: d.execute_script(
        "return document.querySelectorAll('#results .hit').length") >= 14)
