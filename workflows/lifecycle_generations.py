"""The lifecycle workflow's generations: the one patch marker a new run writes, standing for every patch before it,
which generations this code still replays, and which the next release will (docs/pages/contributing/
patch-policy.md). Pure data, imported by the workflow (``workflows/lifecycle_base.py``), which asks for the
markers, and by `relay patches check` (``cli/patches.py``), which reads them off the histories of the open runs.

A run's generation is the generation marker its first workflow task wrote: the workflow asks for them first thing
in ``run``, so no other command comes before, and a run that continues as new starts a run on the code that
continues it. A run whose first workflow task wrote none was started before generation 1: generation 0.
"""

from __future__ import annotations

GENERATION_3_PATCH = "lifecycle-generation-3"
GENERATION_4_PATCH = "lifecycle-generation-4"
GENERATION_5_PATCH = "lifecycle-generation-5"
GENERATION_6_PATCH = "lifecycle-generation-6"
# Every generation marker a lifecycle run has written, by its number; those this code no longer replays stay
# listed, so the check names a run's generation rather than calling it unknown.
GENERATIONS: dict[str, int] = {
    "lifecycle-generation-1": 1,
    "lifecycle-generation-2": 2,
    GENERATION_3_PATCH: 3,
    GENERATION_4_PATCH: 4,
    GENERATION_5_PATCH: 5,
    GENERATION_6_PATCH: 6,
}
# What a new run writes.
NEWEST_GENERATION = 6
# This code replays the runs of this generation and newer. An older run's history fails here with nondeterminism:
# its generation's marker (or its first patch's) meets no ``workflow.patched`` call, which Core refuses.
OLDEST_REPLAYED_GENERATION = 3
# The oldest generation the next release replays (the policy: generations older than k go two releases after the
# one that brought k). `relay patches check` says whether an open run is older, so an upgrade would strand it.
NEXT_RELEASE_REPLAYS_FROM = 4
