#!/usr/bin/env bash
# Run Apache Kafka in KRaft mode on loopback for tests and development — one node
# (broker+controller), or a cluster of three — without Docker and without a tarball download:
# the broker's jars come from Maven Central.
#
#   scripts/kafka.sh up [--brokers N]  fetch the jars (cached), format fresh storage, start,
#                                      wait ready (N = 1, the default, or 3)
#   scripts/kafka.sh down              stop every broker this script started (by PID), drop data
#   scripts/kafka.sh status            say whether it runs and where
#   scripts/kafka.sh stop [NODE]       stop it (SIGTERM by PID; one node of a cluster), keep data
#   scripts/kafka.sh start [NODE]      start it again on the kept data (the same log), or fresh
#   scripts/kafka.sh kill NODE         kill -9 one node (by PID) and wait until it is gone
#   scripts/kafka.sh pid NODE          print one node's PID
#   scripts/kafka.sh up --sasl         (or KAFKA_SASL=1) one node whose clients authenticate
#                                      (SASL/SCRAM) and are authorized by ACLs (see below)
#
# A cluster (`up --brokers 3`) runs three KRaft nodes, each broker and controller (a 3-voter
# controller quorum), each with its own data directory, ports and PID under
# $KAFKA_STATE_DIR/node-<id>/; node ids are 1..3. Replication is that of a production cluster:
# default.replication.factor=3, min.insync.replicas=2, the offsets and transaction state topics
# replicated 3 with min ISR 2, unclean.leader.election.enable=false. Ports: KAFKA_PORTS and
# KAFKA_CONTROLLER_PORTS (comma-separated, one per node) or, by default, KAFKA_PORT + 2*(id-1)
# and KAFKA_CONTROLLER_PORT + 2*(id-1) (19092/19093, 19094/19095, 19096/19097). The bootstrap
# file lists every node. A single node keeps the layout below (no node-<id> directory).
#
# Everything lives under .kafka/ (git-ignored):
#   .kafka/libs-<version>/   the broker's runtime classpath (+ a .complete marker)
#   .kafka/pom-<version>.xml the generated pom used to fetch it
#   .kafka/data/             KRaft metadata + log dirs (fresh on every `up`, removed by `down`)
#   .kafka/server.properties, .kafka/log4j2.properties (4.x) or .kafka/log4j.properties (3.x)
#   .kafka/broker.pid, .kafka/bootstrap ("127.0.0.1:<port>"), .kafka/broker.log, .kafka/broker.out
#
# KAFKA_STATE_DIR moves one broker's config, data, logs and PID out of .kafka/ (several brokers
# of one checkout each get their own; the jars stay shared in .kafka/libs-<version>/).
#
# SASL (`up --sasl`, single node): the client listener is SASL_PLAINTEXT with
# KAFKA_SASL_MECHANISM (SCRAM-SHA-512, or SCRAM-SHA-256); the StandardAuthorizer with
# allow.everyone.if.no.acl.found=false, so a principal can do only what an ACL grants it;
# User:admin is the super user (the broker itself, and operators). The controller listener
# authenticates with SASL/PLAIN as admin (KRaft controllers cannot check SCRAM: the SCRAM
# credentials live in the metadata they serve). SCRAM users are created at format time
# (`StorageTool format --add-scram`): admin with a random password, and KAFKA_SASL_USERS
# ("name:password name2:password2", optional). Written under the state dir, mode 0600:
# admin.password, sasl.mechanism (and server.properties, which holds the password too).
#
# Environment: KAFKA_VERSION (default below), KAFKA_HOST (127.0.0.1; another loopback address
# such as 127.0.0.2 for a broker killed and restarted under running clients: on 127.0.0.1 a
# client retrying its connection can get the broker's port as its own source port and connect
# to itself, holding the port so that the broker cannot start again), KAFKA_PORT (19092),
# KAFKA_CONTROLLER_PORT (19093), KAFKA_HOSTS (a cluster: one address per node, comma-separated,
# instead of KAFKA_HOST for all — e.g. each node in a network namespace of its own),
# KAFKA_EXEC (a cluster: one command prefix per node, comma-separated, that the node's JVM is
# started under — e.g. "ip netns exec ns1 setpriv --regid 3911 --clear-groups"),
# KAFKA_READY_TIMEOUT seconds (120), KAFKA_HEAP (512m), KAFKA_EXTRA_CONFIG (extra server
# properties, one key=value per line), KAFKA_JVM_OPTS (the JVM's collector and compiler flags;
# default G1 with a 20 ms pause goal — 5 ms and ZGC measured no better p99; `make test` uses
# the serial collector and the C1 compiler alone, below), KAFKA_MVN_ARGS (extra mvn arguments,
# e.g. -Dmaven.repo.local=/tmp/m2 to time a cold cache).
#
# Default version: 4.4.0, the newest kafka_2.13 served here, because chronolog's whole suite
# passes against it — the EventLog contract suite, the Kafka-specific tests (aiokafka
# transactions, zombie fencing, send_offsets_to_transaction, read_committed) and every
# processor/worker/effect fault test (610 tests, `KAFKA_VERSION=4.4.0 make test`). 4.1.2
# passes too (KAFKA_VERSION=4.1.2). The 3.9.x path (reload4j logging) is kept for
# KAFKA_VERSION=3.9.x where Maven serves it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KDIR="$ROOT/.kafka"
VERSION="${KAFKA_VERSION:-4.4.0}"
HOST="${KAFKA_HOST:-127.0.0.1}"  # a loopback address
PORT="${KAFKA_PORT:-19092}"
CPORT="${KAFKA_CONTROLLER_PORT:-19093}"
READY_TIMEOUT="${KAFKA_READY_TIMEOUT:-120}"
HEAP="${KAFKA_HEAP:-512m}"
LOG4J2_VERSION="2.24.3"
# kafka_2.13 4.x still pulls slf4j-api 1.7.x, which cannot see log4j-slf4j2-impl: pin 2.0.x
SLF4J2_VERSION="2.0.16"
LIBS="$KDIR/libs-$VERSION"
STATE="${KAFKA_STATE_DIR:-$KDIR}"  # this broker's config, data, logs, PID (jars are shared)
# the node selected by use_node (a single broker: $STATE itself; a cluster: $STATE/node-<id>)
NSTATE="$STATE"
NHOST="$HOST"
NODE_ID=1
NPORT="$PORT"
NCPORT="$CPORT"
DATA="$NSTATE/data"
PIDFILE="$NSTATE/broker.pid"
BROKERS=1
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || PY="python3"

log() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

major() { printf '%s' "${VERSION%%.*}"; }

nth() {  # nth "a,b,c" 2 -> b
    printf '%s' "$1" | cut -d, -f"$2"
}

node_host() {  # the address of node $1: its entry in KAFKA_HOSTS, else KAFKA_HOST
    if [ -n "${KAFKA_HOSTS:-}" ] && [ "$BROKERS" -gt 1 ]; then nth "$KAFKA_HOSTS" "$1"
    else printf '%s' "$HOST"; fi
}

node_exec() {  # the command prefix node $1 is started under (KAFKA_EXEC), word-split
    if [ -n "${KAFKA_EXEC:-}" ] && [ "$BROKERS" -gt 1 ]; then nth "$KAFKA_EXEC" "$1"; fi
}

node_port() {  # the broker (kind=broker) or controller port of node $2
    local kind="$1" i="$2" list base
    if [ "$kind" = broker ]; then list="${KAFKA_PORTS:-}"; base="$PORT"
    else list="${KAFKA_CONTROLLER_PORTS:-}"; base="$CPORT"; fi
    if [ -n "$list" ]; then nth "$list" "$i"; else printf '%s' $((base + 2 * (i - 1))); fi
}

load_brokers() {
    # the size of the cluster: `up --brokers N`, else what the last `up` recorded, else 1
    if [ -n "${WANT_BROKERS:-}" ]; then
        BROKERS="$WANT_BROKERS"
    elif [ -f "$STATE/brokers" ]; then
        BROKERS="$(cat "$STATE/brokers")"
    else
        BROKERS=1
    fi
    [[ "$BROKERS" =~ ^[13]$ ]] || die "--brokers must be 1 or 3 (got '$BROKERS')"
    # a cluster's ports are those of its `up` (recorded), unless given again
    if [ -z "${WANT_BROKERS:-}" ] && [ -f "$STATE/ports" ]; then
        if [ "$BROKERS" -gt 1 ]; then
            [ -n "${KAFKA_PORTS:-}" ] || KAFKA_PORTS="$(cat "$STATE/ports")"
            [ -n "${KAFKA_CONTROLLER_PORTS:-}" ] \
                || KAFKA_CONTROLLER_PORTS="$(cat "$STATE/controller-ports")"
        else
            [ -n "${KAFKA_PORT:-}" ] || PORT="$(cat "$STATE/ports")"
            [ -n "${KAFKA_CONTROLLER_PORT:-}" ] || CPORT="$(cat "$STATE/controller-ports")"
        fi
    fi
    return 0
}

