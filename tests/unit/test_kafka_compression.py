"""How Kafka producers compress their batches: CHRONOLOG_KAFKA_COMPRESSION."""

from __future__ import annotations

import pytest
from aiokafka.codec import has_lz4, has_zstd

from chronolog.log.kafka_config import COMPRESSIONS
from chronolog.settings import ConfigError, parse_log_url


def test_zstd_is_the_default_and_its_codec_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHRONOLOG_KAFKA_COMPRESSION", raising=False)
    assert parse_log_url("kafka://127.0.0.1:9092").compression == "zstd"
    assert has_zstd() and has_lz4()  # cramjam: every codec offered can be used


@pytest.mark.parametrize("value", COMPRESSIONS)
def test_each_compression_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str,
) -> None:
    monkeypatch.setenv("CHRONOLOG_KAFKA_COMPRESSION", value.upper())
    assert parse_log_url("kafka://127.0.0.1:9092").compression == value


def test_an_unknown_compression_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHRONOLOG_KAFKA_COMPRESSION", "snappy")
    with pytest.raises(ConfigError, match="invalid CHRONOLOG_KAFKA_COMPRESSION 'snappy': "
                                          "expected one of none, gzip, lz4, zstd"):
        parse_log_url("kafka://127.0.0.1:9092")
