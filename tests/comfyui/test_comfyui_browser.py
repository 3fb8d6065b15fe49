"""The status panel in a real browser: headless Chromium opens the page of the running ComfyUI
(with the pack loaded) while a prompt runs; the panel shows the pool's devices, each rank's state
and its step progress, live. A screenshot is kept in the artifacts folder."""

from __future__ import annotations

import re
import time

import pytest
from browser import missing_browser, start_chromium
from comfy_client import ComfyClient
from conftest import artifacts_dir
from test_comfyui_server import node_of, smoke_prompt

BROWSER_STEPS = 10000  # the most the sampler accepts: the prompt outlives the page load; it is cancelled
PANEL = "#dit-parallel-status"
RANK_LINE = re.compile(r"rank (\d+) · (\S+)(?: · step (\d+)/(\d+))?")


def panel_text(driver) -> str:
    return driver.execute_script(
        "const p = document.querySelector(arguments[0]);"
        "return p && p.getClientRects().length ? p.innerText : '';",  # shown? (a fixed panel has no offsetParent)
        PANEL,
    )


def rank_steps(text: str) -> dict[int, tuple[str, int | None, int | None]]:
    """rank -> (device, step, total) from the panel's rank lines."""
    out = {}
    for match in RANK_LINE.finditer(text):
        rank, device, step, total = match.groups()
        out[int(rank)] = (device, int(step) if step else None, int(total) if total else None)
    return out


def wait_for(driver, condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = panel_text(driver)
        value = condition(last)
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; the panel shows:\n{last}")


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

            def all_ranks_stepping(text: str):
                ranks = rank_steps(text)
                return ranks if len(ranks) == 2 and all(s is not None for _, s, _ in ranks.values()) else None

            first = wait_for(driver, all_ranks_stepping, 240, "both ranks to show their step")
            text = panel_text(driver)
            assert "tiny-flux (flux)" in text
            assert "on cpu, cpu" in text, "the pool's devices"
            assert "sampling" in text, "the job state"
            assert {r: d for r, (d, _, _) in first.items()} == {0: "cpu", 1: "cpu"}
            assert all(total == BROWSER_STEPS for _, _, total in first.values())
            driver.save_screenshot(str(artifacts_dir() / "comfyui-status-panel.png"))
            later = wait_for(
                driver,
                lambda t: (r := all_ranks_stepping(t)) and all(r[k][1] > first[k][1] for k in r) and r,
                60,
                "the steps to advance",
            )
            assert all(later[k][1] > first[k][1] for k in later)
        finally:
            client.post("/interrupt")
            driver.quit()
        run = client.follow(prompt_id, timeout=120)
        assert run.outcome == "execution_interrupted", run.messages[-5:]
        assert max(run.progress(sampler)) < BROWSER_STEPS