record_ports() {
    local i b="" c=""
    if [ "$BROKERS" -eq 1 ]; then
        echo "$PORT" >"$STATE/ports"; echo "$CPORT" >"$STATE/controller-ports"; return 0
    fi
    for i in $(seq 1 "$BROKERS"); do
        b="$b${b:+,}$(node_port broker "$i")"; c="$c${c:+,}$(node_port controller "$i")"
    done
    echo "$b" >"$STATE/ports"
    echo "$c" >"$STATE/controller-ports"
}

use_node() {  # select node $1: NSTATE, NODE_ID, NHOST, NPORT, NCPORT, DATA, PIDFILE
    local i="$1"
    NHOST="$HOST"
    if [ "$BROKERS" -eq 1 ]; then
        NSTATE="$STATE"; NODE_ID=1; NPORT="$PORT"; NCPORT="$CPORT"
    else
        NHOST="$(node_host "$i")"
        [[ "$i" =~ ^[0-9]+$ ]] && [ "$i" -ge 1 ] && [ "$i" -le "$BROKERS" ] \
            || die "no node '$i' (nodes are 1..$BROKERS)"
        NSTATE="$STATE/node-$i"; NODE_ID="$i"
        NPORT="$(node_port broker "$i")"; NCPORT="$(node_port controller "$i")"
    fi
    DATA="$NSTATE/data"
    PIDFILE="$NSTATE/broker.pid"
}

voters() {
    local i out=""
    for i in $(seq 1 "$BROKERS"); do
        out="$out${out:+,}$i@$(node_host "$i"):$(if [ "$BROKERS" -eq 1 ]; then printf '%s' "$CPORT"; else node_port controller "$i"; fi)"
    done
    printf '%s' "$out"
}

bootstrap_list() {
    local i out=""
    for i in $(seq 1 "$BROKERS"); do
        out="$out${out:+,}$(node_host "$i"):$(if [ "$BROKERS" -eq 1 ]; then printf '%s' "$PORT"; else node_port broker "$i"; fi)"
    done
    printf '%s' "$out"
}

running_pid() {
    # Prints the recorded PID if that process is alive and is our java broker.
    [ -f "$PIDFILE" ] || return 1
    local pid
    pid="$(cat "$PIDFILE")"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    # Guard against PID reuse: the command line must be our kafka.Kafka with our config.
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "kafka.Kafka $NSTATE/server.properties" \
        || return 1
    printf '%s' "$pid"
}

write_pom() {
    local logging
    if [ "$(major)" -ge 4 ]; then
        logging="
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>$LOG4J2_VERSION</version><scope>runtime</scope></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>$LOG4J2_VERSION</version><scope>runtime</scope></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-api</artifactId><version>$LOG4J2_VERSION</version><scope>runtime</scope></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>$SLF4J2_VERSION</version><scope>runtime</scope></dependency>"
    else
        logging="
    <dependency><groupId>ch.qos.reload4j</groupId><artifactId>reload4j</artifactId><version>1.2.25</version><scope>runtime</scope></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-reload4j</artifactId><version>1.7.36</version><scope>runtime</scope></dependency>"
    fi
    cat >"$KDIR/pom-$VERSION.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by scripts/kafka.sh: only used to fetch the Kafka broker's runtime jars. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.chronolog</groupId>
  <artifactId>kafka-broker-fetch</artifactId>
  <version>$VERSION</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$VERSION</version></dependency>$logging
  </dependencies>
</project>
EOF
}

