"""A serving process's long-lived heap, kept out of the cyclic garbage collector's way.

CPython frees most objects by reference counting; its cyclic collector runs beside it, each time 700 more
container objects were made than freed, and every so often over everything tracked: the modules, Django's
settings, models and URL patterns, compiled templates, the MCP SDK's models, which live as long as the
process does. Under the load benchmark that was 4-10 % of each hub process's CPU (``docs/performance.md``,
sixteenth pass).

``settle()`` runs once a process has loaded what it serves with, before its first request or task (and,
for Celery's prefork pool, in the parent before it forks its children, which inherit it frozen):
- the routes and every view they name are imported now, not at the first request;
- one full collection, then ``gc.freeze()``: what is alive now moves to the permanent generation, which no
  later collection traverses (what of it becomes garbage is still freed by reference counting);
- the first generation's threshold is raised (``GEN0``), so a request's or a send's short-lived objects
  are mostly freed by reference counting before a collection would examine them.
Cyclic garbage is still collected; only less often, and without walking the process's own code.
"""

from __future__ import annotations

import gc

GEN0 = 2_000  # CPython's default is 700; at 10,000 a collection of the API process took about 10 ms


def settle(*, routes: bool = False) -> None:
    if routes:
        from django.urls import get_resolver

        get_resolver().url_patterns  # noqa: B018  (imports the URLconf, each view and the API's schema)
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0, gen1, gen2)
