"""The models in service and the watcher that swaps them live.

:class:`ModelHolder` owns one immutable mapping ``kb -> LoadedModel``. The stream reads
it once per batch (:meth:`ModelHolder.snapshot`), so a batch is scored by exactly one
model per KB. A swap builds a new mapping and replaces that single reference; the model
it replaces is kept as the KB's *previous* model, so a rollback to it needs no fetch.

:class:`ModelWatcher` keeps the holder in line with the store's active pointers:

* it reads each served KB's event stream (Redis ``XREAD BLOCK``; every replica reads it,
  there is no consumer group) and syncs the KB named by an event;
* it polls the active pointers every ``poll_interval_s`` and after every reconnect, so a
  missed event cannot leave a replica behind;
* a load is fetch -> verify (checksums, HMAC, schema, encoder) -> build -> encoder check
  -> warm-up (one ``score`` call), all off the event loop's hot path; a failure keeps
  the old model and is shown in :meth:`ModelHolder.status`;
* when the store is unreachable it keeps serving, backs off and reconnects.

One holder per process, created by the app factory; there is no module-level model.

Layout: ``_model.py`` (what a model must offer, the warm-up and threshold checks, the
default loader), ``_holder.py`` (:class:`ModelHolder`, :class:`LoadedModel`),
``_watcher.py`` (:class:`ModelWatcher`).
"""

from sidecar.hotswap._holder import LoadedModel, ModelHolder
from sidecar.hotswap._model import SwappableModel
from sidecar.hotswap._watcher import ModelWatcher

__all__ = [
    "LoadedModel",
    "ModelHolder",
    "ModelWatcher",
    "SwappableModel",
]
