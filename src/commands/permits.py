"""Concurrency limits: at most ``limit`` runs with the same key LEASED at once, across every
worker and partition of the tenant. Pure: time never enters; every key, limit and count is
written into the events.

A schedule's ``concurrency`` (``{"key": "customer-{customer_id}", "limit": 2}``), or the
tenant's rule for the job type (tenants file ``job_concurrency``), gives a run a key: the
template rendered with the run's own params. The permits of one key are granted by one
aggregate, ``limit_id(key)``, decided on one partition like the tenant's quota (and kept in
the quota aggregate's state, ``QuotaState``), so one processor decides every permit of the
key in one order, whatever the partitions of the runs.

* A run that becomes READY (materialized, ready again after a retry's wait, redriven) asks
  for a permit: ``RunAwaitsPermit`` on its schedule and an ``AcquirePermit`` to the key's
  aggregate, both in the decision that made it READY (``after_decision``). It is not
  assigned to a worker, nor claimable, until it has the permit; it waits READY, and the
  read model shows what it waits for.
* The key's aggregate grants a request while fewer than the request's limit hold a permit
  and nobody waits ahead of it (``PermitGranted`` and a ``GrantPermit`` back to the
  schedule); otherwise it is queued (``PermitQueued``), first in, first out.
* The schedule records the grant (``RunPermitted``); a grant for a request the run no longer
  makes (it was cancelled, skipped or retried meanwhile) is given back at once.
* A run that stops being READY or LEASED (it finished, failed into its retry wait, was
  cancelled, skipped, or its lease expired into a wait) gives its permit back
  (``RunPermitReturned`` and a ``ReleasePermit``) in the decision that moved it; the key's
  aggregate then grants the requests waiting at the head of the line.

So a permit is held from the grant until the decision that ends the attempt, and the next
one is granted only after that decision's release reached the key's aggregate: the runs of
one key LEASED at once never outnumber the limit, across partitions and failover (every
step is an event or a command in the same transaction as the decision that caused it).
``chronolog audit`` checks it (``concurrency_limit``).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from chronolog.commands.aggregate import PROCESSOR, Decision, Draft, Send, TenantContext
from chronolog.commands.state import QuotaState, Run, ScheduleState
from chronolog.domain import messages as m
from chronolog.domain.ids import limit_id, saga_command_id

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["WANTS_PERMIT", "after_decision", "decide_permit", "evolve_permit",
           "grant_received", "rule_for", "waits_for_permit"]

# the run states that hold (or ask for) a permit
WANTS_PERMIT = frozenset({"READY", "LEASED"})


def rule_for(spec: m.ConcurrencySpec | None, job: m.JobSpec,
             tenant: TenantContext) -> tuple[str, int] | None:
    """A run's (key, limit): its schedule's rule, else its tenant's for the job type."""
    rule = spec if spec is not None else (tenant.job_concurrency or {}).get(job.type)
    if rule is None:
        return None
    return rule.render(job.params), rule.limit


def waits_for_permit(run: Run) -> bool:
    """A READY run that asked for a permit and has none yet: not assigned, not claimable."""
    return run.permit is not None and not run.permitted


def applies(state: ScheduleState, events: list[m.ScheduleEvent], tenant: TenantContext) -> bool:
    """Whether a decision may start or end a request for a permit (cheap: most do not)."""
    if tenant.job_concurrency:
        return True
    pol = state.policy
    if pol is not None and pol.concurrency is not None:
        return True
    if state.runs and any(r.permit is not None for r in state.runs.values()):
        return True
    return any((isinstance(ev, (m.ScheduleCreated, m.ScheduleRevised))
                and ev.spec.concurrency is not None)
               or (isinstance(ev, m.OccurrenceMaterialized) and ev.permit_key is not None)
               for ev in events)


def after_decision(before: ScheduleState, after: ScheduleState, command_id: str,
                   tenant: TenantContext, emit: Callable[[m.ScheduleEvent], None],
                   send: Callable[[Send], None]) -> None:
    """Compare each run before and after a decision: a run that became READY asks for a
    permit, a run that stopped being READY or LEASED gives back the one it held or asked
    for. ``after`` is the state with the decision's events folded in."""
    ids = dict.fromkeys(before.runs or ())
    ids.update(dict.fromkeys(after.runs or ()))
    for run_id in ids:
        b, a = before.run(run_id), after.run(run_id)
        wants = a is not None and a.state in WANTS_PERMIT
        if b is not None and b.permit is not None and not wants:
            assert b.concurrency is not None
            emit(m.RunPermitReturned(run_id=run_id, ask=b.permit))
            send(_release(b.concurrency[0], run_id, after.schedule_id, b.permit))
        elif wants and a is not None and a.permit is None:
            rule = a.concurrency
            if rule is None:
                pol = after.policy
                rule = rule_for(None if pol is None else pol.concurrency, a.job, tenant)
            if rule is None:
                continue
            key, limit = rule
            ask = _ask_id(command_id, run_id)
            emit(m.RunAwaitsPermit(run_id=run_id, key=key, limit=limit, ask=ask))
            send(Send(limit_id(key), saga_command_id("permit-acquire", ask), m.AcquirePermit(
                key=key, run_id=run_id, schedule_id=after.schedule_id, ask=ask, limit=limit)))


