"""The browser test page of a deployment. The page holds no data: its script fetches the
deployment (and so the model's signature) with the token the user pastes, then builds the
form from it: the classes, the input size, the preprocessing."""

from __future__ import annotations

import html
import json

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>DeepPod: {name}</title>
<style>
body{{font-family:system-ui,sans-serif;max-width:52rem;margin:2rem auto;padding:0 1rem;color:#222}}
input[type=text]{{width:100%}} .row{{margin:.8rem 0}} table{{border-collapse:collapse}}
td,th{{padding:.2rem .6rem;border-bottom:1px solid #ddd;text-align:left}} .bar{{background:#4a7;height:.8rem}}
#err{{color:#b00}} img{{max-width:16rem;max-height:16rem}} code{{background:#f4f4f4}}
</style></head><body>
<h1>Deployment <code>{name}</code></h1>
<div class="row"><label>Token or deployment key<br><input type="text" id="token" placeholder="paste it here"></label>
<button id="load">Load</button></div>
<div id="info"></div>
<form id="form" hidden><div class="row"><input type="file" id="file" accept="image/*"></div>
<div class="row"><label>top k <input type="number" id="k" value="5" min="1" max="1000"></label>
<button type="submit">Predict</button></div></form>
<div id="err"></div><img id="preview" hidden><div id="answer"></div>
<script>
const name = {name_js};
const api = "/v1/deployments/" + encodeURIComponent(name);
const $ = (id) => document.getElementById(id);
$("token").value = localStorage.getItem("deeppod-token") || "";
function auth() {{
  const t = $("token").value.trim(); localStorage.setItem("deeppod-token", t);
  return t.startsWith("dpk_") ? {{"X-DeepPod-Key": t}} : {{"Authorization": "Bearer " + t}};
}}
function esc(s) {{ const d = document.createElement("div"); d.textContent = String(s); return d.innerHTML; }}
async function load() {{
  $("err").textContent = "";
  const r = await fetch(api, {{headers: {{...auth(), "Accept": "application/json"}}}});
  const body = await r.json();
  if (!r.ok) {{ $("err").textContent = (body.error || {{}}).message || r.statusText; return; }}
  const sig = body.signature || {{}}, inp = sig.input || {{}};
  $("info").innerHTML = "<p>Model <b>" + esc(body.model) + "@" + body.version + "</b>, " + esc(body.state) +
    " (" + esc(body.reason) + ")</p><p>Input: " + esc((inp.shape || []).join("x")) + " " + esc(inp.color || "") +
    ", crop " + esc(inp.crop || "squash") + "; " + (sig.classes || []).length + " classes: " +
    (sig.classes || []).slice(0, 30).map(esc).join(", ") + ((sig.classes || []).length > 30 ? ", ..." : "") + "</p>";
  $("form").hidden = false;
}}
$("load").onclick = load;
$("file").onchange = () => {{ const f = $("file").files[0]; if (f) {{ $("preview").src = URL.createObjectURL(f);
$("preview").hidden = false; }} }};
$("form").onsubmit = async (e) => {{
  e.preventDefault(); $("err").textContent = ""; $("answer").innerHTML = "";
  const f = $("file").files[0]; if (!f) {{ $("err").textContent = "choose an image first"; return; }}
  const data = new FormData(); data.append("image", f); data.append("top_k", $("k").value);
  const r = await fetch(api + "/predict", {{method: "POST", headers: auth(), body: data}});
  const body = await r.json();
  if (!r.ok) {{ $("err").textContent = (body.error || {{}}).message || r.statusText; return; }}
  const p = body.predictions[0];
  $("answer").innerHTML = "<p>Answered by version " + body.version +
  "</p><table><tr><th>label</th><th>confidence</th><th></th></tr>" +
    p.top_k.map(x => "<tr><td>" + esc(x.label) + "</td><td>" + (100 * x.confidence).toFixed(1) +
    "%</td><td><div class=bar style='width:" + (12 * x.confidence) + "rem'></div></td></tr>").join("") + "</table>";
}};
if ($("token").value) load();
</script></body></html>
"""


def render(name: str) -> str:
    return PAGE.format(name=html.escape(name), name_js=json.dumps(name).replace("<", "\\u003c"))
