"""Talk to a ComfyUI server as its page does: HTTP (``/prompt``, ``/object_info``, ``/interrupt``,
``/free``, ``/history``) and the ``/ws`` websocket (progress, executing, previews, errors)."""

from __future__ import annotations

import json
import struct
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import websocket  # websocket-client

PREVIEW_IMAGE = 1  # ComfyUI's BinaryEventTypes.PREVIEW_IMAGE (format word + JPEG/PNG bytes)
PREVIEW_WITH_METADATA = 4  # ... PREVIEW_IMAGE_WITH_METADATA (metadata length, metadata JSON, JPEG/PNG bytes)
END_EVENTS = ("execution_success", "execution_error", "execution_interrupted")


def http_json(url: str, body: Any = None, timeout: float = 60.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        raise AssertionError(
            f"{request.method} {url} -> HTTP {exc.code}: {exc.read().decode(errors='replace')}"
        ) from exc
    return json.loads(raw) if raw.strip() else None


def http_error(url: str, body: Any, timeout: float = 60.0) -> tuple[int, Any]:
    """POST ``body`` expecting an HTTP error: (status, decoded JSON answer)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raise AssertionError(f"POST {url} succeeded (HTTP {response.status}): {response.read()[:500]!r}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@dataclass
class Run:
    """What the websocket said about one prompt."""

    prompt_id: str
    messages: list[dict[str, Any]] = field(default_factory=list)  # text messages of this prompt, in order
    previews: list[bytes] = field(default_factory=list)  # preview images (JPEG/PNG bytes)
    preview_nodes: list[str | None] = field(default_factory=list)  # each preview's node (None: not said)

    @property
    def outcome(self) -> str | None:
        ends = [m["type"] for m in self.messages if m["type"] in END_EVENTS]
        return ends[-1] if ends else None

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [m["data"] for m in self.messages if m["type"] == kind]

    def progress(self, node: str) -> list[int]:
        """The progress values the server sent for ``node``, in order."""
        return [int(d["value"]) for d in self.of_type("progress") if str(d.get("node")) == node]

    def progress_states(self, node: str) -> list[tuple[float, float, str]]:
        """(value, max, state) of ``node`` in each ``progress_state`` message (the progress registry's view)."""
        states = [d["nodes"].get(node) for d in self.of_type("progress_state")]
        return [(float(s["value"]), float(s["max"]), s["state"]) for s in states if s]

    def error(self) -> dict[str, Any]:
        errors = self.of_type("execution_error")
        assert errors, f"no execution_error; the run ended with {self.outcome}: {self.messages[-5:]}"
        return errors[-1]


class ComfyClient:
    """One websocket session (client id) with a server."""

    def __init__(self, url: str, timeout: float = 30.0, features: dict[str, Any] | None = None):
        """``features``: the feature flags to announce, as the page does (it announces
        ``supports_preview_metadata``); None announces nothing, as a plain API client."""
        self.url = url.rstrip("/")
        self.client_id = uuid.uuid4().hex
        ws_url = self.url.replace("http://", "ws://") + f"/ws?clientId={self.client_id}"
        self.ws = websocket.create_connection(ws_url, timeout=timeout)
        self.other: list[dict[str, Any]] = []  # messages of no prompt (status, dit_parallel.status, ...)
        if features is not None:
            self.ws.send(json.dumps({"type": "feature_flags", "data": features}))

    def close(self) -> None:
        self.ws.close()

    def __enter__(self) -> ComfyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- HTTP --------------------------------------------------------------------------------------
    def get(self, path: str, timeout: float = 60.0) -> Any:
        return http_json(self.url + path, timeout=timeout)

    def post(self, path: str, body: Any = None, timeout: float = 60.0) -> Any:
        return http_json(self.url + path, body if body is not None else {}, timeout=timeout)

    def history(self, prompt_id: str, timeout: float = 30.0) -> dict[str, Any]:
        """The prompt's history entry (ComfyUI stores it just after it sends execution_success)."""
        deadline = time.monotonic() + timeout
        while True:
            entry = self.get(f"/history/{prompt_id}").get(prompt_id)
            if entry is not None or time.monotonic() > deadline:
                assert entry is not None, f"no history for prompt {prompt_id} after {timeout:.0f} s"
                return entry
            time.sleep(0.1)

    def queue(self, prompt: dict[str, Any]) -> str:
        answer = self.post("/prompt", {"prompt": prompt, "client_id": self.client_id})
        assert not answer.get("node_errors"), answer
        return answer["prompt_id"]

    # -- websocket ---------------------------------------------------------------------------------
    def follow(
        self,
        prompt_id: str,
        timeout: float = 300.0,
        on_message: Callable[[Run, dict[str, Any]], None] | None = None,
    ) -> Run:
        """Read the websocket until ``prompt_id`` ends (success, error or interrupt).
        ``on_message(run, message)`` sees every text message of the prompt as it arrives."""
        run = Run(prompt_id)
        deadline = time.monotonic() + timeout
        current = False  # binary previews carry no prompt id: they belong to the prompt executing now
        while run.outcome is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"prompt {prompt_id} did not end within {timeout:.0f} s; last: {run.messages[-5:]}")
            self.ws.settimeout(min(left, 5.0))
            try:
                opcode, payload = self.ws.recv_data()
            except websocket.WebSocketTimeoutException:
                continue
            if opcode == websocket.ABNF.OPCODE_BINARY:
                (kind,) = struct.unpack(">I", payload[:4])
                if current and kind == PREVIEW_IMAGE:
                    run.previews.append(payload[8:])
                    run.preview_nodes.append(None)
                elif kind == PREVIEW_WITH_METADATA:
                    (size,) = struct.unpack(">I", payload[4:8])
                    meta = json.loads(payload[8 : 8 + size])
                    if meta.get("prompt_id") == prompt_id:
                        run.previews.append(payload[8 + size :])
                        run.preview_nodes.append(str(meta.get("node_id")))
                continue
            if opcode != websocket.ABNF.OPCODE_TEXT:
                continue
            message = json.loads(payload)
            data = message.get("data") or {}
            if isinstance(data, dict) and data.get("prompt_id") == prompt_id:
                current = message["type"] not in END_EVENTS
                run.messages.append(message)
                if on_message is not None:
                    on_message(run, message)
            else:
                self.other.append(message)
        return run

    def run(self, prompt: dict[str, Any], timeout: float = 300.0, **kwargs: Any) -> Run:
        return self.follow(self.queue(prompt), timeout=timeout, **kwargs)
