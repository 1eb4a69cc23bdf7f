"""What each chronolog role may do on Kafka: its ACLs, as data.

On a broker with an authorizer and ``allow.everyone.if.no.acl.found=false`` a principal can
do only what an ACL grants it. Each process of a deployment runs as the principal of its
role (``CHRONOLOG_KAFKA_SASL_USERNAME``, ``chronolog.settings.kafka_auth_from_env``), and
``acls_for(role, principal, topics, pool)`` lists what that principal needs — read from
what the role's code does:

* every role: DESCRIBE and DESCRIBE_CONFIGS on the deployment's topics (metadata, end
  offsets, the durability check of ``ensure_topics``), DESCRIBE_CONFIGS on the cluster
  (the brokers' replication settings) and IDEMPOTENT_WRITE (the log's idempotent
  producer); CREATE on the prefix for the roles that create the topics (processor,
  operator), while the others find them created;
* processor: consumes ``commands`` in its group and writes, in transactions with ids
  ``<prefix>processor-p<N>``, ``events``, ``state``, ``replies``, ``ready.*`` (assignments)
  and ``commands`` (forwards, ticks); reads ``events``/``state``/``routing`` back when it
  takes a partition over; dead letters to ``dlq``; prunes its partitions of ``events``,
  ``commands``, ``replies`` and ``ready.*`` (DELETE; READ of the last two, for their
  records' age), once the audit checkpoint (reads ``audit``), the projectors and the
  effect runners (DESCRIBE on their groups) are past what goes;
* projector: reads ``events``, ``workers`` and ``dlq`` (its own offsets live in PostgreSQL;
  it publishes them as the offsets of the group ``<prefix>projector``);
* api: a client (writes ``commands``, reads ``replies`` in its own group ``<prefix>client-*``)
  that also reads ``events`` (recent events) and the processors' progress;
* effects: reads ``events`` in its group, a client of its own (``<prefix>effects-*``),
  writes ``effects.out`` (kafka effects: in transactions ``<prefix>effects-<member>``);
* worker: a client (``<prefix>worker-*``) and its membership records in ``workers``; reads
  its assignments in its consumer group: a pool-less worker ``ready.<class>`` in groups
  ``<prefix>workers.<digest>`` (every class; pool topics and pool groups denied), a worker
  of pool P only ``ready.pool-<P>.<class>`` in groups ``<prefix>workers.pool-<P>.*``;
* reader (replay, audit): reads ``events``, ``state``, ``routing``, and ``workers`` and
  ``dlq`` (replay rebuilds what the projector folds); reads and writes ``audit`` (the
  audit's checkpoint);
* operator (backup, restore, repartition): everything under the prefix.

What a holder of each role's credentials can still do is in docs/security.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from chronolog.log.port import Topics

ROLES = ("processor", "projector", "api", "effects", "worker", "reader", "operator")

# a pool's topics are ready.pool-<P>.<class>: a pool name with a dot would make one pool's
# prefix a prefix of another's ("a." of "a.b.")
POOL_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
PRINCIPAL_RE = re.compile(r"^User:[A-Za-z0-9._@-]{1,128}$")

# the Kafka protocol's codes (org.apache.kafka.common.resource / acl)
RESOURCE_TYPES = {"TOPIC": 2, "GROUP": 3, "CLUSTER": 4, "TRANSACTIONAL_ID": 5}
PATTERN_TYPES = {"LITERAL": 3, "PREFIXED": 4}
OPERATIONS = {"ALL": 2, "READ": 3, "WRITE": 4, "CREATE": 5, "DELETE": 6, "ALTER": 7,
              "DESCRIBE": 8, "DESCRIBE_CONFIGS": 10, "ALTER_CONFIGS": 11,
              "IDEMPOTENT_WRITE": 12}
PERMISSIONS = {"DENY": 2, "ALLOW": 3}
CLUSTER = "kafka-cluster"


@dataclass(frozen=True)
class Acl:
    principal: str
    resource: str  # TOPIC | GROUP | CLUSTER | TRANSACTIONAL_ID
    name: str
    pattern: str  # LITERAL | PREFIXED
    operation: str
    permission: str = "ALLOW"

    def kafka_acls_line(self, bootstrap: str = "BOOTSTRAP") -> str:
        """The ``kafka-acls.sh`` command line that adds it."""
        kind = {"TOPIC": f"--topic '{self.name}'", "GROUP": f"--group '{self.name}'",
                "CLUSTER": "--cluster",
                "TRANSACTIONAL_ID": f"--transactional-id '{self.name}'"}[self.resource]
        who = "--allow-principal" if self.permission == "ALLOW" else "--deny-principal"
        op = "".join(w.capitalize() for w in self.operation.split("_"))
        return (f"kafka-acls.sh --bootstrap-server {bootstrap} --add {who} '{self.principal}' "
                f"--operation {op} {kind} --resource-pattern-type {self.pattern.lower()}")

    def row(self) -> str:
        return (f"{self.permission:<5} {self.operation:<16} {self.resource:<16} "
                f"{self.pattern:<8} {self.name}")


class AclError(ValueError):
    """A bad role, principal or pool; the message names it."""


def acls_for(role: str, principal: str, topics: Topics, pool: str | None = None
             ) -> list[Acl]:
    """The ACLs of ``role`` for ``principal`` in the deployment of ``topics`` (``pool``:
    a worker's pool)."""
    if role not in ROLES:
        raise AclError(f"invalid role '{role}': expected one of {', '.join(ROLES)}")
    if not PRINCIPAL_RE.match(principal):
        raise AclError(f"invalid principal '{principal}': expected User:NAME")
    if pool is not None and role != "worker":
        raise AclError(f"invalid pool '{pool}': only a worker has a pool")
    if pool is not None and not POOL_RE.match(pool):
        raise AclError(f"invalid pool '{pool}': letters, digits, '_' and '-' only")
    p = topics.prefix
    out: list[Acl] = []

    def add(resource: str, name: str, pattern: str, *ops: str, deny: bool = False) -> None:
        for op in ops:
            out.append(Acl(principal, resource, name, pattern, op,
                           "DENY" if deny else "ALLOW"))

    def topic(name: str, *ops: str) -> None:
        add("TOPIC", name, "LITERAL", *ops)

    add("TOPIC", p, "PREFIXED", "DESCRIBE", "DESCRIBE_CONFIGS")
    # the log's shared producer is idempotent (InitProducerId) in every process, a reader's
    # too; it grants no topic
    add("CLUSTER", CLUSTER, "LITERAL", "DESCRIBE_CONFIGS", "IDEMPOTENT_WRITE")
    if role in ("processor", "operator"):
        add("TOPIC", p, "PREFIXED", "CREATE")

    def client(group_prefix: str) -> None:
        """A ``chronolog.client.Client``: commands out, replies in its own group."""
        topic(topics.commands, "WRITE")
        topic(topics.replies, "READ")
        topic(topics.routing, "READ")
        topic(topics.dlq, "WRITE")
        add("GROUP", f"{p}{group_prefix}", "PREFIXED", "READ", "DESCRIBE")

    if role == "processor":
        topic(topics.commands, "READ", "WRITE")
        topic(topics.events, "READ", "WRITE")
        topic(topics.state, "READ", "WRITE")
        topic(topics.replies, "WRITE")
        topic(topics.routing, "READ")
        topic(topics.dlq, "WRITE")
        add("TOPIC", f"{p}ready.", "PREFIXED", "WRITE")
        add("GROUP", topics.processor_group, "LITERAL", "READ", "DESCRIBE")
        add("TRANSACTIONAL_ID", f"{p}processor-p", "PREFIXED", "WRITE", "DESCRIBE")
        # pruning (chronolog.processors.pruning): it deletes old records of its partitions
        # of events, commands and replies once the audit's checkpoint (audit), the
        # projectors and the effect runners (their groups' offsets) are past them
        for name in (topics.events, topics.commands):
            add("TOPIC", name, "LITERAL", "DELETE")
        topic(topics.replies, "READ", "DELETE")  # its records' age (it writes them anyway)
        add("TOPIC", f"{p}ready.", "PREFIXED", "READ", "DELETE")
        topic(topics.audit, "READ")
        add("GROUP", topics.projector_group, "LITERAL", "DESCRIBE")
        add("GROUP", topics.effects_group, "LITERAL", "DESCRIBE")
    elif role == "projector":
        topic(topics.events, "READ")
        topic(topics.workers, "READ")
        topic(topics.dlq, "READ", "WRITE")  # dead letters are projected too
        # how far it has applied events, for the log's pruning (offsets stored, no member)
        add("GROUP", topics.projector_group, "LITERAL", "READ", "DESCRIBE")
    elif role == "api":
        client("client-")
        topic(topics.events, "READ")
        add("GROUP", topics.processor_group, "LITERAL", "DESCRIBE")
    elif role == "effects":
        client("effects-")
        topic(topics.events, "READ")
        topic(topics.effects, "WRITE")
        add("GROUP", topics.effects_group, "LITERAL", "READ", "DESCRIBE")
        # kafka effects: one transactional producer per runner (<prefix>effects-<member>);
        # an operator's destination topic outside the prefix needs its own WRITE
        add("TRANSACTIONAL_ID", f"{p}effects-", "PREFIXED", "WRITE", "DESCRIBE")
    elif role == "worker":
        client("worker-")
        topic(topics.workers, "WRITE")
        # consumer groups: pool-less workers <prefix>workers.<digest>, a pool's
        # <prefix>workers.pool-<P>.<digest> (chronolog.workers.runtime.worker_group): a
        # principal cannot join another pool's group and be handed its partitions
        if pool is None:
            add("GROUP", f"{p}workers.", "PREFIXED", "READ", "DESCRIBE")
            add("GROUP", f"{p}workers.pool-", "PREFIXED", "READ", deny=True)
            add("TOPIC", f"{p}ready.", "PREFIXED", "READ")
            add("TOPIC", f"{p}ready.pool-", "PREFIXED", "READ", deny=True)
        else:
            add("GROUP", f"{p}workers.pool-{pool}.", "PREFIXED", "READ", "DESCRIBE")
            add("TOPIC", f"{p}ready.pool-{pool}.", "PREFIXED", "READ")
    elif role == "reader":
        topic(topics.events, "READ")
        topic(topics.state, "READ")
        topic(topics.routing, "READ")
        topic(topics.workers, "READ")  # replay rebuilds what the projector folds
        topic(topics.dlq, "READ")
        topic(topics.audit, "READ", "WRITE")
    elif role == "operator":
        add("TOPIC", p, "PREFIXED", "ALL")
        add("GROUP", p, "PREFIXED", "ALL")
        add("TRANSACTIONAL_ID", p, "PREFIXED", "ALL")
    return list(dict.fromkeys(out))  # each once (a client's and a role's may coincide)


async def apply_acls(admin: object, acls: list[Acl]) -> None:
    """Create ``acls`` through a started ``AIOKafkaAdminClient`` (CreateAcls; aiokafka has
    the protocol message but no method for it). Raises ``AclError`` naming a refused one."""
    from aiokafka.protocol.admin import CreateAclsRequest

    send = admin._send_request  # type: ignore[attr-defined]
    for acl in acls:
        request = CreateAclsRequest(
            RESOURCE_TYPES[acl.resource], acl.name, PATTERN_TYPES[acl.pattern],
            acl.principal, "*", OPERATIONS[acl.operation], PERMISSIONS[acl.permission])
        response = await send(request)
        for result in response.creation_responses:
            code, message = result[0], result[1]
            if code != 0:
                raise AclError(f"the broker refused {acl.row().strip()!r}: error {code} "
                               f"{message or ''}".rstrip())
