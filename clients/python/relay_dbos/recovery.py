"""Recovery of a dead executor's workflows: the one call this client makes outside DBOS's public API.

``DBOS._recover_pending_workflows(executor_ids)`` is what ``DBOS.launch()`` itself runs for the process's own id,
and what dbos 3.2.0's built-in conductor client ran for Relay's ``recovery`` request: for each id, the PENDING
workflows it owned on this process's application version are put back on DBOS's internal queue, each in one
update guarded by their status and owner, so a second request finds nothing and still succeeds. No public call
does this for another executor's id; it is kept behind this one function, and tested against the pinned release
(``clients/python/tests``).
"""

from __future__ import annotations

from dbos import DBOS


def recover(executor_ids: list[str]) -> int:
    """Re-enqueue the PENDING workflows of ``executor_ids`` (this process's version); how many were found."""
    return len(DBOS._recover_pending_workflows(executor_ids))
