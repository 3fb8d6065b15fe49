"""The web extension: its Node tests pass and every script parses (skipped without Node.js)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WEB = ROOT / "web"
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="Node.js is not installed")


@needs_node
def test_node_tests_pass():
    proc = subprocess.run(
        [NODE, "--test", "web/tests"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, f"node --test web/tests failed:\n{proc.stdout}\n{proc.stderr}"
    assert "# fail 0" in proc.stdout


@needs_node
@pytest.mark.parametrize("script", sorted(p.name for p in WEB.glob("*.js")))
def test_scripts_parse(script):
    proc = subprocess.run([NODE, "--check", str(WEB / script)], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


def test_pack_declares_the_web_directory():
    text = (ROOT / "__init__.py").read_text(encoding="utf-8")
    assert 'WEB_DIRECTORY = "./web"' in text
    assert (WEB / "dit_parallel.js").is_file() and (WEB / "status_model.js").is_file()
