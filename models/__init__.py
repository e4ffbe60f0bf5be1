"""Keras model builders: networks only, nothing of MQTT or HTTP; imports nothing of livefit.

``builders`` builds a network (``build_model``, ``weight_names``) and imports Keras; ``names``
(the built-in builders and the names Keras resolves) loads without TensorFlow, so that
``livefit.server.config`` can check a config before TensorFlow is up.
"""
