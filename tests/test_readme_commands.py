"""The README's two copy-paste commands are the ones CI and the tests run.

CI runs ``.ci/run``; its steps must be the README's test command word for word (a newcomer runs what CI runs,
Chromium included), and the README's first command must be the one ``tests/test_shapes_drawing.py`` runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from test_shapes_drawing import CFG, PX, README_PROMPT, STEPS

REPO = Path(__file__).resolve().parents[1]


def _bash_blocks(section: str) -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    body = text.split(f"\n## {section}", 1)[1].split("\n## ", 1)[0]
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", body, flags=re.S)]


def _steps(command: str) -> list[str]:
    return [step.strip() for step in command.split("&&")]


def test_the_readme_test_command_is_what_ci_runs_and_installs_the_browser():
    (command,) = _bash_blocks("Run the tests")
    steps = _steps(command)
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert _steps(ci[-1]) == steps[-len(_steps(ci[-1])) :], ".ci/run's last line is the README's Python steps"
    installs = [s for s in steps if "apt-get install" in s]
    assert installs and {"chromium", "chromium-driver"} <= set(shlex.split(installs[0])), (
        "the README's test command installs the browser the ComfyUI browser test drives"
    )
    assert steps[-1] == "python -m pytest tests"


def test_the_readme_first_command_is_the_one_the_drawing_test_runs():
    (command,) = _bash_blocks("Try it without ComfyUI or a GPU")
    generate = shlex.split(next(s for s in _steps(command) if " generate " in s))
    options = dict(zip(generate[4::2], generate[5::2], strict=False))
    assert generate[:4] == ["python", "-m", "parallel_runtime", "generate"]
    assert options["--model"] == "tiny-flux-shapes" and options["--prompt"] == README_PROMPT
    assert (int(options["--width"]), int(options["--height"]), int(options["--steps"])) == (PX, PX, STEPS)
    assert float(options["--cfg-scale"]) == CFG