def grant_received(state: ScheduleState, p: m.GrantPermit,
                   principal: str) -> Decision[m.ScheduleEvent]:
    """The key's grant reached the schedule: the run may be leased — or, when the run no
    longer makes that request, the permit goes straight back."""
    if principal != PROCESSOR:
        return Decision(status="forbidden", reason="only the processor grants permits")
    run = state.run(p.run_id)
    if run is not None and run.permit == p.ask and run.state in WANTS_PERMIT:
        if run.permitted:
            return Decision()  # the same grant twice
        return Decision(events=[m.RunPermitted(run_id=p.run_id, ask=p.ask)])
    return Decision(sends=[_release(p.key, p.run_id, state.schedule_id, p.ask)])


def evolve_run(run: Run, event: m.RunAwaitsPermit | m.RunPermitted | m.RunPermitReturned
               ) -> None:
    """Fold a schedule's permit event into its run."""
    match event:
        case m.RunAwaitsPermit():
            run.concurrency = (event.key, event.limit)
            run.permit = event.ask
            run.permitted = False
        case m.RunPermitted():
            run.permitted = True
        case m.RunPermitReturned():
            run.permit = None
            run.permitted = False


def _ask_id(command_id: str, run_id: str) -> str:
    """A request's name: one per decision and run (a run asks at most once per decision)."""
    return hashlib.blake2b(f"{command_id}\n{run_id}".encode(), digest_size=10).hexdigest()


def _release(key: str, run_id: str, schedule_id: str, ask: str) -> Send:
    return Send(limit_id(key), saga_command_id("permit-release", ask), m.ReleasePermit(
        key=key, run_id=run_id, schedule_id=schedule_id, ask=ask))


# ---------------------------------------------------------------------------------------
# the key's aggregate

PermitDecision = Decision[m.QuotaEvent]
PermitDraft = Draft[QuotaState, m.QuotaEvent]


def decide_permit(d: PermitDraft, p: m.AcquirePermit | m.ReleasePermit) -> None:
    """Decide a request or a release of the key's permits into the draft ``d``."""
    s = d.state
    if isinstance(p, m.AcquirePermit):
        held = s.holders.get(p.run_id)
        if held is not None and held[1] == p.ask:  # asked again: granted again
            _grant_send(d, p.key, p.run_id, held[0], p.ask)
            return
        if any(w[0] == p.run_id and w[2] == p.ask for w in s.waiting):
            return  # asked again: still in line
        if held is not None or any(w[0] == p.run_id for w in s.waiting):
            # an older request of the run, never given back: it ends here (one per run)
            _end(d, p.key, p.run_id)
        if len(s.holders) < p.limit and not s.waiting:
            _grant(d, p.key, p.run_id, p.schedule_id, p.ask, p.limit)
        else:
            d.emit(m.PermitQueued(key=p.key, run_id=p.run_id, schedule_id=p.schedule_id,
                                  ask=p.ask, limit=p.limit, holders=len(s.holders),
                                  position=len(s.waiting) + 1))
        return
    held = s.holders.get(p.run_id)
    if (held is not None and held[1] == p.ask) or any(
            w[0] == p.run_id and w[2] == p.ask for w in s.waiting):
        _end(d, p.key, p.run_id)


def _end(d: PermitDraft, key: str, run_id: str) -> None:
    """End the run's request (held or queued), then grant those next in line."""
    s = d.state
    held = s.holders.get(run_id)
    if held is not None:
        d.emit(m.PermitReleased(key=key, run_id=run_id, schedule_id=held[0], ask=held[1],
                                held=True, holders=len(s.holders) - 1))
    else:
        w = next(w for w in s.waiting if w[0] == run_id)
        d.emit(m.PermitReleased(key=key, run_id=run_id, schedule_id=w[1], ask=w[2],
                                held=False, holders=len(s.holders)))
    while s.waiting and len(s.holders) < s.waiting[0][3]:
        run, sid, ask, limit = s.waiting[0]
        _grant(d, key, run, sid, ask, limit)


def _grant(d: PermitDraft, key: str, run_id: str, schedule_id: str, ask: str,
           limit: int) -> None:
    d.emit(m.PermitGranted(key=key, run_id=run_id, schedule_id=schedule_id, ask=ask,
                           limit=limit, holders=len(d.state.holders) + 1))
    _grant_send(d, key, run_id, schedule_id, ask)


def _grant_send(d: PermitDraft, key: str, run_id: str, schedule_id: str, ask: str) -> None:
    d.send(Send(schedule_id, saga_command_id("permit-grant", ask),
                m.GrantPermit(key=key, run_id=run_id, ask=ask)))


def evolve_permit(state: QuotaState,
                  event: m.PermitGranted | m.PermitQueued | m.PermitReleased) -> None:
    """Fold one event of a key's permits into its state."""
    state.key = event.key
    match event:
        case m.PermitGranted():
            state.waiting = [w for w in state.waiting if w[0] != event.run_id]
            state.holders[event.run_id] = (event.schedule_id, event.ask)
        case m.PermitQueued():
            state.waiting = [*state.waiting, (event.run_id, event.schedule_id, event.ask,
                                              event.limit)]
        case m.PermitReleased():
            if event.held:
                state.holders.pop(event.run_id, None)
            else:
                state.waiting = [w for w in state.waiting if w[0] != event.run_id]
