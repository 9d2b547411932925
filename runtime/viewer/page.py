"""The viewer as one self-contained HTML file: CSS and our JavaScript inline, the data as
gzip'd JSON (base64) that the page unpacks with the browser's DecompressionStream. Nothing
is fetched over the network."""
from __future__ import annotations

import base64
import gzip
import html
import json
from pathlib import Path

from .model import ViewerData

_HERE = Path(__file__).resolve().parent

_TEMPLATE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>{css}</style></head>
<body>
<header><h1 id="title">{title}</h1>
<select id="view" aria-label="what to show"></select>
<input id="search" type="search" placeholder="search name, opcode or op_name" aria-label="search">
<button id="fit" title="fit the graph in the pane">fit</button>
<button id="collapse" title="collapse every fusion and called computation">collapse all</button>
<button id="membtn" title="the temp arena's buffers over the schedule">memory timeline</button>
<span id="pairnote"></span></header>
<div id="wrap"><div id="main"></div>
<div id="side"><div id="results"></div><div id="panel"><p>Click a node for its HLO line, shape,
bytes, source line and fusion decisions. Drag to pan, wheel to zoom, <b>+</b> (or double-click)
expands a fusion or a called computation.</p><div id="notes"></div></div></div></div>
<div id="mem"></div>
<script id="hlotk-data" type="application/octet-stream">{data}</script>
<script>{js}</script>
</body></html>
"""


def to_html(data: ViewerData) -> str:
    payload = json.dumps(data.to_json(), separators=(",", ":")).encode()
    packed = base64.b64encode(gzip.compress(payload, compresslevel=6, mtime=0)).decode()
    return _TEMPLATE.format(title=html.escape(data.title), css=(_HERE / "viewer.css").read_text(),
                            js=(_HERE / "viewer.js").read_text(), data=packed)
