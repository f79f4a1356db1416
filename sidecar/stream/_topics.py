"""Create the sidecar's topics with explicit partition counts before anything uses them.

Brokers that auto-create topics pick their own partition count (the embedded one: 4), and
faust only declares its internal topics, so the worker, the demo and the tests call
:func:`ensure_topics` first.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from sidecar.errors import BrokerError, ConfigError
from sidecar.settings import Settings

log = logging.getLogger(__name__)


# faust topic options for the sidecar's topics: keys and values pass as bytes, untouched
# (records are parsed, and dead-lettered when they do not parse, by the sidecar itself).
RAW_BYTES: dict[str, object] = {
    "key_type": bytes,
    "value_type": bytes,
    "key_serializer": "raw",
    "value_serializer": "raw",
}


def bootstrap_servers(brokers: str) -> list[str]:
    """``kafka://h1:9092;kafka://h2:9092`` -> ``["h1:9092", "h2:9092"]`` (aiokafka form)."""
    out = []
    for part in brokers.replace(",", ";").split(";"):
        part = part.strip()
        if not part:
            continue
        out.append(part.split("://", 1)[1] if "://" in part else part)
    return out


def sidecar_topics(settings: Settings) -> list[str]:
    """Every topic the scoring path reads or writes (and the explain topics when enabled)."""
    k = settings.kafka
    names = [k.queries_topic, k.verdicts_topic, k.dlq_topic]
    if k.route_topics:
        names += [k.id_topic, k.ood_topic]
    if settings.explain.enabled:
        names += [k.audit_topic, k.explanations_topic]
    return list(dict.fromkeys(names))


def _no_passphrase() -> str:
    raise ConfigError("the Kafka TLS key is encrypted; give it unencrypted (a Secret file)")


def ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context of every Kafka client (None unless the protocol uses SSL).

    Trusts the system CAs, or only ``kafka.ssl_ca_file`` when it is set (a private CA);
    ``kafka.ssl_cert_file`` and ``kafka.ssl_key_file`` present a client certificate
    (mutual TLS).

    Raises
    ------
    ConfigError
        A file is missing or is not what it should be (named, never printed).
    """
    k = settings.kafka
    if not k.security_protocol.endswith("SSL"):
        return None
    if k.ssl_key_file is not None and k.ssl_cert_file is None:
        raise ConfigError("kafka.ssl_key_file needs kafka.ssl_cert_file (its certificate)")
    try:
        ctx = ssl.create_default_context(cafile=k.ssl_ca_file)
        if k.ssl_cert_file is not None:
            # No key file: the certificate file holds the key too. An encrypted key would
            # make OpenSSL ask for a passphrase on the terminal; refuse it instead.
            ctx.load_cert_chain(k.ssl_cert_file, k.ssl_key_file, password=_no_passphrase)
    except (OSError, ssl.SSLError) as exc:
        files = [f for f in (k.ssl_ca_file, k.ssl_cert_file, k.ssl_key_file) if f]
        raise ConfigError(
            f"cannot load the Kafka TLS files {files}: {type(exc).__name__}"
        ) from None
    return ctx


class _HiddenSaslPayloads(logging.Filter):
    """aiokafka logs every request it sends at DEBUG, the SASL login's included: for PLAIN
    its payload is ``user\\0user\\0password``, for SCRAM a proof an attacker could try
    passwords against. Such a request is logged with its payload's size instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(map(_is_sasl_request, record.args)):
            record.args = tuple(_hidden(a) if _is_sasl_request(a) else a for a in record.args)
        return True


def _is_sasl_request(arg: object) -> bool:
    return type(arg).__name__.startswith("SaslAuthenticateRequest") and hasattr(
        arg, "sasl_auth_bytes"
    )


def _hidden(request: Any) -> str:
    size = len(request.sasl_auth_bytes or b"")
    return f"{type(request).__name__}(sasl_auth_bytes=<{size} bytes, not logged>)"


def hide_sasl_payloads() -> None:
    """Keep the SASL login's payload out of aiokafka's DEBUG log (idempotent); called
    wherever a Kafka client is given SASL credentials."""
    logger = logging.getLogger("aiokafka.conn")
    if not any(isinstance(f, _HiddenSaslPayloads) for f in logger.filters):
        logger.addFilter(_HiddenSaslPayloads())


def client_kwargs(settings: Settings) -> dict[str, object]:
    """Connection options for aiokafka clients built from ``settings.kafka``."""
    k = settings.kafka
    kw: dict[str, object] = {"bootstrap_servers": bootstrap_servers(k.brokers)}
    if k.security_protocol != "PLAINTEXT":
        kw["security_protocol"] = k.security_protocol
        if k.security_protocol.endswith("SSL"):
            kw["ssl_context"] = ssl_context(settings)
        if k.security_protocol.startswith("SASL"):
            hide_sasl_payloads()
            kw["sasl_mechanism"] = k.sasl_mechanism
            kw["sasl_plain_username"] = k.sasl_username
            kw["sasl_plain_password"] = (
                k.sasl_password.get_secret_value() if k.sasl_password else None
            )
    return kw


