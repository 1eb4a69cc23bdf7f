-- 0002_schedule_completed: a schedule with no further instant ends as COMPLETED (terminal).
-- It keeps its row and its runs; completed_at / completed_reason come from ScheduleCompleted.

ALTER TABLE schedules DROP CONSTRAINT schedules_state_check;
ALTER TABLE schedules ADD CONSTRAINT schedules_state_check
    CHECK (state IN ('ACTIVE', 'PAUSED', 'COMPLETED', 'DELETED'));
ALTER TABLE schedules ADD COLUMN completed_at timestamptz;
ALTER TABLE schedules ADD COLUMN completed_reason text;
