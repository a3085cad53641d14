"""The web console: the store's view of the cluster as live pages (issue 17).

Served by the operator on its HTTP server under ``/console/`` and, the same pages, by
``gpu-auditor console --db URL`` from a store alone. Pages are rendered on the server as HTML
with inline SVG charts; a small script shipped in ``static/`` sorts and filters tables on the
client, but every page works without it. The package never imports SQL: it reads through
:class:`auditor.console.ports.ConsoleReader` (the store's side is
:mod:`auditor.store.console_queries`) and writes acknowledgements through
:class:`auditor.console.ports.AckWriter`, only when writes are enabled.
"""