fetch() {
    if [ -f "$LIBS/.complete" ]; then
        return 0
    fi
    command -v mvn >/dev/null || die "mvn not found (Maven is needed to fetch the broker)"
    command -v java >/dev/null || die "java not found (the broker needs Java 17+)"
    log "fetching kafka_2.13:$VERSION from Maven Central into ${LIBS#"$ROOT"/}"
    rm -rf "$LIBS"
    write_pom
    # shellcheck disable=SC2086  # KAFKA_MVN_ARGS is deliberately word-split
    mvn -B -q -Dstyle.color=never -f "$KDIR/pom-$VERSION.xml" ${KAFKA_MVN_ARGS:-} \
        org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$LIBS" >"$KDIR/mvn.out" 2>&1 \
        || { cat "$KDIR/mvn.out" >&2; die "mvn could not fetch kafka_2.13:$VERSION"; }
    ls "$LIBS"/kafka_2.13-"$VERSION".jar "$LIBS"/kafka-clients-*.jar >/dev/null 2>&1 \
        || die "fetched classpath lacks kafka_2.13/kafka-clients jars"
    if [ "$(major)" -ge 4 ]; then
        ls "$LIBS"/log4j-core-*.jar "$LIBS"/log4j-api-*.jar "$LIBS"/log4j-slf4j2-impl-*.jar \
            "$LIBS"/slf4j-api-2.*.jar >/dev/null 2>&1 \
            || die "fetched classpath lacks log4j-core/api/slf4j2-impl or slf4j-api 2.x"
    fi
    touch "$LIBS/.complete"
}

sasl_on() { [ "${SASL:-0}" = 1 ]; }

listener_config() {
    if ! sasl_on; then
        cat <<EOF
listeners=PLAINTEXT://$NHOST:$NPORT,CONTROLLER://$NHOST:$NCPORT
advertised.listeners=PLAINTEXT://$NHOST:$NPORT
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
EOF
        return 0
    fi
    local pw mech lower
    pw="$(cat "$STATE/admin.password")"
    mech="$(cat "$STATE/sasl.mechanism")"
    lower="${mech,,}"
    cat <<EOF
listeners=SASL_PLAINTEXT://$NHOST:$NPORT,CONTROLLER://$NHOST:$NCPORT
advertised.listeners=SASL_PLAINTEXT://$NHOST:$NPORT
controller.listener.names=CONTROLLER
listener.security.protocol.map=SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT
inter.broker.listener.name=SASL_PLAINTEXT
sasl.enabled.mechanisms=$mech
sasl.mechanism.inter.broker.protocol=$mech
listener.name.sasl_plaintext.sasl.enabled.mechanisms=$mech
listener.name.sasl_plaintext.$lower.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$pw";
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$pw" user_admin="$pw";
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin
EOF
}

sasl_setup() {
    # a fresh admin password and the mechanism, for a fresh `up --sasl` (0600)
    local mech="${KAFKA_SASL_MECHANISM:-SCRAM-SHA-512}"
    [[ "$mech" =~ ^SCRAM-SHA-(256|512)$ ]] \
        || die "KAFKA_SASL_MECHANISM must be SCRAM-SHA-512 or SCRAM-SHA-256 (got '$mech')"
    (umask 077
     "$PY" -c 'import secrets; print(secrets.token_urlsafe(24))' >"$STATE/admin.password"
     echo "$mech" >"$STATE/sasl.mechanism")
    echo 1 >"$STATE/sasl"
}

scram_args() {
    # StorageTool --add-scram arguments: admin, then each KAFKA_SASL_USERS "name:password"
    local mech pair
    mech="$(cat "$STATE/sasl.mechanism")"
    printf '%s\n' --add-scram "$mech=[name=admin,password=$(cat "$STATE/admin.password")]"
    for pair in ${KAFKA_SASL_USERS:-}; do
        [[ "$pair" =~ ^[A-Za-z0-9._-]+:[A-Za-z0-9._~-]+$ ]] \
            || die "KAFKA_SASL_USERS: '$pair' is not name:password (letters, digits, ._-~)"
        printf '%s\n' --add-scram "$mech=[name=${pair%%:*},password=${pair#*:}]"
    done
}