class _HeldRecords(logging.Filter):
    """Holds back the records of one logger, to be dropped or passed on afterwards."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return False


@contextlib.contextmanager
def held_client_logs(name: str = "aiokafka") -> Iterator[_HeldRecords]:
    """Hold back what the Kafka client logs itself while the block runs.

    aiokafka logs an ERROR line per broker it cannot reach before it raises; at start-up
    the caller's one-line error says the same, so the held lines are passed on only when
    the block succeeds (a second broker answered after the first refused), and on failure
    their messages are the caller's to quote.
    """
    logger = logging.getLogger(name)
    held = _HeldRecords()
    logger.addFilter(held)
    failed = False
    try:
        yield held
    except BaseException:
        failed = True
        raise
    finally:
        logger.removeFilter(held)
        if not failed:
            for record in held.records:
                logger.handle(record)


def _with_reasons(exc: BaseException, held: _HeldRecords) -> str:
    """``exc`` followed by the distinct messages the client logged on the way."""
    reasons = list(dict.fromkeys(r.getMessage() for r in held.records))
    text = str(exc) or type(exc).__name__
    return text + (f" ({'; '.join(reasons)})" if reasons else "")


def _sasl_refusal(exc: BaseException, held: _HeldRecords) -> str | None:
    """The broker's refusal of the SASL login behind a failed start, or None.

    aiokafka logs it (an ERROR per broker, held back here) and raises a bare "Unable to
    bootstrap"; the refusal is in the logged record's arguments.
    """
    from aiokafka.errors import SaslAuthenticationFailed, UnsupportedSaslMechanismError

    found = [exc] + [a for r in held.records if isinstance(r.args, tuple) for a in r.args]
    for candidate in found:
        if isinstance(candidate, SaslAuthenticationFailed | UnsupportedSaslMechanismError):
            return str(candidate)
    return None


def _sasl_failed(settings: Settings, why: str) -> BrokerError:
    k = settings.kafka
    refused = BrokerError(
        f"SASL {k.sasl_mechanism} authentication of user {k.sasl_username!r} with the broker "
        f"at {k.brokers} failed: the broker refused the credentials (kafka.sasl_username, "
        f"the secret kafka__sasl_password) or answered outside the protocol ({why})"
    )
    refused.retryable = False  # the same credentials fail the same way
    return refused


def refused_topics(response: Any) -> dict[str, str]:
    """Topic -> reason for every topic a CreateTopics response did not create.

    An existing topic counts as created (another replica, or an earlier run, was first).
    """
    from aiokafka.errors import TopicAlreadyExistsError, for_code

    refused: dict[str, str] = {}
    for entry in getattr(response, "topic_errors", None) or []:
        topic, code = entry[0], int(entry[1])
        if code in (0, TopicAlreadyExistsError.errno):
            continue
        message = entry[2] if len(entry) > 2 and entry[2] else None
        refused[str(topic)] = message or for_code(code).__name__
    return refused


@contextlib.asynccontextmanager
async def _admin(settings: Settings) -> AsyncIterator[Any]:
    """A started admin client for ``settings.kafka``, closed on exit.

    Raises
    ------
    BrokerError
        No broker answered; the message names each broker's reason, in one line.
    """
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    admin = AIOKafkaAdminClient(**client_kwargs(settings))
    try:
        with held_client_logs() as held:
            try:
                await admin.start()
            except (KafkaError, OSError) as exc:
                refusal = _sasl_refusal(exc, held)
                if refusal is not None and settings.kafka.security_protocol.startswith("SASL"):
                    raise _sasl_failed(settings, refusal) from None
                why = _with_reasons(exc, held)
                raise BrokerError(
                    f"cannot reach the broker at {settings.kafka.brokers}: {why}"
                ) from exc
            except (KeyError, ValueError) as exc:
                if not settings.kafka.security_protocol.startswith("SASL"):
                    raise
                # aiokafka's SCRAM client fails this way when the broker refuses the
                # credentials (a final message with an error and no signature, KeyError
                # 'v') or cannot prove it knows them ("Server sent wrong signature!").
                raise _sasl_failed(settings, f"{type(exc).__name__}: {exc}") from None
        yield admin
    finally:
        await admin.close()


async def reach_brokers(settings: Settings) -> None:
    """Connect to the brokers once and close again (what ``ensure_topics`` does first).

    Raises
    ------
    BrokerError
        No broker answered (retrying may help).
    """
    async with _admin(settings):
        pass


async def ensure_topics(settings: Settings, names: Iterable[str] | None = None) -> list[str]:
    """Create missing topics with ``kafka.partitions`` partitions; returns those created.

    Raises
    ------
    BrokerError
        The broker could not be reached or refused to create a topic.
    """
    from aiokafka.admin import NewTopic
    from aiokafka.errors import KafkaError, TopicAlreadyExistsError

    k = settings.kafka
    wanted = list(names) if names is not None else sidecar_topics(settings)
    async with _admin(settings) as admin:
        try:
            existing = set(await admin.list_topics())
            missing = [n for n in wanted if n not in existing]
            if missing:
                with contextlib.suppress(TopicAlreadyExistsError):  # another replica was first
                    response = await admin.create_topics(
                        [NewTopic(n, k.partitions, k.replication_factor) for n in missing]
                    )
                    # The admin client does not raise for a refused topic: the refusal is a
                    # per-topic error code in the response (policy, replication factor, ACL).
                    refused = refused_topics(response)
                    if refused:
                        raise BrokerError(
                            f"the broker at {k.brokers} refused to create "
                            + "; ".join(f"{n!r} ({why})" for n, why in sorted(refused.items()))
                        )
                log.info("created topics %s with %s partitions", missing, k.partitions)
            return missing
        except KafkaError as exc:
            raise BrokerError(f"cannot create topics on {k.brokers}: {exc}") from exc
        except OSError as exc:
            raise BrokerError(f"lost the broker at {k.brokers}: {exc}") from exc
