"""How a split learner's training process sizes itself (``runtime.training_process``)."""

from __future__ import annotations

from pathlib import Path


def test_the_training_process_takes_one_inter_op_thread_unless_told(tmp_path: Path) -> None:
    """A split learner's training process that trains one model on the CPU serves nothing: its
    inter-op pool is one thread (the pipelined trainer measured faster so), its intra-op pool
    its cores; a configured size stays; with two models (whose steps would share the thread)
    or a GPU named, TensorFlow's default stays."""
    from livefit.server.config.settings import Settings
    from livefit.server.runtime.learner_group import TrainingSlot
    from livefit.server.runtime.training_process import (
        TRAINING_INTER_OP_THREADS,
        cpus_for_training,
        size_training_pools,
    )

    models = {"m": {"input_shape": [2], "output_shape": [1]}}
    slot = TrainingSlot(tmp_path, workers=1)
    settings = Settings.model_validate({"models": models})
    size_training_pools(settings, slot)
    assert settings.tensorflow.inter_op_threads == TRAINING_INTER_OP_THREADS == 1
    cpus = cpus_for_training(settings, slot)
    assert settings.tensorflow.intra_op_threads == (0 if cpus is None else len(cpus))
    told = Settings.model_validate(
        {"models": models, "tensorflow": {"inter_op_threads": 3, "intra_op_threads": 5}}
    )
    size_training_pools(told, slot)
    assert (told.tensorflow.inter_op_threads, told.tensorflow.intra_op_threads) == (3, 5)
    two = Settings.model_validate({"models": {**models, "n": models["m"]}})
    size_training_pools(two, slot)
    assert two.tensorflow.inter_op_threads == 0
    gpu = Settings.model_validate({"models": {"m": {**models["m"], "device": "/GPU:0"}}})
    size_training_pools(gpu, slot)
    assert gpu.tensorflow.inter_op_threads == 0


def test_the_lock_taken_before_tensorflow_is_the_one_the_storage_watch_checks(
    tmp_path: Path,
) -> None:
    """``TrainingSlot.lock_storage`` locks the storage before TensorFlow is imported; the
    runtime keeps that lock, and its storage watch checks it: a deleted storage dir is seen
    (a watch left with a lock never taken would say nothing)."""
    import shutil

    from livefit.server.config.settings import Settings
    from livefit.server.runtime.learner_group import TrainingSlot
    from livefit.server.runtime.training_process import TrainingRuntime

    storage = tmp_path / "data"
    settings = Settings.model_validate(
        {
            "storage": {"dir": str(storage)},
            "models": {"m": {"input_shape": [2], "output_shape": [1]}},
        }
    )
    slot = TrainingSlot(tmp_path / "group", workers=1)
    slot.directory.mkdir()
    lock = slot.lock_storage(settings)
    assert slot.locked_marker().exists()
    runtime = TrainingRuntime(settings, slot, storage_lock=lock)
    try:
        runtime.preflight()  # already held: nothing more
        assert runtime.storage_lock is lock and runtime.storage_watch.lock is lock
        shutil.rmtree(storage)
        assert runtime.storage_watch.lock.lost() is not None
    finally:
        lock.release()