write_config() {
    mkdir -p "$DATA"
    (umask 077; : >"$NSTATE/server.properties")
    # replication: 1 on a single node; a cluster replicates as production does (3, min ISR 2)
    local rf=1 isr=1
    if [ "$BROKERS" -ge 3 ]; then rf=3; isr=2; fi
    cat >"$NSTATE/server.properties" <<EOF
# Generated by scripts/kafka.sh (KRaft node $NODE_ID of $BROKERS on loopback, for tests).
process.roles=broker,controller
node.id=$NODE_ID
controller.quorum.voters=$(voters)
$(listener_config)
log.dirs=$DATA/logs
metadata.log.dir=$DATA/meta
auto.create.topics.enable=false
num.partitions=1
default.replication.factor=$rf
min.insync.replicas=$isr
unclean.leader.election.enable=false
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
transaction.abort.timed.out.transaction.cleanup.interval.ms=2000
transaction.remove.expired.transaction.cleanup.interval.ms=60000
# small and quick: tests create many short-lived topics
log.segment.bytes=16777216
log.index.size.max.bytes=1048576
offsets.topic.segment.bytes=16777216
transaction.state.log.segment.bytes=16777216
auto.leader.rebalance.enable=false
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
background.threads=4
log.cleaner.threads=1
log.cleaner.dedupe.buffer.size=8388608
delete.topic.enable=true
EOF
    # KAFKA_EXTRA_CONFIG: extra server properties, one "key=value" per line (experiments)
    if [ -n "${KAFKA_EXTRA_CONFIG:-}" ]; then
        printf '%s\n' "$KAFKA_EXTRA_CONFIG" >>"$NSTATE/server.properties"
    fi
    cat >"$NSTATE/log4j2.properties" <<EOF
# Generated by scripts/kafka.sh: broker logs at WARN into .kafka/broker.log
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = $NSTATE/broker.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = FILE
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
EOF
    if sasl_on; then  # each refused operation, with its principal and resource
        cat >>"$NSTATE/log4j2.properties" <<EOF
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = INFO
EOF
    fi
    cat >"$NSTATE/log4j.properties" <<EOF
# Generated by scripts/kafka.sh (Kafka 3.x / reload4j): WARN into .kafka/broker.log
log4j.rootLogger=WARN, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=$NSTATE/broker.log
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.server.KafkaRaftServer=INFO
EOF
}

cluster_id() {
    # Kafka's Uuid.randomUuid() rendered as URL-safe base64 without padding, as
    # `kafka-storage.sh random-uuid` prints it (avoiding a leading '-', like Kafka does);
    # done in Python to save a JVM start.
    "$PY" - <<'EOF'
import base64, uuid
while True:
    s = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not s.startswith("-"):
        print(s)
        break
EOF
}

port_busy() {
    (exec 3<>"/dev/tcp/${NHOST:-$HOST}/$1") 2>/dev/null
}

broker_answers() {
    # $1: bootstrap servers; $2: the number of brokers the metadata must list
    local auth=()
    if sasl_on; then auth=("$(cat "$STATE/sasl.mechanism")" "$(cat "$STATE/admin.password")"); fi
    "$PY" - "$1" "$2" "${auth[@]}" <<'PYEOF' 2>/dev/null
import asyncio, sys
from aiokafka.admin import AIOKafkaAdminClient

async def main() -> None:
    auth = {}
    if len(sys.argv) > 3:
        auth = dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism=sys.argv[3],
                    sasl_plain_username="admin", sasl_plain_password=sys.argv[4])
    admin = AIOKafkaAdminClient(bootstrap_servers=sys.argv[1], request_timeout_ms=5000,
                                **auth)
    await asyncio.wait_for(admin.start(), 10)
    try:
        await asyncio.wait_for(admin.list_topics(), 10)
        cluster = await asyncio.wait_for(admin.describe_cluster(), 10)
        if len(cluster["brokers"]) < int(sys.argv[2]):
            raise SystemExit(1)
    finally:
        await admin.close()

asyncio.run(main())
PYEOF
}

