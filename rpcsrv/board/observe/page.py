"""The board's status page (``/`` on the metrics port): what a person wants to see at a glance.

Identity and version, limits, tracker state, the self-test's verdict, the sessions now open (peer, age,
memory, calls, the modules each holds) and the last errors.  Plain HTML with a little CSS: no script, nothing fetched
from the network; it reloads itself every :data:`REFRESH` seconds (``<meta http-equiv=refresh>``).
Every string it shows goes through ``html.escape``: peers, error messages and module names come
from clients.
"""

from __future__ import annotations

import html
import platform
import time
from dataclasses import fields
from typing import Any

REFRESH = 2
MAX_MODULES = 8  # module names listed per session (then "+N more")

_STYLE = """body{font:14px system-ui,sans-serif;margin:1.2em;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:0 0 .2em}h2{font-size:1.05em;margin:1.2em 0 .3em}
table{border-collapse:collapse;background:#fff}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#eee}.num{text-align:right;font-variant-numeric:tabular-nums}.dim{color:#777}
.track{display:inline-block;width:200px;height:.7em;background:#ddd;vertical-align:middle}
.bar{display:block;height:100%;background:#4a90d9}
.ok{color:#1a7f37}.bad{color:#b3261e}"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _mib(n: float) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def _age(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _modules(session: Any) -> str:
    """The modules a session holds, by type key (with the count of each)."""
    from ...executor.module import RuntimeModule

    counts: dict[str, int] = {}
    for obj in list(session.handles.objects.values()):
        if isinstance(obj, RuntimeModule):
            key = str(getattr(obj, "type_key", type(obj).__name__))
            counts[key] = counts.get(key, 0) + 1
    if not counts:
        return '<span class="dim">none</span>'
    items = [f"{_e(k)}" + (f" &times;{n}" if n > 1 else "") for k, n in sorted(counts.items())]
    more = len(items) - MAX_MODULES
    return ", ".join(items[:MAX_MODULES]) + (f" +{more} more" if more > 0 else "")


def render(server: Any, stats: Any, version: str) -> str:
    """The page, from the server (its options, gate and state) and counters."""
    now = time.time()
    opts = server.options
    limits = opts.limits
    used = server.account.used
    total = limits.max_total_memory or 1
    out = [f'<!DOCTYPE html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="{REFRESH}">',
           f"<title>rpcsrv {_e(opts.key or platform.node())}</title><style>{_STYLE}</style></head><body>",
           f"<h1>rpcsrv board {_e(opts.key) if opts.key else '(no key)'}</h1>",
           f'<div class="dim">version {_e(version)} &middot; host {_e(platform.node())} ({_e(platform.machine())})'
           f" &middot; serving on {_e(opts.host)}:{_e(stats.board_port or opts.port)} &middot; native "
           f"{_e(opts.native.mode)} &middot; up "
           f"{_age(now - stats.started)} &middot; {stats.sessions_total} session(s) served &middot; "
           f'updated {time.strftime("%H:%M:%S", time.localtime(now))}</div>']
    gate = server.gate
    if gate is not None and hasattr(gate, "connected"):
        where = "%s:%s" % tuple(getattr(gate, "addr", ("?", "?")))
        state = '<span class="ok">registered</span>' if gate.connected else '<span class="bad">not registered</span>'
        out.append(f"<p>Tracker {_e(where)}: {state} ({getattr(gate, 'registrations', 0)} registration(s))</p>")
    health = server.health
    if opts.health_interval:  # the self-test (board/health.py)
        state = '<span class="ok">passing</span>' if health.ok else \
            f'<span class="bad">failing, off the farm</span>: {_e(health.reason)}'
        out.append(f"<p>Self-test every {opts.health_interval:g} s: {state} ({health.checks['ok']} passed, "
                   f"{health.checks['failed']} failed)</p>")
    bar = min(200, 200 * used // total)
    out.append(f'<p>Memory: {_mib(used)} of {_mib(total)} <span class="track"><span class="bar" style="width:{bar}px">'
               f"</span></span>"
               f" &middot; sessions {len(stats.live)} of {limits.max_sessions}"
               f' &middot; connections {server.connections} of {limits.max_connections}</p>')
    out.append("<h2>Sessions</h2>")
    if stats.live:
        out.append('<table id="sessions"><tr><th>#</th><th>peer</th><th>age</th><th>memory</th><th>calls</th>'
                   "<th>errors</th><th>modules</th></tr>")
        for s in sorted(stats.live.values(), key=lambda s: s.number):
            out.append(f'<tr><td class="num">{s.number}</td><td>{_e(s.record.peer)}</td>'
                       f'<td class="num">{_age(now - s.opened)}</td><td class="num">{_mib(s.session.account.used)}'
                       f'</td><td class="num">{s.record.calls}</td><td class="num">{s.session.errors}</td>'
                       f"<td>{_modules(s.session)}</td></tr>")
        out.append("</table>")
    else:
        out.append('<p class="dim">No session open.</p>')
    out.append("<h2>Last errors</h2>")
    if stats.errors:
        out.append('<table id="errors"><tr><th>time</th><th>session</th><th>peer</th><th>request</th>'
                   "<th>message</th></tr>")
        for err in reversed(stats.errors):
            out.append(f'<tr><td>{time.strftime("%H:%M:%S", time.localtime(err.when))}</td>'
                       f'<td class="num">{err.session}</td><td>{_e(err.peer)}</td><td>{_e(err.code)}</td>'
                       f"<td>{_e(err.message)}</td></tr>")
        out.append("</table>")
    else:
        out.append('<p class="dim">No error since the start.</p>')
    out.append("<h2>Limits</h2><table>")
    for f in fields(limits):
        value = getattr(limits, f.name)
        shown = _mib(value) if f.name in ("max_memory", "max_workspace", "max_total_memory", "max_packet") \
            else f"{value:g}" if isinstance(value, float) else str(value)
        out.append(f'<tr><td>{_e(f.name)}</td><td class="num">{_e(shown)}</td></tr>')
    out.append('</table><p class="dim">Metrics for Prometheus: <a href="/metrics">/metrics</a> &middot; '
               '<a href="/healthz">/healthz</a></p></body></html>')
    return "\n".join(out)
