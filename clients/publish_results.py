"""What a ``SamplePublisher`` reports: the errors it raises and the ``PublishStats`` of a
stream."""

from __future__ import annotations

from dataclasses import dataclass


class BrokerConnectionError(ConnectionError):
    """The broker could not be reached, or refused the connection; the message says which."""


class ProtocolUnsupported(BrokerConnectionError):
    """The broker refused the MQTT version (amqtt refuses MQTT 5)."""


class PublishError(RuntimeError):
    """A message could not be handed to the broker."""


class PublishTimeout(PublishError, TimeoutError):
    """Messages stayed unacknowledged: no PUBACK arrived for the publisher's ack timeout."""


@dataclass(frozen=True, slots=True)
class PublishStats:
    """What one publish_stream call sent; ``seconds`` runs until the last acknowledgement."""

    samples: int
    messages: int
    seconds: float
    rejected: int = 0  # PUBACKs with a failure reason code (MQTT 5), e.g. not authorized
    dropped: int = 0  # QoS 0 messages lost to a disconnection

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        line = (
            f"published {self.samples} samples in {self.messages} messages in "
            f"{self.seconds:.2f} s ({self.samples_per_s:,.0f} samples/s)"
        )
        if self.rejected or self.dropped:
            line += f"; {self.rejected} rejected by the broker, {self.dropped} dropped"
        return line