wait_ready() {
    # $1: the selected node's PID; $2: how many brokers its metadata must list
    local pid="$1" want="${2:-1}" deadline=$((SECONDS + READY_TIMEOUT))
    while [ "$SECONDS" -lt "$deadline" ]; do
        if ! kill -0 "$pid" 2>/dev/null; then
            log "broker $NODE_ID exited during startup; last lines of its output:"
            tail -n 30 "$NSTATE/broker.out" "$NSTATE/broker.log" >&2 2>/dev/null || true
            rm -f "$PIDFILE"
            return 1
        fi
        if port_busy "$NPORT" && broker_answers "$NHOST:$NPORT" "$want"; then
            return 0
        fi
        sleep 0.5
    done
    log "broker $NODE_ID not ready within ${READY_TIMEOUT}s; last lines of its log:"
    tail -n 30 "$NSTATE/broker.out" "$NSTATE/broker.log" >&2 2>/dev/null || true
    return 1
}

jvm_log_option() {
    if [ "$(major)" -ge 4 ]; then
        printf '%s' "-Dlog4j2.configurationFile=$NSTATE/log4j2.properties"
    else
        printf '%s' "-Dlog4j.configuration=file:$NSTATE/log4j.properties"
    fi
}

launch_node() {
    # format (mode fresh, with cluster id $2) and start the selected node; its PID in LAUNCHED
    local mode="$1" cid="$2"
    mkdir -p "$NSTATE"
    if port_busy "$NPORT" || port_busy "$NCPORT"; then
        die "port $NPORT or $NCPORT on $NHOST is taken by a process this script did not start" \
            "(set KAFKA_PORT / KAFKA_CONTROLLER_PORT, or KAFKA_PORTS / KAFKA_CONTROLLER_PORTS)"
    fi
    if [ "$mode" = fresh ]; then
        rm -rf "$DATA" "$NSTATE/broker.log" "$NSTATE/broker.out"
    fi
    write_config
    local cp="$LIBS/*" logopt
    logopt="$(jvm_log_option)"
    # KAFKA_JVM_OPTS: the collector and compiler flags; word-split on purpose
    # shellcheck disable=SC2206
    local gc=(${KAFKA_JVM_OPTS:--XX:+UseG1GC -XX:MaxGCPauseMillis=20})
    local jvm=(java "-Xmx$HEAP" -Xms128m "${gc[@]}"
        -Djava.awt.headless=true "$logopt" -cp "$cp")
    # a short-lived JVM: C1 only and the serial GC start faster
    if [ "$mode" = fresh ]; then
        local scram=()
        if sasl_on; then mapfile -t scram < <(scram_args); fi
        (umask 077; : >"$NSTATE/format.out")  # it prints the SCRAM credentials' keys
        java -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC "$logopt" -cp "$cp" \
            kafka.tools.StorageTool format -t "$cid" "${scram[@]}" \
            -c "$NSTATE/server.properties" --ignore-formatted >"$NSTATE/format.out" 2>&1 \
            || { cat "$NSTATE/format.out" >&2; die "StorageTool format failed (node $NODE_ID)"; }
    fi
    local prefix=()
    # shellcheck disable=SC2207  # a command prefix, word-split on purpose
    prefix=($(node_exec "$NODE_ID"))
    nohup setsid "${prefix[@]}" "${jvm[@]}" kafka.Kafka "$NSTATE/server.properties" \
        >"$NSTATE/broker.out" 2>&1 </dev/null 9>&- &
    LAUNCHED=$!
    echo "$LAUNCHED" >"$PIDFILE"
}

node_mode() {
    # fresh unless the selected node has kept data from an earlier `up`
    if [ "$1" = keep ] && [ -d "$DATA/meta" ] && [ -f "$NSTATE/server.properties" ]; then
        printf keep
    else
        printf fresh
    fi
}

