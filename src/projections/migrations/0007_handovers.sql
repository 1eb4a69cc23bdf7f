-- 0007_handovers: the move barrier (docs/design.md §9, §18). For a partition of `events`,
-- handed_over is the highest routing version whose HandedOver event has been applied: the
-- projector reads a partition past a KeyMovedIn(from_partition p, version v) only once p's
-- row says handed_over >= v, so a moved key's events on its old home are applied before
-- its events on the new one. Written with next_offset, in the batch's transaction.

ALTER TABLE projection_offsets
    ADD COLUMN handed_over integer NOT NULL DEFAULT 0 CHECK (handed_over >= 0);
