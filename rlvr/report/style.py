"""The report's stylesheet, inlined into the page (system fonts; nothing is fetched)."""

CSS = """
:root { --fg: #1d232b; --muted: #6a737d; --line: #d8dee4; --bg: #ffffff; --soft: #f5f7f9;
        --pass: #1a7f37; --fail: #cf222e; --warn: #9a6700; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--fg); background: var(--bg);
       font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
header.top { position: sticky; top: 0; z-index: 2; background: #24292f; color: #fff; padding: 8px 20px; }
header.top h1 { margin: 0; font-size: 17px; font-weight: 600; }
header.top nav a { color: #c9d1d9; margin-right: 14px; font-size: 13px; text-decoration: none; }
main { max-width: 1240px; margin: 0 auto; padding: 0 20px 60px; }
section, article.traj { scroll-margin-top: 72px; }  /* a link's target clears the sticky header */
section { padding-top: 8px; border-bottom: 1px solid var(--line); padding-bottom: 16px; }
h2 { font-size: 18px; margin: 18px 0 10px; }
h3 { font-size: 15px; margin: 14px 0 8px; }
code, pre { font: 12.5px/1.4 ui-monospace, "SFMono-Regular", "DejaVu Sans Mono", Menlo, monospace; }
pre { white-space: pre-wrap; word-break: break-word; background: var(--soft); border: 1px solid var(--line);
      border-radius: 4px; padding: 6px 8px; margin: 4px 0; max-height: 420px; overflow: auto; }
table { border-collapse: collapse; margin: 6px 0; }
th, td { text-align: left; vertical-align: top; padding: 3px 10px 3px 0; }
table.kv th { color: var(--muted); font-weight: 500; white-space: nowrap; }
table.eval th, table.eval td, table.alerts th, table.alerts td { border-bottom: 1px solid var(--line); padding: 4px 10px; }
table.eval td { text-align: right; white-space: nowrap; }
table.eval tr.level th { padding-left: 24px; color: var(--muted); font-weight: 400; }
table.eval tr.level td { color: var(--muted); }
table.eval tr.all { font-weight: 600; }
small, .muted { color: var(--muted); }
.badge { display: inline-block; padding: 0 7px; border-radius: 10px; font-size: 12px; font-weight: 600; color: #fff; }
.badge.pass, .badge.finished { background: var(--pass); }
.badge.fail, .badge.crashed { background: var(--fail); }
.badge.stopped { background: var(--warn); }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(460px, 1fr)); gap: 14px; }
figure { margin: 0; border: 1px solid var(--line); border-radius: 6px; padding: 8px; background: #fff; }
figure img { max-width: 100%; }
svg.plot { width: 100%; height: auto; display: block; }
svg.radar { max-width: 520px; }
svg .grid { stroke: #e4e8ec; stroke-width: 1; }
svg .axis { stroke: #8c959f; }
svg .tick { font-size: 10px; fill: var(--muted); }
svg .label { font-size: 12px; fill: var(--fg); }
figcaption { font-size: 13px; margin-top: 4px; }
.legend span { display: inline-block; margin-right: 12px; white-space: nowrap; }
.legend i { display: inline-block; width: 12px; height: 3px; vertical-align: middle; margin-right: 4px; }
.eval-grid { display: grid; grid-template-columns: minmax(0, 1fr) minmax(300px, 540px); gap: 16px; align-items: start; }
tr.sev-critical td, li.sev-critical { color: var(--fail); }
tr.sev-warning td:nth-child(3), li.sev-warning { color: var(--warn); }
details.step { margin: 6px 0; }
details.step > summary { cursor: pointer; font-weight: 600; padding: 4px 0; }
article.traj { border: 1px solid var(--line); border-radius: 6px; margin: 10px 0; padding: 8px 12px; background: #fff; }
article.traj:target { outline: 3px solid #f2cc60; }
article.traj > header { font-size: 13px; margin-bottom: 6px; }
a.anchor { font-weight: 700; text-decoration: none; margin-right: 4px; }
ul.flags { margin: 4px 0 8px; padding-left: 18px; }
.msg { border-left: 3px solid var(--line); padding: 2px 0 2px 10px; margin: 6px 0; }
.msg .role { font-size: 11px; font-weight: 700; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); }
.msg.system { border-color: #8c959f; }
.msg.user { border-color: #0969da; }
.msg.assistant { border-color: #8250df; }
.msg.tool-result { border-color: #bf8700; }
.msg.files { border-color: #1a7f37; }
.text { white-space: pre-wrap; word-break: break-word; margin: 2px 0; }
pre .lang { display: block; font-size: 10px; color: var(--muted); }
.call { border: 1px dashed #b392f0; border-radius: 4px; padding: 4px 8px; margin: 4px 0; background: #fbf8ff; }
.call .fn { font-size: 12.5px; }
.call.bad { border-color: var(--fail); }
table.args th { color: var(--muted); font-weight: 500; }
pre.result.error { border-color: #ffb3b8; background: #fff5f5; }
.diff pre { background: #fff; }
.diff pre span { display: block; min-height: 1.4em; }
.diff .add { background: #dafbe1; }
.diff .del { background: #ffebe9; }
.diff .hunk { color: #8250df; }
.diff .file { color: var(--muted); }
.diff .note { font-size: 12px; color: var(--muted); }
.scores { display: flex; flex-wrap: wrap; gap: 28px; border-top: 1px solid var(--line); margin-top: 8px; padding-top: 6px; }
.scores .verdict { flex: 1 1 420px; min-width: 0; }
.scores .h { font-size: 11px; font-weight: 700; text-transform: uppercase; color: var(--muted); }
tr.total th, tr.total td { font-weight: 700; border-top: 1px solid var(--line); }
@media (max-width: 800px) { .eval-grid { grid-template-columns: 1fr; } .charts { grid-template-columns: 1fr; } }
"""
