"""Run inside ComfyUI's venv: load the snapshot's nodes and this pack as ComfyUI does, then answer
from ComfyUI's own code. Usage: ``python comfy_oracle.py REQUEST.json OUT.json``.

REQUEST: {"snapshot", "base" (the --base-directory, whose custom_nodes holds the cloned pack),
"workflows": {name: UI-format workflow}, "visible_gpus": N}. OUT: {"object_info" (the node
definitions, built as the server's /object_info builds them), "samplers", "schedulers"
(comfy.samplers.KSampler), "loaded_pack" (whether dit-parallel imported), "public_nodes" (our node
types registered as comfy_api io.ComfyNode classes), "results": {name: {"prompt" (API format), "valid",
"error", "node_errors", "conversion_error"}}, "choice_probes": {"Node.input": {"valid", "errors"}}: each
choice input of our nodes in a valid workflow, validated once with an unknown value}, "choice_probe":
{"valid", "errors"} when the request has a "choice_probe" {"workflow", "class_type", "input"}: that
workflow validated with that input set to a value that is none of its choices}.

Validation is ``execution.validate_prompt`` itself: ComfyUI's type, link, combo and range checks
and our VALIDATE_INPUTS. Our loader checks that the requested GPUs exist; the shipped workflows are
for GPU machines, so ``visible_gpus`` makes torch report that many CUDA devices during validation.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any


def _setup(snapshot: str, base: str) -> Any:
    sys.path.insert(0, snapshot)
    sys.argv = ["main.py", "--cpu", "--base-directory", base, "--disable-api-nodes"]
    import comfy.options

    comfy.options.enable_args_parsing()
    import utils.extra_config  # noqa: F401  (main.py imports ComfyUI's utils package first; so must we)

    import nodes

    asyncio.run(nodes.init_extra_nodes(init_custom_nodes=True, init_api_nodes=False))
    return nodes


def _node_info(nodes: Any, name: str) -> dict[str, Any]:
    """What the server's /object_info says about one node (input, input_order, output, names)."""
    cls = nodes.NODE_CLASS_MAPPINGS[name]
    if hasattr(cls, "GET_NODE_INFO_V1"):  # nodes written with the V3 schema
        return cls.GET_NODE_INFO_V1()
    inputs = cls.INPUT_TYPES()
    return {
        "input": inputs,
        "input_order": {key: list(value.keys()) for key, value in inputs.items()},
        "output": list(cls.RETURN_TYPES),
        "output_name": list(getattr(cls, "RETURN_NAMES", cls.RETURN_TYPES)),
        "output_node": bool(getattr(cls, "OUTPUT_NODE", False)),
        "name": name,
        "display_name": nodes.NODE_DISPLAY_NAME_MAPPINGS.get(name, name),
        "python_module": getattr(cls, "RELATIVE_PYTHON_MODULE", "nodes"),
    }


UNKNOWN_CHOICE = "no-such-choice"


def _probe_choices(nodes: Any, execution: Any, name: str, prompt: dict, done: dict) -> dict[str, dict[str, Any]]:
    """For each choice input of our nodes in ``prompt`` (its type in INPUT_TYPES is not a type name),
    not probed yet: validate a copy of the prompt with that input set to UNKNOWN_CHOICE. Returns
    {"Node.input": {"valid", "errors" (the node's error types)}}."""
    import copy

    probes = {}
    for node_id, node in prompt.items():
        kind = node["class_type"]
        if not kind.startswith("DiTParallel"):
            continue
        for section in nodes.NODE_CLASS_MAPPINGS[kind].INPUT_TYPES().values():
            for input_name, entry in section.items():
                key = f"{kind}.{input_name}"
                if isinstance(entry[0], str) or key in done or key in probes or input_name not in node["inputs"]:
                    continue
                bad = copy.deepcopy(prompt)
                bad[node_id]["inputs"][input_name] = UNKNOWN_CHOICE
                valid, _, _, node_errors = asyncio.run(execution.validate_prompt(f"{name}:{key}", bad, None))
                errors = [e.get("type") for e in node_errors.get(node_id, {}).get("errors", [])]
                probes[key] = {"valid": bool(valid), "errors": errors}
    return probes


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))


def main() -> None:
    request_path, out_path = Path(sys.argv[1]), Path(sys.argv[2])
    request = json.loads(request_path.read_text())
    nodes = _setup(request["snapshot"], request["base"])
    import comfy.samplers
    import execution
    import torch
    from workflow_api import WorkflowError, ui_to_api

    object_info = {}
    for name in nodes.NODE_CLASS_MAPPINGS:
        try:
            object_info[name] = _jsonable(_node_info(nodes, name))
        except Exception as exc:  # a broken core node must not hide the answer for the others
            object_info[name] = {"error": repr(exc)}
    gpus = int(request.get("visible_gpus", 0))
    if gpus:
        torch.cuda.is_available = lambda: True
        torch.cuda.device_count = lambda: gpus
    results: dict[str, Any] = {}
    choice_probes: dict[str, dict[str, Any]] = {}
    for name, workflow in request["workflows"].items():
        try:
            prompt = ui_to_api(workflow, object_info)
        except WorkflowError as exc:
            results[name] = {"conversion_error": str(exc)}
            continue
        valid, error, outputs, node_errors = asyncio.run(execution.validate_prompt(name, prompt, None))
        results[name] = _jsonable(
            {"prompt": prompt, "valid": valid, "error": error, "outputs": outputs, "node_errors": node_errors}
        )
        if valid:
            choice_probes.update(_probe_choices(nodes, execution, name, prompt, choice_probes))
    probe = request.get("choice_probe")
    choice_probe = None
    if probe and results.get(probe["workflow"], {}).get("valid"):
        bad = json.loads(json.dumps(results[probe["workflow"]]["prompt"]))
        (node_id,) = [k for k, v in bad.items() if v["class_type"] == probe["class_type"]]
        bad[node_id]["inputs"][probe["input"]] = UNKNOWN_CHOICE
        valid, _, _, node_errors = asyncio.run(execution.validate_prompt("probe", bad, None))
        errors = [e.get("type") for e in node_errors.get(node_id, {}).get("errors", [])]
        choice_probe = {"valid": bool(valid), "errors": errors}
    from comfy_api.latest import io

    out = {
        "public_nodes": sorted(
            n
            for n, c in nodes.NODE_CLASS_MAPPINGS.items()
            if n.startswith("DiTParallel") and issubclass(c, io.ComfyNode)
        ),
        "choice_probe": choice_probe,
        "object_info": object_info,
        "samplers": list(comfy.samplers.KSampler.SAMPLERS),
        "schedulers": list(comfy.samplers.KSampler.SCHEDULERS),
        "loaded_pack": any(
            Path(d).name == request.get("pack_folder", "dit-parallel") for d in nodes.LOADED_MODULE_DIRS.values()
        ),
        "results": results,
        "choice_probes": choice_probes,
    }
    out_path.write_text(json.dumps(out))


if __name__ == "__main__":
    main()
