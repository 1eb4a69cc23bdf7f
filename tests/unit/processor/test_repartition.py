"""Moving keys to a new routing version, on the in-memory log (docs/design.md §18).

The log has 4 partitions; the deployment's first routing version uses 2 of them. Schedules
are created and run (manual triggers, claims: fences advance), then every partition is sent
``BeginHandover`` to version 2 (4 partitions). Every key ends on its home in version 2,
exactly once, with exactly the state it had; fences continue there, request keys still
dedupe, a command sent to the old home afterwards is forwarded and answered, and a fresh
processor taking the partitions over — folding from offset 0, or from a snapshot — rebuilds
the same states and the same routing view.
"""

from __future__ import annotations

from typing import Any

from chronolog.domain import messages as m
from chronolog.domain.ids import partition_key, quota_key
from chronolog.processors.config import OpenTenants
from support.polling import wait_until
from support.repartition import (
    NEW,
    OLD,
    SPEC,
    Running,
    begin,
    config,
    home,
    reply_of,
    to_partition,
)

SCHEDULES = [f"s{i}" for i in range(12)]


class Quota(OpenTenants):
    """Every tenant may hold ``QUOTA`` schedules."""

    def policy(self, tenant: str) -> tuple[frozenset[str] | None, int | None]:
        return (None, QUOTA)


QUOTA = 5


async def test_keys_move_to_their_new_home_exactly_once_and_keep_their_state(
    event_log: Any,
) -> None:
    keys = [partition_key("acme", s) for s in SCHEDULES]
    moving = [k for k in keys if home(k, OLD) != home(k, NEW)]
    assert moving and len(moving) < len(keys)
    async with Running(event_log, "p1", config()) as r:
        c = r.client
        runs: dict[str, tuple[str, int]] = {}
        for s in SCHEDULES:
            await c.create_schedule("acme", s, SPEC)
            run = await c.trigger("acme", s, f"rk-{s}")
            claimed = await c.claim("acme", s, run["run_id"], 1, "w1")
            runs[s] = (run["run_id"], claimed["fence"])
        for k in keys:
            assert r.holders(k) == [home(k, OLD)]
        before = r.states()

        # version 2: the old partitions hand over first (the partitions it adds learn it
        # from their handover-done commands), then the new ones are told (a repeat for them)
        for p in (0, 1, 2, 3):
            env = begin(c, p)
            await to_partition(event_log, env, p)
            assert (await reply_of(event_log, env.command_id)).status == "ok"
        await wait_until(lambda: all(v.routing is not None and v.routing.serves.version == 2
                                     for v in r.views().values()), 30, what="handed over")
        await wait_until(lambda: all(r.holders(k) == [home(k, NEW)] for k in keys), 30,
                         what="every key at its new home")
        after = r.states()
        assert {k: v[1] for k, v in after.items()} == {k: v[1] for k, v in before.items()}
        assert r.proc.stats.moved_out == r.proc.stats.moved_in == len(moving)
        for k in moving:  # armed where it is now, not where it was
            assert k in r.proc.partitions[home(k, NEW)].timers
            assert k not in r.proc.partitions[home(k, OLD)].timers

        # the runs go on at the new home: the fence continues, request keys dedupe
        for s in SCHEDULES:
            run_id, fence = runs[s]
            again = await c.trigger("acme", s, f"rk-{s}")
            assert again["run_id"] == run_id
            await c.heartbeat("acme", s, run_id, 1, fence, "w1")  # raises unless ok
            await c.complete("acme", s, run_id, 1, fence, "w1", "sha256:00", 0)
            second = await c.trigger("acme", s, f"rk2-{s}")
            claimed = await c.claim("acme", s, second["run_id"], 1, "w1")
            assert claimed["fence"] > fence

        # a command sent to the old home is forwarded there and answered
        forwarded = r.proc.stats.forwarded
        s = next(s for s in SCHEDULES if partition_key("acme", s) in moving)
        env = c.envelope("acme", s, m.TriggerRun(request_key=f"rk-{s}"))
        await to_partition(event_log, env, home(partition_key("acme", s), OLD))
        reply = await reply_of(event_log, env.command_id)
        assert reply.status == "ok" and reply.body["run_id"] == runs[s][0]
        assert r.proc.stats.forwarded > forwarded
        # and a new schedule on a moved home is created at its new home only
        await c.create_schedule("acme", "late", SPEC)
        late = partition_key("acme", "late")
        assert r.holders(late) == [home(late, NEW)]
        final = r.states()
        views = r.views()
        await wait_until(lambda: all(ps.snap is not None and not ps.snap.dirty
                                     and ps.snap.round is None
                                     for ps in r.proc.partitions.values()), 30,
                         what="a snapshot of every partition after the moves")

    # takeovers: from offset 0, then from the snapshot
    async with Running(event_log, "p2", config(snapshots=False)) as r2:
        assert r2.states() == final
        assert r2.views() == views
        assert r2.proc.stats.restored_from_zero == NEW
    async with Running(event_log, "p3", config()) as r3:
        assert r3.proc.stats.restored_from_snapshot == NEW, list(r3.proc.takeovers)
        assert r3.states() == final
        assert r3.views() == views
        # routed as before: a command to the old home of a moved key is forwarded
        env = r3.client.envelope("acme", s, m.TriggerRun(request_key=f"rk-{s}"))
        await to_partition(event_log, env, home(partition_key("acme", s), OLD))
        assert (await reply_of(event_log, env.command_id)).body["run_id"] == runs[s][0]


async def test_a_tenants_quota_moves_with_its_slots_and_stays_exact(event_log: Any) -> None:
    tenant = next(t for t in (f"t{i}" for i in range(100))
                  if home(quota_key(t), OLD) != home(quota_key(t), NEW))
    qkey = quota_key(tenant)
    async with Running(event_log, "p1", config(), Quota()) as r:
        c = r.client
        for i in range(3):
            await c.create_schedule(tenant, f"s{i}", SPEC)
        old_home = r.proc.partitions[home(qkey, OLD)]
        # a create is answered before its slot is confirmed (the confirmation follows)
        await wait_until(lambda: all(held is None for _, held in
                                     old_home.quotas[qkey].slots.values()), 30,
                         what="every slot confirmed")
        slots = dict(old_home.quotas[qkey].slots)
        assert len(slots) == 3
        for p in (0, 1):
            env = begin(c, p)
            await to_partition(event_log, env, p)
            assert (await reply_of(event_log, env.command_id)).status == "ok"
        await wait_until(lambda: qkey in r.proc.partitions[home(qkey, NEW)].quotas, 30,
                         what="the quota at its new home")
        assert qkey not in r.proc.partitions[home(qkey, OLD)].quotas
        assert r.proc.partitions[home(qkey, NEW)].quotas[qkey].slots == slots
        # the saga goes on against the moved slots: two more fit, the third does not
        for i in range(3, 5):
            await c.create_schedule(tenant, f"s{i}", SPEC)
        reply = await c.send(c.envelope(tenant, "s5", m.CreateSchedule(
            spec=m.ScheduleSpec.model_validate(SPEC))))
        assert reply.status == "quota", reply
        assert len(r.proc.partitions[home(qkey, NEW)].quotas[qkey].slots) == QUOTA
