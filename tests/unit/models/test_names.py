"""The names config validation checks without importing Keras (``models.names``): each table is
what Keras and the builders resolve."""

from __future__ import annotations

import keras
import pytest

from livefit.models.names import BUILTIN_BUILDERS


def test_config_name_lists_are_what_keras_resolves() -> None:
    """livefit.models.names mirrors Keras' own tables (so config checks cannot drift from
    what modeling.py and the builders resolve); every listed name resolves the way livefit
    calls Keras. Left out: the base and wrapper classes, which do not train on their own."""
    from keras.src import activations, losses, optimizers

    from livefit.models import names
    from livefit.server.config.model import ModelSettings
    from livefit.server.train.modeling import make_loss, make_optimizer

    assert set(losses.ALL_OBJECTS_DICT) == names.LOSSES | names.LOSS_BASES
    assert set(optimizers.ALL_OBJECTS_DICT) == names.OPTIMIZERS | names.OPTIMIZER_BASES
    assert set(activations.ALL_OBJECTS_DICT) == names.ACTIVATIONS
    for loss in sorted(names.LOSSES):  # two outputs: categorical losses need one per class
        settings = ModelSettings(input_shape=[2], output_shape=[2], loss=loss)
        assert callable(make_loss(settings)), loss
    for optimizer in sorted(names.OPTIMIZERS | {"Adam", "SGD", "NAdam"}):
        settings = ModelSettings(input_shape=[2], output_shape=[1], optimizer=optimizer)
        assert isinstance(make_optimizer(settings), keras.optimizers.Optimizer), optimizer
    for activation in sorted(names.ACTIVATIONS):
        assert callable(keras.activations.get(activation)), activation
    for wrong in ("mse_typo", "Mse"):
        with pytest.raises(ValueError):
            keras.losses.get(wrong)


def test_builder_options_table_is_the_builders() -> None:
    from livefit.models import builders, names

    assert builders._DEFAULT_OPTIONS is names.BUILDER_OPTIONS
    assert set(names.BUILDER_OPTIONS) == set(BUILTIN_BUILDERS)
    for builder, options in names.BUILDER_OPTIONS.items():
        names.check_builder_options(builder, options)  # the defaults pass their own check
