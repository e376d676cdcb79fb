# SPDX-License-Identifier: GPL-2.0-or-later
"""A stand-in Kubernetes API server for the calls ``gpushare tidal`` makes (never shipped).

It speaks the API server's REST and JSON for nodes (get, list, JSON-patch with ``test``
guarded by resourceVersion), pods (listed across namespaces by field selector) and the
resource.k8s.io objects tidal uses (ResourceSlices listed by field selector, ResourceClaims
listed, DeviceTaintRules created, listed by label and deleted), with the
API server's Status objects for errors, a bearer token, and a resourceVersion that moves on
every write. Only the resource.k8s.io versions it is told to serve are served, as a real
cluster serves only what its release has. Each request is logged for the tests to read.
"""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional
from urllib.parse import parse_qs, urlsplit

__all__ = ["ApiServer"]


def _pointer(path: str) -> list[str]:
    return [part.replace("~1", "/").replace("~0", "~") for part in path.split("/")[1:]]


def _json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 on ``doc`` for object members (what the fence sends); ValueError on a
    failed ``test`` or a bad path."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = _pointer(op["path"])
        parent: Any = doc
        for part in parts[:-1]:
            if not isinstance(parent, dict) or part not in parent:
                raise ValueError(f"path {op['path']} does not exist")
            parent = parent[part]
        last = parts[-1]
        if op["op"] == "test":
            if parent.get(last) != op["value"]:
                raise ValueError(f"test of {op['path']} failed")
        elif op["op"] in ("add", "replace"):
            if op["op"] == "replace" and last not in parent:
                raise ValueError(f"path {op['path']} does not exist")
            parent[last] = op["value"]
        elif op["op"] == "remove":
            parent.pop(last)
        else:
            raise ValueError(f"op {op['op']} is not served by the stand-in")
    return doc