start_nodes() {
    # start the nodes "$@" (mode $MODE: fresh formats them), then wait until each is ready
    local t0=$SECONDS i pid cid=""
    mkdir -p "$KDIR" "$STATE"
    fetch
    declare -A pids=()
    for i in "$@"; do
        use_node "$i"
        if pid="$(running_pid)"; then
            log "node $i already running (pid $pid)"
            continue
        fi
        local mode
        mode="$(node_mode "$MODE")"
        if [ "$mode" = fresh ] && [ -z "$cid" ]; then
            # one cluster id for every node formatted together; a node re-formatted alone
            # joins the id its peers were formatted with
            if [ -f "$STATE/cluster.id" ] && [ "$MODE" = keep ]; then cid="$(cat "$STATE/cluster.id")"
            else cid="$(cluster_id)"; echo "$cid" >"$STATE/cluster.id"; fi
        fi
        launch_node "$mode" "$cid"
        pids[$i]="$LAUNCHED"
    done
    local want=1
    [ "$BROKERS" -gt 1 ] && [ "$#" -eq "$BROKERS" ] && want="$BROKERS"
    for i in "${!pids[@]}"; do
        use_node "$i"
        if ! wait_ready "${pids[$i]}" "$want"; then
            for i in "${!pids[@]}"; do stop_pid "${pids[$i]}"; done
            die "kafka $VERSION did not start (node $NODE_ID)"
        fi
    done
    echo "$(bootstrap_list)" >"$STATE/bootstrap"
    echo "$VERSION" >"$STATE/version"
    echo "$BROKERS" >"$STATE/brokers"
    if [ "$BROKERS" -eq 1 ]; then
        log "kafka $VERSION ready at $(bootstrap_list) (pid $(cat "$PIDFILE")) in $((SECONDS - t0))s"
    else
        log "kafka $VERSION: nodes $* of $BROKERS ready, bootstrap $(bootstrap_list)" \
            "in $((SECONDS - t0))s"
    fi
}

all_nodes() { seq 1 "$BROKERS"; }

cmd_up() {
    # a fresh cluster: nodes of an earlier one stopped and their data dropped first
    load_brokers
    local pid i
    for i in $(all_nodes); do
        use_node "$i"
        if pid="$(running_pid)"; then
            log "already running (pid $pid) at $(cat "$STATE/bootstrap" 2>/dev/null)"
            return 0
        fi
    done
    rm -f "$STATE/bootstrap" "$STATE/sasl" "$STATE/admin.password" "$STATE/sasl.mechanism"
    record_ports
    if sasl_on; then
        [ "$BROKERS" -eq 1 ] || die "--sasl runs a single node (not --brokers $BROKERS)"
        sasl_setup
    fi
    MODE=fresh start_nodes $(all_nodes)
}

cmd_start() {
    # start again on the data of an earlier `up` (after `stop`, or a kill): the same log
    load_brokers
    if [ -n "${1:-}" ]; then MODE=keep start_nodes "$1"; else MODE=keep start_nodes $(all_nodes); fi
}

stop_pid() {
    local pid="$1" deadline
    kill -TERM "$pid" 2>/dev/null || return 0
    deadline=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
        sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "broker $pid ignored SIGTERM for 30s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
}

stop_nodes() {
    # SIGTERM to every node "$@" at once (a controller quorum stopped one node at a time loses
    # its majority, and the last nodes then wait for it in their controlled shutdown), then
    # wait up to $STOP_WAIT s (30) for them all; SIGKILL to any still running
    local i pid deadline
    declare -A pids=()
    for i in "$@"; do
        use_node "$i"
        if pid="$(running_pid)"; then
            pids[$i]="$pid"
            kill -TERM "$pid" 2>/dev/null || true
        else
            log "no broker $NODE_ID started by this script is running"
        fi
        rm -f "$PIDFILE"
    done
    deadline=$((SECONDS + ${STOP_WAIT:-30}))
    for i in "${!pids[@]}"; do
        while kill -0 "${pids[$i]}" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
            sleep 0.2
        done
        if kill -0 "${pids[$i]}" 2>/dev/null; then
            log "broker $i (pid ${pids[$i]}) ignored SIGTERM for ${STOP_WAIT:-30}s; sending SIGKILL"
            kill -KILL "${pids[$i]}" 2>/dev/null || true
        fi
        log "stopped broker $i (pid ${pids[$i]})"
    done
}

cmd_stop() {
    # stop (SIGTERM, by PID) one node or all, keep their data for `start`
    load_brokers
    if [ -n "${1:-}" ]; then stop_nodes "$1"; else stop_nodes $(all_nodes); fi
}

