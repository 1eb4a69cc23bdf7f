"""Worker pools: the offer proof, the tenants file's pools, and dispatch's pool filter."""

from __future__ import annotations

from pathlib import Path

import pytest

from chronolog.domain.offers import PROOF_WINDOW_S, Offer, offer_proof, verify_proof
from chronolog.log.port import Topics
from chronolog.processors.dispatch import Dispatcher
from chronolog.settings import ConfigError
from chronolog.tenants import load_tenants

CRED_A = "pool-a-credential-0123"
CRED_B = "pool-b-credential-4567"
T0 = 1_800_000_000.0


def pool_offer(credential: str, pool: str = "a", partition: int = 2, issued: float = T0,
               worker: str = "w1", cls: str = "default", window: int = 4) -> Offer:
    proof = offer_proof(credential, worker, pool, partition, cls, issued)
    return Offer(worker, cls, window, None, pool, issued, proof)


# ------------------------------------------------------------------------------ the proof


def test_a_proof_keyed_by_a_pool_credential_verifies_and_survives_the_record() -> None:
    offer = Offer.decode(pool_offer(CRED_A).encode())
    assert offer.pool == "a"
    assert verify_proof(offer, 2, [CRED_A], now=T0 + 1) is None
    assert verify_proof(offer, 2, ["an-old-credential-xyz", CRED_A], now=T0) is None  # rotation


def test_a_proof_with_a_wrong_credential_does_not_verify() -> None:
    assert verify_proof(pool_offer("guessed-credential-000"), 2, [CRED_A], now=T0) \
        == "proof does not verify"


def test_a_stale_or_future_proof_is_refused() -> None:
    offer = pool_offer(CRED_A)
    assert verify_proof(offer, 2, [CRED_A], now=T0 + PROOF_WINDOW_S + 1) == "stale proof"
    assert verify_proof(offer, 2, [CRED_A], now=T0 - PROOF_WINDOW_S - 1) == "stale proof"


def test_another_pools_proof_or_a_copy_to_another_partition_or_pool_does_not_verify() -> None:
    b_offer = pool_offer(CRED_B, pool="b")
    assert verify_proof(b_offer, 2, [CRED_A], now=T0) is not None  # b's credential, a's check
    relabelled = Offer("w1", "default", 4, None, "a", T0, b_offer.proof)
    assert verify_proof(relabelled, 2, [CRED_A], now=T0) == "proof does not verify"
    assert verify_proof(pool_offer(CRED_A), 3, [CRED_A], now=T0) == "proof does not verify"
    assert verify_proof(pool_offer(CRED_A), 2, [], now=T0) == "proof does not verify"  # unknown
    bare = Offer("w1", "default", 4, None, "a")
    assert verify_proof(bare, 2, [CRED_A], now=T0) == "no proof"


# ------------------------------------------------------------------------- the tenants file


def write(tmp: Path, text: str) -> Path:
    p = tmp / "tenants.toml"
    p.write_text(text)
    return p


def test_the_tenants_file_binds_tenants_to_pools(tmp_path: Path) -> None:
    tenants = load_tenants(write(tmp_path, f"""
[pools.a]
credentials = ["{CRED_A}", "next-credential-a-99"]
[pools.b-2]
credentials = ["{CRED_B}"]
[tenants.acme]
tokens = ["t1"]
pools = ["a", "b-2"]
[tenants.free]
tokens = ["t2"]
"""))
    assert tenants.seat_pools("acme") == frozenset({"a", "b-2"})
    assert tenants.seat_pools("free") == frozenset({None})  # pool-less workers only
    assert tenants.credentials("a") == (CRED_A, "next-credential-a-99")
    assert tenants.credentials("nope") == ()