class ApiServer:
    """Start with ``start()``; ``nodes``, ``slices`` and ``taint_rules`` hold the objects."""

    def __init__(self, token: str = "s3cret", versions: tuple[str, ...] = ("v1",)) -> None:
        self.token = token
        self.versions = versions
        self.nodes: dict[str, dict[str, Any]] = {}
        self.slices: list[dict[str, Any]] = []
        self.taint_rules: dict[str, dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        self.claims: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []
        self.before_patch: Optional[Callable[[str], None]] = None  # e.g. a racing writer
        self.lock = threading.RLock()
        self._version = 100
        self._server: Optional[ThreadingHTTPServer] = None

    # -- objects --------------------------------------------------------------------------
    def bump(self) -> str:
        with self.lock:
            self._version += 1
            return str(self._version)

    def add_node(self, name: str, taints: Optional[list[dict[str, Any]]] = None,
                 annotations: Optional[dict[str, str]] = None) -> None:
        self.nodes[name] = {"apiVersion": "v1", "kind": "Node",
                            "metadata": {"name": name, "resourceVersion": self.bump(),
                                         "annotations": dict(annotations or {}),
                                         "labels": {"kubernetes.io/hostname": name}},
                            "spec": {"taints": list(taints or [])}}

    def add_slice(self, node: str, driver: str, devices: list[str],
                  pool: Optional[str] = None) -> None:
        self.slices.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                            "metadata": {"name": f"{node}-{driver}-{len(self.slices)}"},
                            "spec": {"nodeName": node, "driver": driver,
                                     "pool": {"name": pool or node, "generation": 1,
                                              "resourceSliceCount": 1},
                                     "devices": [{"name": d} for d in devices]}})

    # -- serving --------------------------------------------------------------------------
    def start(self) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        server.daemon_threads = True
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def kubeconfig(self, url: str) -> str:
        return json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "standin",
            "clusters": [{"name": "standin", "cluster": {"server": url}}],
            "users": [{"name": "root", "user": {"token": self.token}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "root"}}],
        })

    def route(self, method: str, path: str, query: dict[str, list[str]],
              body: Any) -> tuple[int, Any]:
        parts = path.strip("/").split("/")
        with self.lock:
            self.requests.append((method, path))
            if parts[:2] == ["api", "v1"] and parts[2:3] == ["nodes"]:
                return self._nodes(method, parts[3:], body)
            if parts == ["api", "v1", "pods"] and method == "GET":
                return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {},
                             "items": _selected(self.pods, query)}
            if parts[:2] == ["apis", "resource.k8s.io"] and len(parts) >= 4 \
                    and parts[2] in self.versions:
                return self._resource(method, parts[3], parts[4:], query, body)
        return _status(404, "NotFound", f"the server could not find the requested resource "
                       f"({method} {path})")

    def _nodes(self, method: str, rest: list[str], body: Any) -> tuple[int, Any]:
        if not rest and method == "GET":
            return 200, {"apiVersion": "v1", "kind": "NodeList", "metadata": {},
                         "items": list(self.nodes.values())}
        name = rest[0] if rest else ""
        if name not in self.nodes:
            return _status(404, "NotFound", f'nodes "{name}" not found')
        if method == "GET":
            return 200, self.nodes[name]
        if method == "PATCH":
            if self.before_patch is not None:
                self.before_patch(name)
            try:
                patched = _json_patch(self.nodes[name], body)
            except (ValueError, KeyError, TypeError) as err:
                return _status(422, "Invalid", str(err))
            patched["metadata"]["resourceVersion"] = self.bump()
            self.nodes[name] = patched
            return 200, patched
        return _status(405, "MethodNotAllowed", f"{method} on a node")

    def _resource(self, method: str, plural: str, rest: list[str],
                  query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        if plural == "resourceslices" and method == "GET":
            return 200, {"kind": "ResourceSliceList", "items": _selected(self.slices, query)}
        if plural == "resourceclaims" and method == "GET" and not rest:
            return 200, {"kind": "ResourceClaimList", "items": list(self.claims)}
        if plural != "devicetaintrules":
            return _status(404, "NotFound", f"no resource {plural}")
        if method == "GET" and not rest:
            key, _, value = query.get("labelSelector", ["="])[0].partition("=")
            items = [r for r in self.taint_rules.values()
                     if not key or r["metadata"].get("labels", {}).get(key) == value]
            return 200, {"kind": "DeviceTaintRuleList", "items": items}
        if method == "POST":
            name = body["metadata"]["name"]
            if name in self.taint_rules:
                return _status(409, "AlreadyExists", f'devicetaintrules "{name}" already exists')
            body["metadata"]["resourceVersion"] = self.bump()
            self.taint_rules[name] = body
            return 201, body
        if method == "DELETE" and rest:
            if rest[0] not in self.taint_rules:
                return _status(404, "NotFound", f'devicetaintrules "{rest[0]}" not found')
            return 200, self.taint_rules.pop(rest[0])
        return _status(405, "MethodNotAllowed", f"{method} on devicetaintrules")


def _selected(items: list[dict[str, Any]], query: dict[str, list[str]]) -> list[dict[str, Any]]:
    """The items a ``fieldSelector`` of ``a.b=value`` terms keeps."""
    wanted = dict(term.split("=", 1) for term in
                  query.get("fieldSelector", [""])[0].split(",") if "=" in term)
    return [item for item in items
            if all(_field(item, key) == value for key, value in wanted.items())]


def _field(obj: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        obj = obj.get(part, {}) if isinstance(obj, dict) else {}
    return obj


def _status(code: int, reason: str, message: str) -> tuple[int, Any]:
    return code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                  "message": message, "reason": reason, "code": code}


def _handler(api: ApiServer) -> type:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            if self.headers.get("Authorization") != f"Bearer {api.token}":
                code, reply = _status(401, "Unauthorized", "Unauthorized")
            else:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                kind = self.headers.get("Content-Type", "")
                if self.command == "PATCH" and kind != "application/json-patch+json":
                    code, reply = _status(415, "UnsupportedMediaType",
                                          f"the stand-in serves JSON patches, not {kind}")
                else:
                    url = urlsplit(self.path)
                    code, reply = api.route(self.command, url.path, parse_qs(url.query),
                                            json.loads(raw) if raw else None)
            data = json.dumps(reply).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_DELETE = _serve

    return Handler
