"""Which `Broker` (broker/base.py) a broker URL names, by its scheme."""

from __future__ import annotations

from urllib.parse import urlsplit

from worker import settings
from worker.cluster.broker.amqp import SCHEMES as AMQP_SCHEMES
from worker.cluster.broker.amqp import AmqpBroker
from worker.cluster.broker.base import Broker
from worker.cluster.broker.redis import RedisBroker


def for_settings(s: settings.Settings) -> Broker:
    """The broker of `s.broker_url`: amqp:// (RabbitMQ) or, for every other scheme, Redis."""
    return AmqpBroker(s) if urlsplit(s.broker_url).scheme in AMQP_SCHEMES else RedisBroker(s)
