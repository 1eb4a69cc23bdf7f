"""Email effects over SMTP (aiosmtplib): contract ``none`` — never an automatic resend.

SMTP offers no idempotency key, no lookup and no shared transaction: once the message text
has gone out after ``DATA``, a lost reply (disconnect, timeout) leaves it unknown whether the
server took responsibility for the message. So this adapter tracks the phase of the
conversation and classifies a failure by where it happened:

* before ``DATA`` (connect refused or timed out, greeting/EHLO/AUTH failure, ``MAIL FROM``
  or ``RCPT TO`` refused): nothing was transmitted. A 5xx reply is a permanent **failure**;
  a 4xx reply or a network error is **retry_later** (safe: nothing was sent);
* during ``DATA`` with a definitive reply (the server answered 4xx/5xx to ``DATA`` or to the
  end of the message): the server did not accept it — 5xx **failed**, 4xx **retry_later**;
* during ``DATA`` without a reply (disconnect, timeout, reset): **uncertain**. The runner
  records EffectUncertain and the run goes to RECONCILING; an operator decides
  (``chronolog reconcile resolve ... --decision delivered|retry|abandon``);
* a failure after the 250 reply to the message (``QUIT``) does not matter: **succeeded**.

Guarantee: at most one transmission of the message text per delivery attempt of the effect
(``EffectIntended.attempt``), and a second one only when an operator chooses ``retry``.
This is NOT exactly-once: a message the server accepted but whose reply was lost, then
resolved as ``retry`` by an operator, is delivered twice. The ``Message-ID`` header is
``<effect_id.attempt@chronolog>`` so recipients and mail logs can correlate duplicates.

Config: ``host`` (default 127.0.0.1), ``port`` (25), ``from``, ``to`` (address or list),
``subject`` (default ``chronolog result <run_id>``), ``timeout`` (30s), ``use_tls``,
``start_tls``, ``username``, ``password``. The body is the result as JSON (a string result
is sent as is).
"""

from __future__ import annotations

from email.message import EmailMessage
from typing import Any

import aiosmtplib
import orjson

from chronolog.domain import messages as m
from chronolog.effect_adapters.base import Contract, EffectContext, Outcome, Stopwatch, seconds


def build_message(intent: m.EffectIntended, payload: Any) -> tuple[EmailMessage, list[str]]:
    cfg = intent.config
    to = cfg.get("to") or []
    recipients = [to] if isinstance(to, str) else [str(x) for x in to]
    msg = EmailMessage()
    msg["From"] = cfg.get("from", "chronolog@localhost")
    msg["To"] = ", ".join(recipients)
    msg["Subject"] = cfg.get("subject") or f"chronolog result {intent.run_id}"
    msg["Message-ID"] = f"<{intent.effect_id}.{intent.attempt}@chronolog>"
    msg["X-Chronolog-Effect-Id"] = intent.effect_id
    msg["X-Chronolog-Run-Id"] = intent.run_id
    text = payload if isinstance(payload, str) else orjson.dumps(
        payload, option=orjson.OPT_INDENT_2).decode()
    msg.set_content(text)
    return msg, recipients


class EmailEffectAdapter:
    """SMTP delivery; contract ``none`` (ambiguity after DATA becomes uncertain)."""

    kind = "email"

    @property
    def contract(self) -> Contract:
        return "none"

    async def close(self) -> None:
        return None

    async def perform(
        self, intent: m.EffectIntended, payload: Any, ctx: EffectContext | None = None
    ) -> Outcome:
        cfg = intent.config
        msg, recipients = build_message(intent, payload)
        if not recipients:
            return Outcome.failed(reason="config: no recipient ('to')")
        sw = Stopwatch()
        base: dict[str, Any] = {"contract": "none", "message_id": msg["Message-ID"],
                                "recipients": recipients}
        smtp = aiosmtplib.SMTP(
            hostname=cfg.get("host", "127.0.0.1"), port=int(cfg.get("port", 25)),
            timeout=seconds(cfg.get("timeout"), 30.0), use_tls=bool(cfg.get("use_tls", False)),
            start_tls=cfg.get("start_tls"),
        )
        phase = "connect"
        try:
            await smtp.connect()
            if cfg.get("username"):
                phase = "auth"
                await smtp.login(cfg["username"], cfg.get("password", ""))
            phase = "mail"
            await smtp.mail(str(msg["From"]))
            phase = "rcpt"
            for r in recipients:
                await smtp.rcpt(r)
            phase = "data"  # from here on the message text may be transmitted
            resp = await smtp.data(msg.as_bytes())
        except aiosmtplib.SMTPResponseException as exc:
            # a definitive reply: the server did not accept the message
            ev = {**base, "phase": phase, "smtp_code": exc.code, "smtp_message": exc.message,
                  "elapsed_ms": sw.ms()}
            smtp.close()
            if exc.code >= 500:
                return Outcome.failed(**ev)
            return Outcome.retry_later(**ev)
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
            smtp.close()
            ev = {**base, "phase": phase, "error": f"{type(exc).__name__}: {exc}",
                  "elapsed_ms": sw.ms()}
            if phase == "data":
                return Outcome.uncertain(
                    **ev, reason="connection lost after DATA: the server may have accepted the "
                    "message; SMTP has no idempotency or lookup, so it is not re-sent")
            return Outcome.retry_later(**ev, reason="failed before DATA; nothing was sent")
        try:
            await smtp.quit()
        except (aiosmtplib.SMTPException, OSError, TimeoutError):
            smtp.close()  # the message was already accepted (250)
        return Outcome.succeeded(**base, phase="done", smtp_code=resp.code,
                                 smtp_message=resp.message, elapsed_ms=sw.ms())
