"""The Kafka section: broker connection, topic names, timeouts and client security."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from sidecar.settings._fields import _ENV_ONLY, _not_blank, _Section


class KafkaSettings(_Section):
    """Broker connection and topic names."""

    brokers: str = Field("kafka://127.0.0.1:9092", description="faust broker URL(s), ';'-separated")
    app_id: str = Field("ood-sidecar", description="faust app id = consumer group")
    queries_topic: str = Field("rag.queries", description="topic the worker consumes queries from")
    verdicts_topic: str = Field(
        "rag.verdicts", description="topic every verdict is written to, keyed by the query id"
    )
    route_topics: bool = Field(False, description="also write each verdict to the ID or OOD topic")
    id_topic: str = Field(
        "rag.queries.id",
        description="with route_topics: the topic in-domain verdicts are also written to",
    )
    ood_topic: str = Field(
        "rag.queries.ood",
        description="with route_topics: the topic out-of-domain verdicts are also written to",
    )
    dlq_topic: str = Field(
        "rag.queries.dlq",
        description="dead-letter topic: records that could not be scored, with a reason code",
    )
    audit_topic: str = Field(
        "rag.explain.requests",
        description="explanation requests, consumed when explain.enabled is true",
    )
    explanations_topic: str = Field(
        "rag.explain.results", description="explanation results, keyed by request_id"
    )
    partitions: int = Field(4, ge=1, description="partitions of the topics the sidecar creates")
    replication_factor: int = Field(
        1, ge=1, description="replication factor of the topics the sidecar creates"
    )
    session_timeout_s: float = Field(
        10.0,
        gt=0,
        description="consumer-group session timeout; a dead replica's partitions move "
        "after this long",
    )
    fetch_max_wait_ms: int = Field(
        100,
        ge=1,
        le=60_000,
        description="consumer long-poll wait; a broker that answers only when it expires "
        "(the embedded one) adds up to this much latency",
    )
    produce_timeout_s: float = Field(
        30.0,
        gt=0,
        description="how long the producer keeps retrying a verdict or dead letter; past "
        "it the worker halts and exits non-zero, and the batch is delivered again after "
        "the restart",
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "PLAIN", description="SASL mechanism with a SASL_* protocol"
    )
    sasl_username: str | None = Field(
        None, description="SASL user name (the password is the secret kafka__sasl_password)"
    )
    sasl_password: SecretStr | None = Field(
        None, description="SASL password; give it as the secret file kafka__sasl_password"
    )
    ssl_ca_file: str | None = Field(
        None, description="PEM bundle of the CA(s) that signed the brokers' certificates"
    )
    ssl_cert_file: str | None = Field(None, description="client certificate (PEM) for mutual TLS")
    ssl_key_file: str | None = Field(
        None, description="its private key (PEM, unencrypted; omit when the cert file holds it)"
    )

    @field_validator("sasl_password")
    @classmethod
    def _password_not_blank(cls, v: SecretStr | None) -> SecretStr | None:
        return _not_blank(v, "kafka.sasl_password", "unset it without SASL")

    @field_validator("brokers")
    @classmethod
    def _brokers_without_credentials(cls, v: str) -> str:
        # aiokafka reads no credentials from a URL: it would dial "user:pw@host" and put
        # the password in every connection error. The value is never echoed.
        parts = [p.strip() for p in v.replace(",", ";").split(";") if p.strip()]
        if not parts:
            raise ValueError("kafka.brokers is empty: give kafka://HOST:PORT[;kafka://...]")
        if any("@" in p for p in parts):
            raise ValueError(
                "kafka.brokers must not carry credentials (user:password@): give them as "
                "kafka.sasl_username and the secret kafka__sasl_password"
            )
        return v

    @model_validator(mode="after")
    def _sasl_has_credentials(self) -> KafkaSettings:
        # aiokafka would fail deep inside the worker's start with a traceback instead.
        if _ENV_ONLY.get() or not self.security_protocol.startswith("SASL"):
            return self
        missing = [
            f"kafka.{name}"
            for name in ("sasl_username", "sasl_password")
            if getattr(self, name) is None
        ]
        if missing:
            raise ValueError(
                f"kafka.security_protocol {self.security_protocol} needs "
                + " and ".join(missing)
                + " (the password may be the secret file kafka__sasl_password)"
            )
        return self

    @model_validator(mode="after")
    def _tls_files_need_tls(self) -> KafkaSettings:
        # Ignored without TLS: an operator who set a CA or a client certificate but not the
        # protocol would talk to the brokers in plain text and believe otherwise.
        given = [f"kafka.{n}" for n in ("ssl_ca_file", "ssl_cert_file", "ssl_key_file")
                 if getattr(self, n)]  # fmt: skip
        if given and not _ENV_ONLY.get() and not self.security_protocol.endswith("SSL"):
            raise ValueError(
                f"{' and '.join(given)} set, but kafka.security_protocol is "
                f"{self.security_protocol}: use SSL or SASL_SSL, or unset them"
            )
        return self