@pytest.mark.parametrize(("text", "key"), [
    ('[tenants.acme]\npools = ["gpu"]\n', "tenants.acme.pools: unknown pool 'gpu'"),
    ('[pools.a]\ncredentials = ["x"]\n[tenants.acme]\npools = "a"\n', "pools.a.credentials"),
    (f'[pools.a]\ncredentials = ["{CRED_A}"]\n[tenants.acme]\npools = "a"\n',
     "tenants.acme.pools"),
    (f'[pools.Big_Pool]\ncredentials = ["{CRED_A}"]\n[tenants.acme]\n', "pools.Big_Pool"),
    ('[pools.a]\n[tenants.acme]\n', "pools.a.credentials"),
    (f'[pools.a]\ncredentials = ["{CRED_A}"]\nsecret = 1\n[tenants.acme]\n', "pools.a"),
])
def test_a_bad_pool_is_a_config_error_naming_the_file_and_key(
    tmp_path: Path, text: str, key: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_tenants(path)
    assert str(path) in str(err.value) and key in str(err.value)


# -------------------------------------------------------------------- dispatch's pool filter


def test_runs_of_a_pool_bound_tenant_are_seated_only_in_its_pools() -> None:
    d = Dispatcher()
    d.offer(Offer("plain", "default", 256), now=0.0)
    d.offer(pool_offer(CRED_B, pool="b", worker="other", window=128), now=0.0)
    assert d.seat_for("default", "echo", 0.0, frozenset({"a"})) is None  # no seat of pool a
    d.offer(pool_offer(CRED_A, worker="legit", window=2), now=0.0)
    seat = d.seat_for("default", "echo", 0.0, frozenset({"a"}))
    assert seat is not None and seat.worker_id == "legit" and seat.pool == "a"
    # a pool-less tenant's runs go to the pool-less seat, never to a pool's
    plain = d.seat_for("default", "echo", 0.0, frozenset({None}))
    assert plain is not None and plain.worker_id == "plain"
    d.offer(Offer("plain", "default", 0), now=0.0)  # withdrawn
    assert d.seat_for("default", "echo", 0.0, frozenset({None})) is None


def test_a_live_pool_seat_keeps_its_pool_against_an_offer_under_its_name() -> None:
    d = Dispatcher()
    d.offer(pool_offer(CRED_A, worker="legit"), now=0.0)
    d.offer(Offer("legit", "default", 256), now=1.0)  # pool-less, the same worker ID
    seat = d.seats["default"]["legit"]
    assert (seat.pool, seat.window) == ("a", 4)
    d.offer(Offer("legit", "default", 0), now=1.0)  # nor can it withdraw the seat
    assert d.seat_for("default", "echo", 1.0, frozenset({"a"})) is seat


def test_pool_assignments_go_to_the_pools_ready_topic() -> None:
    t = Topics(prefix="x.")
    assert t.ready_for("gpu", None) == "x.ready.gpu"
    assert t.ready_for("gpu", "a") == "x.ready.pool-a.gpu"
    assert t.follows_processors("x.ready.pool-a.gpu")  # grown with the other ready topics


def test_a_resource_class_named_like_a_pools_topic_is_refused() -> None:
    from pydantic import ValidationError

    from chronolog.domain import messages as m

    spec = {"every": "1s", "job": {"type": "echo"}}
    assert m.ScheduleSpec.model_validate({**spec, "resource_class": "gpu"}).resource_class == "gpu"
    with pytest.raises(ValidationError, match="resource_class"):
        m.ScheduleSpec.model_validate({**spec, "resource_class": "pool-a"})


# ---------------------------------------------------------------- the worker's credential


def test_a_pool_workers_credential_comes_from_the_environment_or_an_owner_only_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chronolog.cli.errors import UsageError
    from chronolog.cli.worker import CREDENTIAL_ENV, pool_credential

    monkeypatch.delenv(CREDENTIAL_ENV, raising=False)
    assert pool_credential(None, None) is None
    with pytest.raises(UsageError, match="--pool: no credential"):
        pool_credential("a", None)
    monkeypatch.setenv(CREDENTIAL_ENV, CRED_A)
    assert pool_credential("a", None) == CRED_A
    with pytest.raises(UsageError, match="--pool: 'Bad_Pool'"):
        pool_credential("Bad_Pool", None)
    f = tmp_path / "cred"
    f.write_text(CRED_B + "\n")
    f.chmod(0o600)
    assert pool_credential("a", str(f)) == CRED_B
    f.chmod(0o644)
    with pytest.raises(UsageError, match=r"--credential-file: .*\(mode 0644; use 0600\)"):
        pool_credential("a", str(f))
    with pytest.raises(UsageError, match="--credential-file: only with --pool"):
        pool_credential(None, str(f))


def test_a_pool_workers_consumer_group_is_named_under_its_pool() -> None:
    from chronolog.workers.runtime import worker_group

    assert worker_group("x.", ["echo"], "a").startswith("x.workers.pool-a.")
    assert worker_group("x.", ["echo"]) == "x.workers." + worker_group("x.", ["echo"], "a")[17:]


@pytest.mark.parametrize(("argv", "line"), [
    (["--classes", "default,pool-a"], "--classes: a resource class may not start with 'pool-'"),
    (["--pool", "a"], "--pool: no credential"),
    (["--credential-file", "/nonexistent"], "--credential-file: only with --pool"),
])
def test_the_worker_cli_refuses_a_pool_class_or_a_pool_without_its_credential(
    argv: list[str], line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from chronolog.cli.main import main
    from chronolog.cli.worker import CREDENTIAL_ENV

    monkeypatch.delenv(CREDENTIAL_ENV, raising=False)
    rc = main(["worker", "--builtin-jobs", "--data-dir", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and line in err, err
