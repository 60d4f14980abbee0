"""Observability of one board: what the server counts, and the HTTP endpoint that shows it.

* :mod:`.stats`: plain counters the server keeps while it serves (no dependency, near-zero cost);
* :mod:`.collector`: those counters and the server's live state as Prometheus metrics, read at scrape
  time (``prometheus_client``, the ``metrics`` extra);
* :mod:`.page`: the status page (HTML, escaped, refreshing itself);
* :mod:`.http`: ``/metrics``, ``/`` and ``/healthz`` over h11 in the server's trio nursery.
"""