cmd_kill() {
    # kill -9 one node by PID and wait until it is gone (its data kept for `start`)
    load_brokers
    [ -n "${1:-}" ] || die "usage: kill NODE"
    use_node "$1"
    local pid deadline
    pid="$(running_pid)" || die "node $1 is not running"
    kill -KILL "$pid"
    deadline=$((SECONDS + 30))
    while [ -e "/proc/$pid" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.05; done
    rm -f "$PIDFILE"
    log "killed broker $NODE_ID (pid $pid)"
}

cmd_pid() {
    load_brokers
    use_node "${1:-1}"
    running_pid || { log "node ${1:-1} is not running"; return 1; }
    echo
}

cmd_down() {
    load_brokers
    local i
    # the data goes too: no need to wait long for a clean shutdown
    STOP_WAIT=10 stop_nodes $(all_nodes)
    for i in $(all_nodes); do
        use_node "$i"
        rm -rf "$DATA" "$PIDFILE"
    done
    rm -f "$STATE/bootstrap" "$STATE/version" "$STATE/brokers" "$STATE/cluster.id" \
        "$STATE/ports" "$STATE/controller-ports" "$STATE/sasl" "$STATE/admin.password" \
        "$STATE/sasl.mechanism"
}

cmd_status() {
    load_brokers
    local i pid up=0
    for i in $(all_nodes); do
        use_node "$i"
        if pid="$(running_pid)"; then
            up=$((up + 1))
            [ "$BROKERS" -gt 1 ] && echo "node $i running pid=$pid port=$NPORT"
        elif [ "$BROKERS" -gt 1 ]; then
            echo "node $i stopped"
        fi
    done
    if [ "$up" -eq 0 ]; then
        echo "stopped"
        return 1
    fi
    use_node 1
    echo "running brokers=$up/$BROKERS pid=$(running_pid || true) bootstrap=$(cat "$STATE/bootstrap" 2>/dev/null) version=$(cat "$STATE/version" 2>/dev/null)"
}

with_lock() {
    mkdir -p "$STATE"
    # Serialize concurrent up/down calls (e.g. two test runners starting at once).
    mkdir -p "$KDIR"
    if command -v flock >/dev/null; then
        exec 9>"$STATE/.lock"
        flock -w "$((READY_TIMEOUT + 60))" 9 || die "another kafka.sh holds $STATE/.lock"
    fi
    "$@"
}

COMMAND="${1:-}"
shift || true
WANT_BROKERS="${KAFKA_BROKERS:-}"
SASL="${KAFKA_SASL:-0}"
# a broker brought up with --sasl starts again (start) with it
if [ "$COMMAND" != up ] && [ -f "$STATE/sasl" ]; then SASL=1; fi
ARGS=()
while [ "$#" -gt 0 ]; do
    case "$1" in
        --brokers) WANT_BROKERS="${2:-}"; shift 2 || die "--brokers needs a number" ;;
        --brokers=*) WANT_BROKERS="${1#--brokers=}"; shift ;;
        --sasl) SASL=1; shift ;;
        *) ARGS+=("$1"); shift ;;
    esac
done
if [ "$COMMAND" != up ] && [ -n "$WANT_BROKERS" ] && [ -f "$STATE/brokers" ] \
        && [ "$WANT_BROKERS" != "$(cat "$STATE/brokers")" ]; then
    die "the cluster in $STATE has $(cat "$STATE/brokers") broker(s), not $WANT_BROKERS"
fi

case "$COMMAND" in
    up) with_lock cmd_up ;;
    down) with_lock cmd_down ;;
    start) with_lock cmd_start "${ARGS[@]}" ;;
    stop) with_lock cmd_stop "${ARGS[@]}" ;;
    kill) with_lock cmd_kill "${ARGS[@]}" ;;
    pid) cmd_pid "${ARGS[@]}" ;;
    status) cmd_status ;;
    *) echo "usage: $0 up [--brokers 1|3] [--sasl]|down|start [NODE]|stop [NODE]|kill NODE|pid NODE|status" >&2
       exit 2 ;;
esac
