"""Worker runtime and SDK; result stores.

``Worker`` runs registered handlers for ready runs (``@worker.job("name")``); a handler gets a
``JobContext`` and may raise ``Permanent`` / ``Ambiguous`` to classify its failure. Results
larger than 8 KiB are staged in a ``ResultStore`` (``FilesystemResultStore``).
"""

from chronolog.workers.job import Ambiguous, Cancelled, JobContext, Permanent
from chronolog.workers.results import FilesystemResultStore, ResultStore
from chronolog.workers.runtime import Worker

__all__ = [
           "Ambiguous",
           "Cancelled",
           "FilesystemResultStore",
           "JobContext",
           "Permanent",
           "ResultStore",
           "Worker",
]
