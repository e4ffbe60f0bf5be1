"""What the learner's and a replica's runtimes have in common: a start that stops what did start
when a part fails, and the one serving half both put in front of their weights."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..config.model import ModelSettings
from ..serve.endpoint import ModelEndpoint
from ..serve.serving import ServingModel
from ..serve.versions import CheckpointShelf, KeptVersions
from ..storage.serving_record_file import ServingRecordFile
from ..train.modeling import build_uncompiled
from ..wire.snapshot import Snapshot, SnapshotSlot


def start_all_or_none(start: Callable[[], None], stop: Callable[[], None]) -> None:
    """Run ``start``; when it raises, run ``stop`` (which must work on partly started parts) and
    raise what ``start`` raised."""
    try:
        start()
    except BaseException:
        stop()
        raise


def checkpoint_directory(storage: Path, name: str) -> Path:
    """Where a learner with storage dir ``storage`` keeps model ``name``'s checkpoints."""
    return storage / "checkpoints" / name


def build_endpoint(
    name: str, settings: ModelSettings, device: str, slot: SnapshotSlot,
    on_swap: Callable[[Snapshot], None], checkpoints: Path | None = None,
) -> ModelEndpoint:  # fmt: skip
    """Model ``name``'s endpoint, served from the newest snapshot in ``slot``: its own copy of
    the network, warmed up at every batch size; ``on_swap`` hears each version it swaps in.
    It keeps the snapshots ``slot`` gets as past versions, and the checkpoints in
    ``checkpoints`` (the learner's directory of this model) when ``versions.checkpoints``."""
    serving = ServingModel(
        name,
        build_uncompiled(settings, device),
        settings.input_shape,
        settings.serve.batch_sizes(),
        source=lambda: slot.latest,
        device=device,
        on_swap=on_swap,
        runtime=settings.serve.runtime,
    )
    serving.warm_up()
    use_shelf = checkpoints is not None and settings.versions.checkpoints
    shelf = CheckpointShelf(checkpoints) if use_shelf and checkpoints is not None else None
    versions = KeptVersions(name, settings.versions, serving.source, shelf)
    if checkpoints is not None:  # the versions labels and the pin name, beside the checkpoints
        versions.held_source = ServingRecordFile(checkpoints).load_held
    slot.subscribe(versions.add)  # before the endpoint's swap: a version is kept once it came
    if slot.latest is not None:
        versions.add(slot.latest)
    return ModelEndpoint(name, settings, serving, versions)
