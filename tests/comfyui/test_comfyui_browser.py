"""The status panel in a real browser: headless Chromium opens the page of the running ComfyUI
(with the pack loaded) while a prompt runs, opens the "DiT Parallel" sidebar tab, and reads from
the DOM the pool's devices, each rank's state and step progress (live: the steps advance). The
panel covers none of ComfyUI's canvas widgets. A screenshot is kept in the artifacts folder."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from browser import missing_browser, start_chromium
from comfy_client import ComfyClient
from conftest import artifacts_dir
from test_comfyui_server import SMOKE, node_of, smoke_prompt

pytestmark = pytest.mark.timeout(2400)  # the session fixtures may build ComfyUI's venv first (minutes)

BROWSER_STEPS = 10000  # the most the sampler accepts: the prompt outlives the page load; it is cancelled
TAB_BUTTON = ".dit-parallel-tab-button"
READ_PANEL = """
const panel = document.querySelector('#dit-parallel-status');
if (!panel || !panel.getClientRects().length) return null;
const box = (e) => { if (!e) return null; const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
return {
  text: panel.innerText,
  box: box(panel),
  pools: [...panel.querySelectorAll('.dit-parallel-pool')].map((p) => ({
    pool: p.dataset.pool,
    text: p.innerText,
    job: p.querySelector('.dit-parallel-job')?.innerText,
    ranks: [...p.querySelectorAll('.dit-parallel-rank')].map((r) => ({...r.dataset})),
  })),
  covered: [...document.querySelectorAll(arguments[0])].map(box).filter(Boolean),
};
"""
CANVAS_WIDGETS = ".minimap-main-container, .graph-canvas-panel, .p-buttongroup-vertical, .execution-actions"


def read_panel(driver) -> dict[str, Any] | None:
    return driver.execute_script(READ_PANEL, CANVAS_WIDGETS)


def stepping(panel: dict[str, Any] | None) -> dict[int, int] | None:
    """rank -> step when the one pool shows a step and the memory of both of its ranks."""
    if not panel or len(panel["pools"]) != 1:
        return None
    ranks = panel["pools"][0]["ranks"]
    if len(ranks) != 2 or not all("step" in r and r.get("memory") for r in ranks):
        return None
    return {int(r["rank"]): int(r["step"]) for r in ranks}


def wait_for(driver, condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = read_panel(driver)
        value = condition(last)
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; the panel shows:\n{last}")


def overlaps(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_status_panel_follows_a_running_prompt(comfy_server, object_info, tmp_path):
    problem = missing_browser()
    if problem:
        pytest.fail(problem)
    prompt = smoke_prompt(object_info, steps=BROWSER_STEPS, size=64)
    sampler = node_of(prompt, "DiTParallelSampler")
    with ComfyClient(comfy_server.url) as client:
        prompt_id = client.queue(prompt)
        driver = start_chromium(tmp_path / "chromium-profile", artifacts_dir() / "chromedriver.log")
        try:
            driver.get(comfy_server.url)
            deadline = time.monotonic() + 180
            while not driver.execute_script("return !!document.querySelector(arguments[0])", TAB_BUTTON):
                assert time.monotonic() < deadline, "the DiT Parallel sidebar tab did not appear"
                time.sleep(0.25)
            # the shipped workflow on the canvas (as if dragged in), for the screenshot
            driver.execute_script("return window.app.loadGraphData(arguments[0])", json.loads(SMOKE.read_text()))
            driver.execute_script("document.querySelector(arguments[0]).click()", TAB_BUTTON)
            first = wait_for(driver, stepping, 240, "both ranks to show their step and memory")
            panel = read_panel(driver)
            (pool,) = panel["pools"]
            assert "tiny-flux (flux)" in pool["text"]
            assert "on cpu, cpu" in pool["text"], "the pool's devices"
            assert pool["job"] == "sampling"
            assert [(r["rank"], r["device"]) for r in pool["ranks"]] == [("0", "cpu"), ("1", "cpu")]
            assert all(r["state"] == "sampling" and r["total"] == str(BROWSER_STEPS) for r in pool["ranks"])
            assert all(r["memory"].startswith("RAM ") for r in pool["ranks"]), "each CPU rank's memory"
            for widget in panel["covered"]:
                assert not overlaps(panel["box"], widget), f"the panel {panel['box']} covers a canvas widget {widget}"
            driver.save_screenshot(str(artifacts_dir() / "comfyui-status-panel.png"))
            later = wait_for(
                driver, lambda p: (s := stepping(p)) and all(s[r] > first[r] for r in s) and s, 60, "steps to advance"
            )
            assert all(later[r] > first[r] for r in later)
        finally:
            client.post("/interrupt")
            driver.quit()
        run = client.follow(prompt_id, timeout=120)
        assert run.outcome == "execution_interrupted", run.messages[-5:]
        assert max(run.progress(sampler)) < BROWSER_STEPS


SHAPES = SMOKE.with_name("tiny_flux_shapes_cpu.json")


def test_an_ordinary_run_of_the_shipped_shapes_workflow_for_the_readme(comfy_server, tmp_path):
    """The page's own queue runs workflows/tiny_flux_shapes_cpu.json as saved (the trained tiny model, Ulysses 2
    on two CPU ranks); when it is done the panel shows that pool and the finished job, and the page is kept as
    test-artifacts/status-panel.png (the README's docs/status-panel.png is a copy of it)."""
    problem = missing_browser()
    if problem:
        pytest.fail(problem)
    driver = start_chromium(tmp_path / "chromium-profile", artifacts_dir() / "chromedriver-shapes.log")
    try:
        driver.get(comfy_server.url)
        deadline = time.monotonic() + 180
        while not driver.execute_script("return !!document.querySelector(arguments[0])", TAB_BUTTON):
            assert time.monotonic() < deadline, "the DiT Parallel sidebar tab did not appear"
            time.sleep(0.25)
        driver.execute_script("return window.app.loadGraphData(arguments[0])", json.loads(SHAPES.read_text()))
        driver.execute_script("document.querySelector(arguments[0]).click()", TAB_BUTTON)
        driver.execute_script("return window.app.queuePrompt(0, 1)")  # what the Run button does

        def finished(panel):
            pools = [p for p in (panel or {}).get("pools", []) if "tiny-flux-shapes" in p["text"]]
            return pools and pools[0]["job"] == "decoding done" and pools[0]

        pool = wait_for(driver, finished, 600, "the shapes workflow to finish (decoding done)")
        assert "on cpu, cpu" in pool["text"] and "ulysses=2" in pool["text"], pool["text"]
        assert [(r["rank"], r["state"]) for r in pool["ranks"]] == [("0", "ready"), ("1", "ready")]
        time.sleep(2)  # the preview node paints the picture after the last message
        driver.save_screenshot(str(artifacts_dir() / "status-panel.png"))
    finally:
        driver.quit()
        with ComfyClient(comfy_server.url) as client:  # the later tests count the workers of one pool
            assert client.post("/dit_parallel/unload")["pools"] == []
